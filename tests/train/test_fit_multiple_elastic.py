"""An elastic ``fit_multiple`` re-pins a departed worker's rows (issue 37 item 4), on a real
3-worker LocalCluster of the test's own: worker-1's Dask worker process is SIGKILLed once an
iteration-1 checkpoint is written. Its vineyardd still runs, so its buffers are copied onto
worker-0 and worker-2, the serving trainers restart on the new layout, and every model trains
every row of the dataset once per epoch in EVERY iteration, before the kill and after it (by
the trainers' own counts in the hop records). When its vineyardd is killed too, its rows are
left out and counted exactly. Digits, a dense net, 3 configurations, 4 iterations.
"""

from __future__ import annotations

import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import dask
import pytest

import dvml
from tests.helpers import Background, poll_for
from tests.helpers.clusters import digits_elastic_env
from tests.helpers.models import digits_dense

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

ITERATIONS = 4
CONFIGS = [
    {"mst_key": k, "fit_params": "batch_size=32, epochs=1",
     "compile_params": f"loss='categorical_crossentropy', optimizer='Adam(learning_rate={lr})',"
                       " metrics=['accuracy']"}
    for k, lr in ((1, 0.003), (2, 0.01), (3, 0.03))
]  # fmt: skip


@pytest.fixture
def env(local_cluster: Any, tmp_path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """3 workers (a killed worker's Nanny starts a new process: closed with the test), 900
    digits in 9 buffers of 100 rows (3 per worker), the rest as the validation set."""
    cluster = local_cluster(n_workers=3, vineyard_memory="128MiB")
    with digits_elastic_env(cluster, tmp_path, "hr", 900, 100, digits_dense().to_json()) as env:
        yield env


def _fit_multiple(env: dict[str, Any], models: int) -> Background:
    """Start the job; return once ``models`` models have checkpointed iteration 1 (while the
    job still runs)."""
    configs = [{**c, "model_id": env["arch"]} for c in CONFIGS]

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.fit_multiple(
                "hr_digits", "hr_mop", configs, num_iterations=ITERATIONS,
                validation_set="hr_val", elastic=True, progress=False,
                registry=env["registry"], client=env["client"],
            )  # fmt: skip

    job = Background(run)

    def checkpointed() -> bool:
        found = env["state"].glob("checkpoints/hr_mop-mop-*/*-1.npz.json")
        return len({p.name for p in found}) >= models

    assert poll_for(lambda: job.done() or checkpointed(), 300), job.outcome
    assert not job.done(), job.outcome
    return job


def _rows_on(env: dict[str, Any], worker: str) -> int:
    ds = dvml.datasets.describe("hr_digits", client=env["client"])
    return sum(b["rows"] for b in ds.layout["buffers"] if b["worker_name"] == worker)


def _rows_per_epoch(selection: Any) -> dict[int, dict[int, int]]:
    """mst_key -> iteration -> the rows its hops of that iteration trained (once per epoch)."""
    info = selection.info.set_index("mst_key")
    return {int(k): {int(i): r for i, r in info.loc[k, "rows_per_epoch"]} for k in info.index}


def test_an_elastic_fit_multiple_repins_a_departed_workers_rows(env: dict[str, Any]) -> None:
    """Fails on main: there the job goes on with the survivors' own rows, so worker-1's
    buffers stay where they were (no repin version) and each model trains 600 of the 900
    rows per iteration after the kill."""
    held = _rows_on(env, "worker-1")
    job = _fit_multiple(env, models=len(CONFIGS))  # iteration 1 done: kill in iteration 2
    os.kill(env["cluster"].processes()["dask worker worker-1"], signal.SIGKILL)
    selection = job.result(300)
    summary = selection.summary
    # worker-1's rows were copied off its vineyardd onto the others (a repin version)
    ds = dvml.datasets.describe("hr_digits", client=env["client"])
    assert {b["worker_name"] for b in ds.layout["buffers"]} == {"worker-0", "worker-2"}, ds
    assert ds.rows == env["rows"] and "repin" in ds.versions[-1]["source"], ds.versions
    assert summary["departed"] == ["worker-1"], summary
    first = summary["departed_at_iterations"]["worker-1"]
    assert 1 <= first <= ITERATIONS, summary
    assert summary["repinned_rows"] == held > 0 and summary["rows_left_out"] == 0, summary
    assert summary["rows_left_out_from_iteration"] is None and summary["repin_seconds"] > 0
    (departure,) = summary["departures"]
    assert departure["training"]["path"] == "copied", departure
    # every model trained every row once per epoch in every iteration, before and after
    rows = _rows_per_epoch(selection)
    for k, per_iteration in rows.items():
        assert per_iteration == dict.fromkeys(range(1, ITERATIONS + 1), env["rows"]), (k, rows)
    # the iterations after the departure ran on the two survivors only, with new trainers
    after = [(k, it, w) for k, it, w in summary["hop_workers"] if it > max(
        summary["resumed_from_iterations"])]  # fmt: skip
    assert after and {w for _, _, w in after} == {"worker-0", "worker-2"}, summary["hop_workers"]
    assert all(list(m) == [ITERATIONS] for m in selection.info["metrics_iters"])
    assert {f"hr_mop_{k}" for k in (1, 2, 3)} <= set(env["registry"].list_models()["name"])
    print(
        f"departed at {first}, resumed from {summary['resumed_from_iterations']}: "
        f"{held} rows re-pinned in {summary['repin_seconds']}s; rows per epoch {rows}"
    )


def test_an_elastic_fit_multiple_counts_the_rows_a_departed_host_took(
    env: dict[str, Any],
) -> None:
    """Worker-1's vineyardd is killed with it: its rows cannot be copied, and the summary
    says exactly how many were left out from which iteration; each model's rows per epoch
    drop by exactly that many from its first iteration without them. Fails on main: there
    the summary has no ``rows_left_out`` (the rows left out are not counted)."""
    held = _rows_on(env, "worker-1")
    job = _fit_multiple(env, models=1)
    pids = env["cluster"].processes()
    os.kill(pids["vineyardd of worker-1"], signal.SIGKILL)
    os.kill(pids["dask worker worker-1"], signal.SIGKILL)
    selection = job.result(300)
    summary = selection.summary
    first = summary["departed_at_iterations"]["worker-1"]
    assert summary["rows_left_out"] == held > 0 and summary["repinned_rows"] == 0, summary
    assert summary["rows_left_out_from_iteration"] == first, summary
    (departure,) = summary["departures"]
    assert departure["training"]["path"] == "left_out", departure
    assert "does not answer" in departure["training"]["left_out_reason"], departure
    rows = _rows_per_epoch(selection)
    resumed = dict(zip(summary["mst_keys"], summary["resumed_from_iterations"], strict=True))
    for k, per_iteration in rows.items():
        expected = {i: env["rows"] - (held if i > resumed[k] else 0)
                    for i in range(1, ITERATIONS + 1)}  # fmt: skip
        assert per_iteration == expected, (k, rows, resumed)
    print(f"left out {held} rows from iteration {first}; rows per epoch {rows}")
