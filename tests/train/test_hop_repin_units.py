"""The pure parts of an elastic fit_multiple (dvml.train.hop_repin): the rows each model
trained per epoch from its hop records, the summary's fields about departures, and the job
key rule (dvml.train.fit_multiple.selection_key)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dvml.store.datasets import Dataset
from dvml.train.departures import departure_fields, describe_repin
from dvml.train.fit_multiple import selection_key
from dvml.train.hop_repin import rows_per_epoch
from dvml.train.runtime.plan import Job, JobArgs, dataset_key, job_key


def _hops(*rows: int | None) -> dict[str, Any]:
    return {"records": [{"rows": r} for r in rows], "evals": []}


def test_rows_per_epoch_sums_a_models_hops_of_each_iteration():
    history = {2: _hops(300, 450, 150), 1: _hops(300, 300, 300)}
    assert rows_per_epoch(history) == [[1, 900], [2, 900]]


def test_rows_per_epoch_says_none_for_an_iteration_whose_records_do_not_all_say():
    # a checkpoint written by an older dvml carries hop records without rows
    assert rows_per_epoch({1: _hops(300, None), 2: _hops(), 3: _hops(600)}) == [
        [1, None],
        [2, None],
        [3, 600],
    ]


def _repin(copied: int, left: int, seconds: float) -> dict[str, Any]:
    return {"repinned_rows": copied, "rows_left_out": left, "repin_seconds": seconds,
            "left_out_reason": "its vineyardd does not answer" if left else None}  # fmt: skip


def test_departure_fields_add_up_the_copies_and_the_rows_left_out():
    departures = [
        {"workers": ["worker-1"], "at_iteration": 2, "training": _repin(300, 0, 0.5),
         "validation": _repin(100, 0, 0.25)},
        {"workers": ["worker-2"], "at_iteration": 3, "training": _repin(0, 200, 0.125),
         "validation": None},
    ]  # fmt: skip
    fields = departure_fields(departures)
    assert fields["departed"] == ["worker-1", "worker-2"]
    assert fields["departed_at_iterations"] == {"worker-1": 2, "worker-2": 3}
    assert fields["repinned_rows"] == 300 and fields["rows_left_out"] == 200
    assert fields["rows_left_out_from_iteration"] == 3
    assert fields["repin_seconds"] == 0.875
    assert fields["departures"] == departures
    assert "200 rows left out" in describe_repin(departures[1])


def test_departure_fields_of_a_job_nobody_left():
    fields = departure_fields([])
    assert fields["departed"] == [] and fields["departed_at_iterations"] == {}
    assert fields["repinned_rows"] == fields["rows_left_out"] == 0
    assert fields["rows_left_out_from_iteration"] is None and fields["repin_seconds"] == 0


def _dataset(placement: list[str], version: int = 1, digest: str = "d") -> Dataset:
    buffers = [
        {"index": i, "worker_name": w, "instance_id": int(w[-1]), "rows": 10,
         "fields": {"x": {"digest": f"{digest}{i}", "nbytes": 40}}}
        for i, w in enumerate(placement)
    ]  # fmt: skip
    return Dataset(
        name="ds", id=1, kind="dataset", summary={"dataset_id": "abc"},
        layout={"buffers": buffers, "fields": {}}, version=version,
    )  # fmt: skip


def _job(train: Dataset) -> Job:
    args = JobArgs("mop", "ds", None, 4, None, False, False, None, 1, 60.0)
    workers = [SimpleNamespace(name=w) for w in sorted({b["worker_name"] for b in
                                                        train.layout["buffers"]})]  # fmt: skip
    return Job(args, train, None, workers, 4, 1, 60.0, {}, None)  # type: ignore[arg-type]


def test_an_elastic_fit_multiples_key_survives_a_repin_but_not_new_rows():
    """A rerun after a re-pin (the next version, fewer workers) resumes; a fixed job's key
    is unchanged (its workers and the version in it)."""
    models = [(1, 7, {"fit_params": {"batch_size": 8}})]
    before = _dataset(["w0", "w1", "w2"])
    repinned = _dataset(["w0", "w2", "w2"], version=2)  # same buffers, new placement
    appended = _dataset(["w0", "w1", "w2"], version=2, digest="e")  # other contents
    key = selection_key(_job(before), models, elastic=True)
    assert selection_key(_job(repinned), models, elastic=True) == key
    assert selection_key(_job(appended), models, elastic=True) != key
    fixed = selection_key(_job(before), models, elastic=False)
    assert fixed != key and selection_key(_job(repinned), models, elastic=False) != fixed
    assert fixed == job_key("fit_multiple", "mop", dataset_key(before), None, models, 4, 4, 1,
                            False, ["w0", "w1", "w2"])  # fmt: skip
