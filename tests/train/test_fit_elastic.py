"""An elastic fit (``dvml.fit(..., elastic=True)``, issue 37 item 4) on a real 2-worker
LocalCluster of the test's own: worker-1's Dask worker process is SIGKILLed once iteration 1
is checkpointed; its vineyardd (and its buffers) still run. The fit goes on with worker-0 from
the last iteration it checkpointed, after copying worker-1's buffers onto it, finishes every
iteration and registers the model; the summary names the departure and the trainers of every
iteration after it held (and trained once per epoch) all the dataset's rows, by their own
count. Digits, a dense net, ``sync="iteration"`` and ``sync="step"``.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import dask
import pytest

import dvml
from tests.helpers import Background, poll_for
from tests.helpers.clusters import digits_elastic_env
from tests.helpers.models import digits_dense

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)'"
FIT = "batch_size=32, epochs=3"
ITERATIONS = 5


@pytest.fixture
def env(local_cluster: Any, tmp_path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """A 2-worker LocalCluster of the test's own (a killed worker's Nanny starts a new worker
    process: it must be closed with the test), digits packed on it in 8 buffers, a registry."""
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    with digits_elastic_env(cluster, tmp_path, "el", 1500, 200, digits_dense().to_json()) as env:
        yield env


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _checkpointed(state: pathlib.Path, iteration: int, model: str = "el_model") -> bool:
    """Whether a trainer of fit ``model`` has checkpointed ``iteration`` (or a later one)."""
    for meta in state.glob(f"checkpoints/{model}-*/*.npz.json"):
        try:
            if json.loads(meta.read_text())["iteration"] >= iteration:
                return True
        except (OSError, ValueError, KeyError):
            continue
    return False


@pytest.mark.parametrize("sync", ["iteration", "step"])
def test_an_elastic_fit_goes_on_without_a_departed_worker_and_keeps_its_rows(
    env: dict[str, Any], sync: str
) -> None:
    """Model averaging (the survivors' weights averaged by rows) and a MultiWorkerMirrored
    strategy started again on the survivors: both go on from the checkpoint."""

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.fit(
                "el_digits", "el_model", env["arch"], COMPILE, FIT, num_iterations=ITERATIONS,
                validation_set="el_val", sync=sync, elastic=True, on_iteration=seen,
                registry=env["registry"], client=env["client"],
            )  # fmt: skip

    lines: list[str] = []
    handler = _Lines(lines)
    logging.getLogger("dvml.train").addHandler(handler)
    records: list[dict[str, Any]] = []
    job = Background(lambda seen: run(records.append))
    assert poll_for(lambda: job.done() or _checkpointed(env["state"], 1), 300), job.outcome
    assert not job.done(), job.outcome
    os.kill(env["cluster"].processes()["dask worker worker-1"], signal.SIGKILL)
    killed = time.monotonic()
    try:
        model = job.result(300)
    finally:
        logging.getLogger("dvml.train").removeHandler(handler)
    took = time.monotonic() - killed
    summary = model.summary
    assert summary["departed"] == ["worker-1"] and summary["sync"] == sync, summary
    first = summary["departed_at_iterations"]["worker-1"]
    assert 2 <= first <= ITERATIONS, summary
    # every iteration ran (this call trained them all) and the model is registered, with its
    # metrics at the last iteration
    assert [i for i, _ in summary["rows_per_epoch"]] == list(range(1, ITERATIONS + 1)), summary
    assert summary["metrics_iters"] == [ITERATIONS], summary
    assert summary["validation_loss_final"] is not None, summary
    assert "el_model" in set(env["registry"].list_models()["name"])
    # worker-1's rows were copied from its vineyardd onto worker-0, none left out
    (departure,) = summary["departures"]
    assert departure["training"]["path"] == "copied", departure
    assert summary["repinned_rows"] > 0 and summary["rows_left_out"] == 0, summary
    assert summary["repin_seconds"] > 0
    assert departure["validation"]["path"] in {"copied", "none"}, departure
    # rows trained per epoch, from the trainers' own counts, in every iteration this call
    # trained, before the departure (two trainers) and after it (one): the whole dataset where
    # each trainer's steps cover its rows ("iteration"); with "step" every trainer runs the
    # same full batches, so each leaves out fewer rows than its batch (a new set each epoch)
    rows = dict(summary["rows_per_epoch"])
    for i in range(1, ITERATIONS + 1):
        if sync == "iteration":
            assert rows[i] == env["rows"], (i, rows, env["rows"])
        else:
            assert env["rows"] - 32 < rows[i] <= env["rows"], (i, rows, env["rows"])
    # the dataset now lives on worker-0 only, same rows (a repin version)
    ds = dvml.datasets.describe("el_digits", client=env["client"])
    assert {b["worker_name"] for b in ds.layout["buffers"]} == {"worker-0"}
    assert ds.rows == env["rows"] and "repin" in ds.versions[-1]["source"]
    # the progress records after the departure compare only the trainers that run
    after = [r for r in records if r["iteration"] >= first]
    assert after and not any(r["stragglers"] for r in after), after
    # the departure is logged with what was copied
    assert any("going on with ['worker-0']" in line for line in lines), lines
    print(f"elastic fit finished {took:.1f}s after the kill; departure {departure}")


def test_an_elastic_fit_whose_departed_host_took_its_rows_says_how_many_were_left_out(
    env: dict[str, Any],
) -> None:
    """The whole host goes (its vineyardd is killed with the worker): its rows cannot be
    copied, the fit goes on with worker-0's rows only and the summary says how many rows were
    left out from which iteration (never silently)."""

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.fit(
                "el_digits", "el_model", env["arch"], COMPILE, FIT, num_iterations=ITERATIONS,
                sync="iteration", elastic=True, progress=False, registry=env["registry"],
                client=env["client"],
            )  # fmt: skip

    held = _rows_on(env, "worker-1")
    job = Background(run)
    assert poll_for(lambda: job.done() or _checkpointed(env["state"], 1), 300), job.outcome
    assert not job.done(), job.outcome
    pids = env["cluster"].processes()
    os.kill(pids["vineyardd of worker-1"], signal.SIGKILL)
    os.kill(pids["dask worker worker-1"], signal.SIGKILL)
    summary = job.result(300).summary
    assert summary["departed"] == ["worker-1"], summary
    first = summary["departed_at_iterations"]["worker-1"]
    (departure,) = summary["departures"]
    assert departure["training"]["path"] == "left_out", departure
    assert "does not answer" in departure["training"]["left_out_reason"], departure
    assert summary["repinned_rows"] == 0 and summary["rows_left_out"] == held > 0, summary
    assert summary["rows_left_out_from_iteration"] == first, summary
    rows = dict(summary["rows_per_epoch"])
    assert all(rows[i] == env["rows"] - held for i in range(first, ITERATIONS + 1)), rows
    assert rows[1] == env["rows"], rows


def _rows_on(env: dict[str, Any], worker: str) -> int:
    ds = dvml.datasets.describe("el_digits", client=env["client"])
    return sum(b["rows"] for b in ds.layout["buffers"] if b["worker_name"] == worker)


def test_an_elastic_fit_goes_on_from_its_checkpoint_after_a_trainer_is_killed(
    env: dict[str, Any],
) -> None:
    """worker-1's trainer (not its worker) is SIGKILLed once iteration 1 is checkpointed: no
    worker left, so the fit goes on with the same two workers from the last checkpoint
    (``dvml.train.elastic-max-failures``), trains every iteration and every row, and lists
    the failure in ``trainer_failures``; with the budget at 0 the same kill fails the fit."""
    from tests.helpers import worker_trainers

    def run(seen: Any, name: str, failures: int) -> Any:
        settings = {**env["settings"], "dvml.train.elastic-max-failures": failures}
        with dask.config.set(settings):
            return dvml.fit(
                "el_digits", name, env["arch"], COMPILE, FIT, num_iterations=ITERATIONS,
                sync="iteration", elastic=True, on_iteration=seen, registry=env["registry"],
                client=env["client"],
            )  # fmt: skip

    def kill_a_trainer(name: str, failures: int) -> Any:
        job = Background(lambda seen: run(seen, name, failures))
        assert poll_for(lambda: job.done() or _checkpointed(env["state"], 1, name), 300), (
            job.outcome
        )
        victims = worker_trainers(env["cluster"], "worker-1", model=name)
        assert len(victims) == 1 and not job.done(), (victims, job.outcome)
        os.kill(victims[0], signal.SIGKILL)
        return job

    summary = kill_a_trainer("el_retried", 2).result(300).summary
    (failure,) = summary["trainer_failures"]
    assert "SIGKILL" in failure["error"] and 2 <= failure["at_iteration"] <= ITERATIONS, failure
    assert summary["departed"] == [] and summary["trainers"] == ["worker-0", "worker-1"]
    rows = dict(summary["rows_per_epoch"])
    assert all(rows[i] == env["rows"] for i in range(1, ITERATIONS + 1)), rows

    with pytest.raises(dvml.exceptions.TrainerFailedError, match="SIGKILL"):
        kill_a_trainer("el_failed", 0).result(300)
