"""The pure parts of elastic fits (dvml.train.elastic): the job key rule, the resume rule,
the rows count and the summary fields. No cluster."""

from __future__ import annotations

from typing import Any

from dvml.exceptions import TrainerFailedError
from dvml.store.datasets import Dataset
from dvml.train.elastic import (
    ElasticRun,
    _rows_of,
    _Tally,
    _transient,
    elastic_resume_from,
    elastic_summary,
    fit_key,
    rows_key,
)
from dvml.train.runtime.lockstep import resume_from
from dvml.train.runtime.plan import Job, JobArgs, ModelSpec, dataset_key, job_key


def _dataset(placement: list[tuple[str, int]], version: int = 1, digest: str = "d") -> Dataset:
    buffers = [
        {"index": i, "worker_name": w, "instance_id": iid, "rows": 10,
         "fields": {"x": {"digest": f"{digest}{i}", "nbytes": 40}}}
        for i, (w, iid) in enumerate(placement)
    ]  # fmt: skip
    return Dataset(
        name="ds", id=1, kind="dataset", summary={"dataset_id": "abc"},
        layout={"buffers": buffers, "fields": {}}, version=version,
    )  # fmt: skip


def _job(train: Dataset, n_workers: int = 2) -> tuple[Job, ModelSpec]:
    args = JobArgs("m", "ds", None, 3, None, False, False, None, 1, 60.0)
    job = Job(args, train, None, [object()] * n_workers, 3, 1, 60.0, {}, None)  # type: ignore[list-item]
    spec = ModelSpec(7, {}, {"loss": "mse"}, {"batch_size": 8, "epochs": 1}, None)
    return job, spec


def _state(key: str, iteration: int) -> dict[str, Any]:
    history = [{"iteration": i} for i in range(1, iteration + 1)]
    return {"job_key": key, "iteration": iteration, "history": history, "weights": b"w"}


def test_a_fixed_fits_key_is_unchanged():
    train = _dataset([("w0", 1), ("w1", 2)])
    job, spec = _job(train)
    expected = job_key(dataset_key(train), None, 7, spec.compile_params, spec.fit_params, 3, 3,
                       1, False, 2, "iteration")  # fmt: skip
    assert fit_key(job, spec, "iteration", elastic=False) == expected


def test_an_elastic_key_survives_a_repin_and_a_worker_count_but_not_new_rows():
    before = _dataset([("w0", 1), ("w1", 2)])
    repinned = _dataset([("w0", 1), ("w0", 1)], version=2)  # same buffers, new placement
    appended = _dataset([("w0", 1), ("w1", 2)], version=2, digest="e")  # other contents
    key = fit_key(*_job(before, 2), "iteration", elastic=True)
    assert fit_key(*_job(repinned, 1), "iteration", elastic=True) == key
    assert fit_key(*_job(appended, 2), "iteration", elastic=True) != key
    assert fit_key(*_job(before, 2), "iteration", elastic=False) != key  # never shared
    assert fit_key(*_job(before, 2), "step", elastic=True) != key


def test_rows_key_falls_back_to_the_version_without_digests():
    ds = _dataset([("w0", 1)])
    ds.layout["buffers"][0]["fields"]["x"].pop("digest")
    assert rows_key(ds) == dataset_key(ds) == ["abc", 1]
    assert rows_key(None) is None


def test_an_elastic_rerun_resumes_without_waiting_for_a_worker_with_no_checkpoint():
    states = [_state("k", 3), None, _state("k", 2), _state("other", 5)]
    assert resume_from(states, "k") is None  # a fixed job starts afresh
    start, weights, history = elastic_resume_from(states, "k")  # type: ignore[misc]
    assert start == 3 and weights == b"w" and [r["iteration"] for r in history] == [1, 2]
    assert elastic_resume_from([None, _state("other", 2)], "k") is None


def _event(kind: str, worker: str, **fields: Any) -> tuple[float, dict[str, Any]]:
    return (0.0, {"kind": kind, "worker": worker, **fields})


def test_the_tally_sums_each_iterations_reported_rows_and_settles_unreported_ones():
    forwarded: list[Any] = []
    tally = _Tally(forwarded.append)
    tally.begin(2)
    for e in (
        _event("resolved", "a", rows=60), _event("resolved", "b", rows=40),
        _event("iteration", "a", iteration=1, rows=60),
        _event("iteration", "b", iteration=1, rows=40),
        _event("iteration", "a", iteration=2, rows=60),  # b was killed before it reported 2
    ):  # fmt: skip
        tally(e)
    assert len(forwarded) == 5 and tally.trained == {1: 100}
    tally.settle(1, 2)  # the survivors checkpointed 2: both trained it
    assert tally.trained == {1: 100, 2: 100}
    tally.begin(1)
    tally(_event("resolved", "a", rows=100))
    tally(_event("iteration", "a", iteration=3, rows=100))
    assert tally.trained == {1: 100, 2: 100, 3: 100}


