"""ASHA as a state machine (dvml.search.asha) and its journal (dvml.search.journal): promotion as
soon as a model is in the top 1/eta of its rung, parked models promoted later, new
configurations on idle workers, NaN and failed configurations ranked last, budgets, a slow
worker, and resume by replaying the journal. Pure: events in, decisions out."""

from __future__ import annotations

import json
import math

import pytest

from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError
from dvml.search import journal as j
from dvml.search.asha import Asha, rungs
from dvml.search.automl_params import AshaParams

COMPILE = {"loss": ["mse"], "optimizer_params_list": [{"optimizer": ["SGD"],
           "lr": [0.0001, 0.1, "log"]}]}  # fmt: skip
FIT = {"batch_size": [8, 16, 32]}


def asha(**params: object) -> Asha:
    defaults: dict[str, object] = {"max_t": 9, "eta": 3, "grace_period": 1, "max_configs": 20}
    return Asha(SearchSpace([1], COMPILE, FIT), AshaParams(**{**defaults, **params}), seed=0)  # type: ignore[arg-type]


def kind(decision: object) -> str:
    return type(decision).TYPE  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize(
    ("max_t", "eta", "grace", "levels"),
    [(81, 3, 1, [1, 3, 9, 27, 81]), (10, 3, 1, [1, 3, 9, 10]), (5, 2, 2, [2, 4, 5]),
     (4, 3, 4, [4]), (100, 4, 3, [3, 12, 48, 100])],
)  # fmt: skip
def test_rungs(max_t: int, eta: int, grace: int, levels: list[int]) -> None:
    assert rungs(max_t, eta, grace) == levels


def test_promotes_as_soon_as_a_model_is_in_the_top_third_and_parked_ones_later() -> None:
    a = asha()
    assert a.levels == [1, 3, 9]
    # three idle workers get three new configurations, one iteration each (rung 0)
    starts = [a.ask(w) for w in ("w0", "w1", "w2")]
    assert [(kind(d), d.trial_id, d.iterations) for d in starts] == [("start", 1, 1),
            ("start", 2, 1), ("start", 3, 1)]  # fmt: skip
    assert kind(a.report(1, 1, 0.5, worker="w0", checkpoint="c1")) == "park"
    # rung 0 holds 1 result: floor(1/3) = 0 promotable, so the idle worker gets a new one
    assert (kind(d := a.ask("w0")), d.trial_id) == ("start", 4)
    assert kind(a.report(2, 1, 0.3, checkpoint="c2")) == "park"
    assert kind(a.ask("w1")) == "start"  # 2 results: still none promotable
    assert kind(a.report(3, 1, 0.9, checkpoint="c3")) == "park"
    # 3 results: the best (trial 2) is in the top third: promoted at once, from its checkpoint
    d = a.ask("w2")
    assert d == j.Promote(2, "w2", 1, 2, "c2")
    # trial 1 (0.5) stays parked until three more results come, all worse than it
    for t in (4, 5):
        assert kind(a.report(t, 1, 0.8 + t / 100, checkpoint=f"c{t}")) == "park"
    assert kind(a.ask("w0")) == "start"  # 5 results: top 1 = trial 2, already promoted
    assert kind(a.report(6, 1, 0.95, checkpoint="c6")) == "park"
    assert a.ask("w1") == j.Promote(1, "w1", 1, 2, "c1")  # the parked model, promoted later
    # rung 1 → rung 2 = max_t: finishing
    assert kind(a.report(2, 3, 0.2, checkpoint="c2b")) == "park"
    assert kind(a.report(1, 3, 0.25, checkpoint="c1b")) == "park"
    assert a.best() == 2


def test_nan_and_failed_configurations_rank_last_and_the_search_goes_on() -> None:
    a = asha()
    for w in ("w0", "w1", "w2"):
        a.ask(w)
    assert a.report(1, 1, math.nan) == j.Fail(1, "its loss is not a finite number (NaN or inf)")
    assert a.apply(j.Failure(2, "the trainer ran out of memory")) == j.Fail(
        2, "the trainer ran out of memory"
    )
    assert kind(a.report(3, 1, 7.0)) == "park"
    # 3 results in rung 0: the one finite loss ranks first, however bad; failures never promote
    assert kind(d := a.ask("w0")) == "promote" and d.trial_id == 3
    assert a.trials[1].status == a.trials[2].status == "failed"
    assert a.best() == 3
    with pytest.raises(ArgumentError, match="trial 1, which is not running \\(it is failed\\)"):
        a.report(1, 1, 0.1)


def test_a_promoted_trial_that_fails_is_not_the_best_for_its_lower_rung_loss() -> None:
    a = asha()
    for w in ("w0", "w1", "w2"):
        a.ask(w)
    for t, loss in ((1, 0.2), (2, 0.5), (3, 0.9)):
        a.report(t, 1, loss)
    assert a.ask("w0") == j.Promote(1, "w0", 1, 2, None) and a.best() == 1
    a.apply(j.Failure(1, "the trainer was killed"))  # at rung 1: ranked last there
    assert a.best() == 2  # the best of rung 0 that did not fail


