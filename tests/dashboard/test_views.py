"""dvml's dashboard page as plain values (dvml.dashboard.views): no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from dvml.dashboard.views import (
    datasets_view,
    jobs_view,
    models_view,
    page_state,
    workers_view,
)
from dvml.tracking.model_events import model_event


def _published(name: str, **per_worker: int) -> dict[str, Any]:
    return {
        "op": "publish",
        "name": name,
        "kind": "training",
        "rows": sum(per_worker.values()),
        "nbytes": 10 * sum(per_worker.values()),
        "workers": {w: {"rows": r, "nbytes": 10 * r} for w, r in per_worker.items()},
    }


def test_datasets_are_replayed_in_order() -> None:
    events = [
        (1.0, _published("a", w0=3, w1=3)),
        (2.0, _published("b", w0=5)),
        (3.0, {"op": "drop", "name": "a"}),
        (4.0, _published("b", w1=7)),  # overwritten: the last publication counts
        (5.0, "not a dvml message"),
    ]
    view = datasets_view(events)
    assert [d["name"] for d in view] == ["b"]
    assert view[0]["rows"] == 7 and view[0]["workers"] == {"w1": {"rows": 7, "nbytes": 70}}
    assert view[0]["published"] == 4.0


def test_workers_show_their_vineyardd_and_the_datasets_they_hold() -> None:
    workers = [
        {"name": "w1", "address": "tcp://b", "host": "h", "gpus": 0, "vineyard": None},
        {"name": "w0", "address": "tcp://a", "host": "h", "gpus": 1,
         "vineyard": {"used": 30, "limit": 100}},
    ]  # fmt: skip
    view = workers_view(workers, datasets_view([(1.0, _published("a", w0=3))]))
    assert [w["name"] for w in view] == ["w0", "w1"]
    assert view[0]["vineyard_used"] == 30 and view[0]["vineyard_limit"] == 100
    assert view[0]["datasets"] == {"a": 30} and view[1]["datasets"] == {}
    assert view[1]["vineyard_used"] is None


def _iteration(worker: str, k: int, steps: int, seconds: float) -> tuple[float, dict[str, Any]]:
    return (
        100.0 + k,
        {"kind": "iteration", "worker": worker, "iteration": k, "steps": steps,
         "fit_seconds": seconds, "averaging_seconds": 0.0},
    )  # fmt: skip


JOB = {
    "kind": "job", "started": 100.0, "workers": ["w0", "w1"], "model": "m", "program": "fit",
    "sync": "iteration", "num_iterations": 4, "start_iteration": 1,
}  # fmt: skip
NAMES = {"tcp://a": "w0", "tcp://b": "w1"}


def test_a_running_job_shows_its_trainers_progress_eta_and_the_slow_one() -> None:
    events = [(100.0, JOB)]
    for k in (1, 2):
        events += [_iteration("tcp://a", k, 10, 1.0), _iteration("tcp://b", k, 10, 3.0)]
    events.append(_iteration("tcp://a", 3, 10, 1.0))  # w0 is ahead; w1 holds iteration 3
    events[1][1]["resident_bytes"] = 700
    events[3][1]["resident_bytes"] = 900  # w0's peak over its samples
    (job,) = jobs_view({"dvml-fit-abc": events, "dvml-fit-abort-abc": []}, NAMES, now=110.0)
    assert job["job"] == "abc" and job["model"] == "m" and job["state"] == "running"
    assert job["iteration"] == 2  # the last every trainer finished
    assert job["elapsed"] == pytest.approx(10.0)
    assert job["eta_seconds"] == pytest.approx(10.0 / 2 * 2)
    by_worker = {t["worker"]: t for t in job["trainers"]}
    assert by_worker["w0"]["iteration"] == 3 and by_worker["w0"]["steps"] == 30
    assert by_worker["w1"]["step_seconds"] == pytest.approx(0.3)
    assert by_worker["w0"]["peak_resident_bytes"] == 900
    assert by_worker["w1"]["peak_resident_bytes"] is None  # it sent no sample
    assert job["straggler"]["worker"] == "w1" and job["straggler"]["ratio"] == pytest.approx(3.0)


def test_cluster_status_lists_a_running_fit_with_its_straggler() -> None:
    """`dvml cluster status` shows the running fits of this view, one row each."""
    from dvml.cli.cluster_cmd import job_rows

    events = [(100.0, JOB)]
    for k in (1, 2):
        events += [_iteration("tcp://a", k, 10, 1.0), _iteration("tcp://b", k, 10, 3.0)]
    (row,) = job_rows(jobs_view({"dvml-fit-abc": events}, NAMES, now=110.0))
    assert row == {"model": "m", "sync": "iteration", "iteration": "2/4", "elapsed": "10s",
                   "straggler": "w1 (3.0x the others' step time)"}  # fmt: skip
    even = [(100.0, JOB), _iteration("tcp://a", 1, 10, 1.0), _iteration("tcp://b", 1, 10, 1.0)]
    (row,) = job_rows(jobs_view({"dvml-fit-abc": even}, NAMES, now=101.0))
    assert row["straggler"] is None and row["iteration"] == "1/4"


def test_an_ended_job_and_an_even_one() -> None:
    events = [(100.0, JOB)]
    for k in (1, 2, 3, 4):
        events += [_iteration("tcp://a", k, 10, 1.0), _iteration("tcp://b", k, 10, 1.1)]
    events.append((108.0, {"kind": "ended", "outcome": "done", "at": 108.0}))
    (job,) = jobs_view({"dvml-fit-abc": events}, NAMES, now=500.0)
    assert job["state"] == "done" and job["iteration"] == 4
    assert job["elapsed"] == pytest.approx(8.0) and job["eta_seconds"] is None
    assert job["straggler"] is None


def test_a_job_before_its_first_iteration_and_newest_first() -> None:
    older = {**JOB, "started": 50.0, "model": "old"}
    jobs = jobs_view({"dvml-fit-1": [(50.0, older)], "dvml-fit-2": [(100.0, JOB)]}, NAMES, 101.0)
    assert [j["model"] for j in jobs] == ["m", "old"]
    assert [t["iteration"] for t in jobs[0]["trainers"]] == [0, 0]
    assert jobs[0]["eta_seconds"] is None and jobs[0]["trainers"][0]["step_seconds"] is None


def test_page_state_names_trainers_by_worker_name() -> None:
    workers = [{"name": "w0", "address": "tcp://a"}, {"name": "w1", "address": "tcp://b"}]
    topics = {
        "dvml-datasets": [(1.0, _published("d", w0=2))],
        "dvml-fit-x": [(100.0, JOB), _iteration("tcp://a", 1, 4, 1.0)],
        "other-topic": [(1.0, {"kind": "job"})],
    }
    state = page_state(workers, topics, now=102.0)
    assert [d["name"] for d in state["datasets"]] == ["d"]
    assert len(state["jobs"]) == 1
    assert {t["worker"]: t["steps"] for t in state["jobs"][0]["trainers"]} == {"w0": 4, "w1": 0}


def test_a_model_hopper_job_shows_each_models_hops_and_parked_ones() -> None:
    from dvml.dashboard.views import hop_jobs_view

    def hop(k: int, it: int, worker: str, loss: float) -> tuple[float, dict[str, Any]]:
        return (10.0 + it, {"kind": "hop", "mst_key": k, "iteration": it, "worker": worker,
                            "fit_loss": loss, "train_s": 0.5})  # fmt: skip

    start = (10.0, {"kind": "job", "model": "mop", "workers": ["w0", "w1"], "started": 10.0})
    events = [start, hop(1, 1, "tcp://a", 0.9), hop(2, 1, "w1", 0.8), hop(1, 1, "tcp://b", 0.7),
              (12.0, {"kind": "park", "mst_key": 2})]  # fmt: skip
    (job,) = hop_jobs_view({"dvml-hop-j": events}, NAMES, now=13.0)
    assert job["model"] == "mop" and job["state"] == "running" and job["hops"] == 3
    one, two = job["models"]
    assert one == {"mst_key": 1, "hops": 2, "train_s": 1.0, "iteration": 1, "worker": "w1",
                   "fit_loss": 0.7, "state": "training"}  # fmt: skip
    assert two["state"] == "parked"
    events.append((14.0, {"kind": "ended", "outcome": "done", "at": 14.0}))
    (job,) = hop_jobs_view({"dvml-hop-j": events}, NAMES, now=99.0)
    assert [m["state"] for m in job["models"]] == ["done", "parked"]
    assert job["elapsed"] == pytest.approx(4.0)


def test_a_search_shows_rungs_trial_states_and_the_best_so_far() -> None:
    from dvml.dashboard.views import searches_view

    def rec(event: dict[str, Any], decision: dict[str, Any]) -> dict[str, Any]:
        return {"event": event, "decision": decision}

    ask = {"type": "ask", "worker": "w0"}
    records = [
        rec(ask, {"type": "start", "trial_id": 0, "worker": "w0", "iterations": 1}),
        rec(ask, {"type": "start", "trial_id": 1, "worker": "w1", "iterations": 1}),
        rec({"type": "result", "trial_id": 0, "iterations": 1, "loss": 0.5},
            {"type": "park", "trial_id": 0, "rung": 0, "loss": 0.5}),
        rec({"type": "result", "trial_id": 1, "iterations": 1, "loss": 0.3},
            {"type": "promote", "trial_id": 1, "worker": "w1", "rung": 1, "iterations": 2}),
    ]  # fmt: skip
    # told in two parts, and the first part again (a resumed search starts from 0)
    events = [(1.0, {"kind": "journal", "offset": 0, "records": records[:2]}),
              (2.0, {"kind": "journal", "offset": 2, "records": records[2:]}),
              (3.0, {"kind": "journal", "offset": 0, "records": records})]  # fmt: skip
    (search,) = searches_view({"dvml-search-hp": events, "dvml-fit-x": []})
    assert search["model_output"] == "hp" and search["state"] == "running"
    assert search["rungs"] == {"0": 2}  # results at rung 0; trial 1 trains towards rung 1
    assert search["best"] == {"trial": 1, "loss": 0.3, "rung": 0}
    states = {t["trial"]: (t["state"], t["rung"], t["iterations"]) for t in search["trials"]}
    assert states == {0: ("parked", 0, 1), 1: ("running", 1, 1)}
    stop = rec({"type": "result", "trial_id": 1, "iterations": 3, "loss": 0.2},
               {"type": "stop", "reason": "done"})  # fmt: skip
    events.append((4.0, {"kind": "journal", "offset": 4, "records": [stop]}))
    (search,) = searches_view({"dvml-search-hp": events})
    assert search["state"] == "stopped" and search["rungs"] == {"0": 2, "1": 1}
    assert search["best"] == {"trial": 1, "loss": 0.2, "rung": 1}


def test_faults_are_failed_jobs_and_departed_workers_newest_first() -> None:
    failed = [(100.0, JOB), (105.0, {"kind": "ended", "outcome": "failed", "at": 105.0,
                                      "error": "TrainerFailedError: w1 died"})]  # fmt: skip
    hop = [(10.0, {"kind": "job", "model": "mop", "started": 10.0}),
           (20.0, {"kind": "departed", "workers": ["w1"], "at": 120.0}),
           (20.0, {"kind": "ended", "outcome": "failed", "at": 120.0}),
           (21.0, {"kind": "ended", "outcome": "done", "at": 121.0})]  # fmt: skip
    state = page_state([], {"dvml-fit-a": failed, "dvml-hop-b": hop}, now=200.0)
    assert state["jobs"][0]["state"] == "failed"
    assert state["hop_jobs"][0]["state"] == "failed"  # the first end says how it ended
    assert [(f["model"], f["what"]) for f in state["faults"]] == [
        ("mop", "worker(s) w1 left"),
        ("m", "TrainerFailedError: w1 died"),
    ]


def _lineage(name: str, version: int, digest: str, warm: bool = False) -> dict[str, Any]:
    read = {"name": name, "version": version, "content_digest": digest, "digests": {"0": "x"}}
    return {"lineage": {"data": {"training": read, "validation": None}, "warm_start": warm}}


def test_models_show_the_data_that_trained_them_newest_first_once_per_name() -> None:
    saved = [
        (1.0, model_event("a", _lineage("digits", 1, "d1"), 10.0, "dvml.fit")),
        (2.0, model_event("b", {"no": "lineage"}, 20.0, "dvml.run r")),
        (3.0, model_event("a", _lineage("digits", 2, "d2", warm=True), 30.0, "dvml.fit")),
    ]
    listed = page_state([], {"dvml-models": saved}, now=40.0)["models"]
    assert [(m["name"], m["at"]) for m in listed] == [("a", 30.0), ("b", 20.0)]
    assert listed[0]["training"] == {"name": "digits", "version": 2, "content_digest": "d2"}
    assert listed[0]["validation"] is None and listed[0]["warm_start"] is True
    assert listed[1]["training"] is None and listed[1]["trained_by"] == "dvml.run r"
    many = [(float(k), model_event(f"m{k}", {}, float(k), "dvml.fit")) for k in range(30)]
    assert [m["name"] for m in models_view(many, limit=3)] == ["m29", "m28", "m27"]


def test_reservations_show_each_jobs_bytes_per_machine_oldest_first() -> None:
    held = [
        {"job": "dvml.fit of model 'b'", "since": "2026-11-28T10:05:00+00:00",
         "machines": {"host-0": 300, "host-1": 100}, "client": "c", "id": "2"},
        {"job": "dvml.fit of model 'a'", "since": "2026-11-28T10:00:00+00:00",
         "machines": {"host-0": 50}, "client": "c", "id": "1"},
    ]  # fmt: skip
    listed = page_state([], {}, now=0.0, reservations=held)["reservations"]
    assert [(r["job"], r["total"]) for r in listed] == [
        ("dvml.fit of model 'a'", 50),
        ("dvml.fit of model 'b'", 400),
    ]
    assert listed[1]["machines"] == {"host-0": 300, "host-1": 100}
    assert page_state([], {}, now=0.0)["reservations"] == []


def test_a_hyperband_search_shows_its_brackets_from_its_latest_report() -> None:
    from dvml.dashboard.views import searches_view

    def report(done: int, state: str, loss: float | None) -> dict[str, Any]:
        bracket = {"s": 1, "round": done - 1, "rounds": 2, "keys": [3], "iterations": 4,
                   "loss": loss}  # fmt: skip
        return {"kind": "hyperband", "state": state, "done": done, "diagonals": 2, "best": 3,
                "loss": loss, "brackets": [bracket]}  # fmt: skip

    events = [(1.0, report(1, "running", 0.4)), (2.0, report(2, "finished", 0.3))]
    (search,) = searches_view({"dvml-search-hb": events})
    assert search["method"] == "hyperband" and search["state"] == "finished"
    assert (search["diagonal"], search["diagonals"]) == (2, 2)
    assert search["best"] == {"trial": 3, "loss": 0.3}
    assert search["brackets"][0]["round"] == 1 and search["trials"] == []