def test_reports_that_never_came_are_read_back_from_the_checkpoints_once():
    """A stopped run's trainers finished iteration 2, but only a's report came: b's is given
    from its checkpointed history (a's is not given twice), iteration 3 (after the resume
    point) is not, and a late copy of a report is dropped."""
    forwarded: list[Any] = []
    tally = _Tally(forwarded.append)
    tally.begin(2)
    tally(_event("iteration", "a", iteration=2, rows=60))
    history = [{"iteration": i, "rows": 40, "fit_loss": 0.5} for i in (1, 2, 3)]
    tally.replay("b", history, 2, 2)
    tally.replay("a", [{"iteration": 2, "rows": 60, "fit_loss": 0.4}], 2, 2)
    assert [(m["worker"], m["iteration"]) for _, m in forwarded] == [("a", 2), ("b", 2)]
    assert forwarded[1][1]["kind"] == "iteration" and tally.trained == {2: 100}
    tally(_event("iteration", "b", iteration=2, rows=40))  # late: after its read-back
    assert len(forwarded) == 2


def test_rows_of_the_last_run_come_from_its_trainers_records():
    results = [
        {"iterations": [{"iteration": 3, "rows": 70}, {"iteration": 4, "rows": 70}]},
        {"iterations": [{"iteration": 3, "rows": 30}, {"iteration": 4, "rows": 30}]},
    ]
    assert _rows_of(results) == {3: 100, 4: 100}


def _repin(rows: int, left: int, seconds: float) -> dict[str, Any]:
    return {"repinned_rows": rows, "rows_left_out": left, "repin_seconds": seconds}


def test_the_summary_names_each_departure_and_what_became_of_its_rows():
    departures = [
        {"workers": ["w1"], "at_iteration": 3, "training": _repin(50, 0, 0.5),
         "validation": _repin(5, 0, 0.25)},
        {"workers": ["w2"], "at_iteration": 5, "training": _repin(0, 20, 0.0),
         "validation": None},
    ]  # fmt: skip
    run = ElasticRun([], [], [], departures, {5: 80, 1: 100, 3: 100})
    summary = elastic_summary(run)
    assert summary["departed"] == ["w1", "w2"]
    assert summary["departed_at_iterations"] == {"w1": 3, "w2": 5}
    assert summary["repinned_rows"] == 50 and summary["repin_seconds"] == 0.75
    assert summary["rows_left_out"] == 20 and summary["rows_left_out_from_iteration"] == 5
    assert summary["rows_per_epoch"] == [[1, 100], [3, 100], [5, 80]]
    assert summary["elastic"] is True and summary["departures"] == departures


def test_the_tally_knows_the_runs_last_complete_iteration_and_its_timings():
    tally = _Tally(lambda e: None)
    tally.begin(2)
    assert tally.completed() is None and tally.timings() == []
    tally(_event("iteration", "a", iteration=1, rows=60, steps=10, fit_seconds=1.0,
                 averaging_seconds=0.5))  # fmt: skip
    assert tally.completed() is None  # b has not reported 1 yet: no boundary
    tally(_event("iteration", "b", iteration=1, rows=40, steps=10, fit_seconds=1.0))
    assert tally.completed() == 1 and tally.first_done_at is not None
    assert tally.first_work_seconds == 1.0
    (timings,) = tally.timings()
    assert {t.worker: t.step_seconds for t in timings} == {"a": 0.05, "b": 0.1}
    assert tally.rows_of() == {"a": 60, "b": 40}
    tally.begin(3)  # a new run (a new row map): its own iterations and figures only
    assert tally.completed() is None and tally.rows_of() == {}


def test_the_summary_says_what_each_row_map_change_moved_and_who_joined():
    changes = [
        {"kind": "speed", "at_iteration": 2, "after_iteration": 1, "joined": [],
         "training": {"rows_moved": 200, "bytes_moved": 5000}},
        {"kind": "join", "at_iteration": 4, "after_iteration": 3, "joined": ["w3"],
         "training": {"rows_moved": 300, "bytes_moved": 7500}, "validation": None},
    ]  # fmt: skip
    summary = elastic_summary(ElasticRun([], [], [], [], {}, changes))
    assert summary["rebalanced_at_iterations"] == [2, 4]
    assert summary["moved_rows"] == 500 and summary["moved_bytes"] == 12500
    assert summary["joined"] == ["w3"] and summary["joined_at_iterations"] == {"w3": 4}
    assert summary["row_map_changes"] == changes and summary["trainers"] == []
    quiet = elastic_summary(ElasticRun([], [], [], [], {}))
    assert quiet["rebalanced_at_iterations"] == [] and quiet["moved_rows"] == 0
    assert quiet["joined"] == [] and quiet["joined_at_iterations"] == {}


def test_only_a_killed_trainer_or_a_broken_collective_is_gone_on_from() -> None:
    """An elastic fit goes on after a trainer failure that may not come again; an error the
    trainer's own program raised (the model's) would, and fails the fit at once."""
    head = "The trainer on worker worker-0 failed: exit code 70, "
    killed = "The trainer on worker worker-1 (pid 7) failed: it was killed by SIGKILL (signal 9)"
    broken = head + "AbortedError: Collective ops is aborted by: task 1 restarted"
    own = head + "ValueError: Shapes (8, 3) and (8, 10) are incompatible"
    assert _transient(TrainerFailedError(killed)) and _transient(TrainerFailedError(broken))
    assert not _transient(TrainerFailedError(own))