def test_max_configs_wait_and_stop() -> None:
    a = asha(max_configs=2, max_t=3)
    assert [kind(a.ask(w)) for w in ("w0", "w1", "w2")] == ["start", "start", "wait"]
    assert kind(a.report(1, 1, 0.4)) == "park"
    assert kind(a.ask("w0")) == "wait"  # trial 2 still runs: a promotion may come
    assert kind(a.report(2, 1, 0.6)) == "park"
    # 2 results, floor(2/3) = 0 promotable, nothing runs: over
    assert kind(a.ask("w0")) == "stop" and kind(a.ask("w1")) == "stop"


def test_top_rung_finishes_and_time_budget_stops() -> None:
    a = asha(max_t=3, time_budget_s=100.0)
    for t, w in enumerate(("w0", "w1", "w2"), start=1):
        a.ask(w, now=1.0)
        a.report(t, 1, float(t), worker=w, now=2.0)
    assert kind(d := a.ask("w0", now=3.0)) == "promote" and d.iterations == 2
    assert a.report(1, 3, 0.1, now=4.0) == j.Finish(1, 0.1)
    assert a.finished == [1]
    assert a.ask("w1", now=100.0) == j.Stop("time budget of 100 s spent")
    assert kind(a.ask("w1", now=5.0)) == "stop"  # stopped stays stopped


def test_wrong_reports_are_refused() -> None:
    a = asha()
    a.ask("w0")
    with pytest.raises(ArgumentError, match="trial 7, which is not running \\(it is unknown\\)"):
        a.report(7, 1, 0.1)
    with pytest.raises(ArgumentError, match="was to train to 1 iterations"):
        a.report(1, 3, 0.1)
    with pytest.raises(ArgumentError, match="ASHA takes Ask, Result, Failure, Resume or Departed"):
        a.apply("ask")


def test_a_slow_worker_gets_new_configurations_not_promotions() -> None:
    a = asha()
    for w in ("w0", "w1", "w2", "slow"):
        a.ask(w)
    for t, w, seconds in ((1, "w0", 1.0), (2, "w1", 1.0), (3, "w2", 1.0), (4, "slow", 2.5)):
        a.report(t, 1, t / 10, worker=w, elapsed_s=seconds)
    # trial 1 is promotable; the slow worker asks first but gets a new configuration
    assert kind(a.ask("slow")) == "start"
    assert kind(d := a.ask("w0")) == "promote" and d.trial_id == 1


def test_duplicate_configurations_are_not_started_twice() -> None:
    space = SearchSpace([1], {"loss": ["mse"]}, {"batch_size": [8, 16]})
    a = Asha(space, AshaParams(max_t=3, max_configs=10), seed=0)
    decisions = [a.ask(f"w{i}") for i in range(4)]
    assert [kind(d) for d in decisions] == ["start", "start", "wait", "wait"]
    assert {d.fit_params for d in decisions[:2]} == {"batch_size=8", "batch_size=16"}


def _drive(a: Asha, results: int) -> None:
    """Workers w0..w3 take jobs; jobs report first in, first out; losses from the trial id;
    a worker told to wait asks again after the next result."""
    running: list[j.Start | j.Promote] = []
    waiting = ["w0", "w1", "w2", "w3"]
    for n in range(results + 1):
        asking, waiting = waiting, []
        for w in asking:
            d = a.ask(w, now=float(n))
            if isinstance(d, j.Start | j.Promote):
                running.append(d)
            elif isinstance(d, j.Wait):
                waiting.append(w)
        if not running or n == results:
            return
        d = running.pop(0)
        target = a.levels[a.trials[d.trial_id].target]
        loss = math.nan if d.trial_id == 5 else (d.trial_id % 7) / 10 + 1 / target
        a.report(d.trial_id, target, loss, worker=d.worker, now=float(n), elapsed_s=1.0,
                 checkpoint=f"ckpt/{d.trial_id}/{target}")  # fmt: skip
        waiting.append(d.worker)


def test_journal_is_json_and_replays_to_the_same_state() -> None:
    a = asha(sampler="tpe", max_t=27)
    _drive(a, 40)
    text = a.journal.dumps()
    # standard JSON: the NaN of trial 5 is written as null, no NaN constant anywhere
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the journal"))
    assert data["format"] == "dvml-search-journal" and data["header"]["seed"] == 0
    assert any(r["event"].get("trial_id") == 5 and r["event"]["loss"] is None
               for r in data["records"] if r["event"]["type"] == "result")  # fmt: skip
    kinds = {r["decision"]["type"] for r in data["records"]}
    assert {"start", "promote", "park", "fail"} <= kinds
    again = j.replay(j.Journal.loads(text), asha(sampler="tpe", max_t=27))
    assert again.journal.dumps() == text
    assert {t: vars(s) for t, s in again.trials.items()} == {
        t: vars(s) for t, s in a.trials.items()
    }
    # both go on alike: the sampler's state came back too
    assert again.ask("w9", now=99.0) == a.ask("w9", now=99.0)


def test_replay_refuses_another_search() -> None:
    a = asha()
    _drive(a, 10)
    journal = j.Journal.loads(a.journal.dumps())
    with pytest.raises(ArgumentError, match="does not replay: record"):
        j.replay(journal, Asha(SearchSpace([1], COMPILE, FIT), AshaParams(max_t=9), seed=1))
    journal.records[3]["decision"]["trial_id"] = 99
    with pytest.raises(ArgumentError, match="does not replay"):
        j.replay(journal, asha())
    with pytest.raises(ArgumentError, match="not a dvml search journal"):
        j.Journal.loads('{"records": []}')
    with pytest.raises(ArgumentError, match="not JSON"):
        j.Journal.loads("{")
    with pytest.raises(ArgumentError, match="unknown type"):
        j.decode({"type": "teleport"})


def test_resume_gives_the_jobs_in_flight_out_again_from_their_checkpoints() -> None:
    a = asha()
    _drive(a, 12)
    in_flight = sorted(a.running)
    assert in_flight
    # the client dies: a new process replays the journal and resumes
    b = j.replay(j.Journal.loads(a.journal.dumps()), asha())
    queued = b.apply(j.Resume(now=20.0))
    assert queued == j.Queued(in_flight)
    again = [b.ask(f"n{i}", now=21.0) for i in range(len(in_flight))]
    assert sorted(d.trial_id for d in again) == in_flight
    assert all(d.retry for d in again)
    for d in again:
        trial = b.trials[d.trial_id]
        if isinstance(d, j.Promote):  # from the checkpoint of the rung it had reached
            assert d.checkpoint == trial.checkpoint and d.checkpoint.endswith(
                f"/{b.levels[trial.rung]}"
            )
            assert d.iterations == b.levels[trial.target] - b.levels[trial.rung]
        else:  # never reported: starts again, same configuration
            assert trial.rung == -1 and d.compile_params == trial.compile_params
    # and the resumed journal replays too, resume and all
    c = j.replay(j.Journal.loads(b.journal.dumps()), asha())
    assert c.journal.dumps() == b.journal.dumps()


def test_from_journal_rebuilds_the_search_from_its_text_alone() -> None:
    a = Asha(SearchSpace([1, 2], COMPILE, FIT), AshaParams(max_t=9, max_configs=15, sampler="tpe"),
             seed=11)  # fmt: skip
    _drive(a, 25)
    b = Asha.from_journal(a.journal.dumps())
    assert b.journal.dumps() == a.journal.dumps()
    assert b.params == a.params and b.seed == 11 and b.space.ids == [1, 2]
    assert b.ask("w7", now=30.0) == a.ask("w7", now=30.0)
    with pytest.raises(ArgumentError, match="not ASHA's"):
        Asha.from_journal(j.Journal(header={"method": "hyperband"}))


def test_from_journal_keeps_the_order_of_the_grids_keys() -> None:
    """The journal's JSON sorts dict keys; the grids' order (the draws' order, the text of
    each configuration) must survive it, or a resumed search would not replay."""
    compile_grid = {"loss": ["mse"], "optimizer_params_list": [{"optimizer": ["Adam"],
                    "lr": [0.001, 0.1, "log"]}], "metrics": ["mae"]}  # fmt: skip
    fit_grid = {"epochs": [1], "batch_size": [8, 16]}
    a = Asha(SearchSpace([1], compile_grid, fit_grid), AshaParams(max_t=9, max_configs=6), seed=4)
    _drive(a, 8)
    b = Asha.from_journal(a.journal.dumps())
    assert b.journal.dumps() == a.journal.dumps()
    assert b.space.compile_grid == compile_grid and list(b.space.fit_grid) == list(fit_grid)


def test_a_departed_worker_requeues_its_jobs_and_fails_the_lost_states() -> None:
    a = asha()
    for w in ("w0", "w1", "w2"):
        a.ask(w)
    a.report(1, 1, 0.5, worker="w0", checkpoint="w0:1-1")
    a.report(2, 1, 0.3, worker="w1", checkpoint="w1:2-1")
    assert kind(a.ask("w1")) == "start"  # trial 4 on w1
    # w1 leaves: trial 4 (in flight, nothing trained) is given out again; parked trial 2's
    # state went with w1 and no checkpoint is left: failed, ranked last, never promoted
    queued = a.apply(j.Departed(["w1"], requeue=[4], lost=[2], now=5.0))
    assert queued == j.Queued([4])
    assert a.trials[2].status == "failed" and a.trials[2].losses[0] is None
    assert a.rung_sizes()[0] == 2  # trial 2 still counts in its rung, last
    again = a.ask("w0")
    assert (kind(again), again.trial_id, again.retry) == ("start", 4, True)
    a.report(3, 1, 0.9, worker="w2", checkpoint="w2:3-1")
    a.report(4, 1, 0.7, worker="w0", checkpoint="w0:4-1")
    # rung 0: 1 (0.5), 4 (0.7), 3 (0.9), 2 (failed): trial 1 is the one promoted
    assert (kind(d := a.ask("w0")), d.trial_id) == ("promote", 1)
    # the journal replays, departure and all
    b = j.replay(j.Journal.loads(a.journal.dumps()), asha())
    assert b.journal.dumps() == a.journal.dumps()
