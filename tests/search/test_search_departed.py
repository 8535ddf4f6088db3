"""A Dask worker that leaves the cluster during a search or an elastic ``fit_multiple`` (its
process SIGKILLed) on a real 2-worker LocalCluster of the test's own: the job names it within
the runtime watcher's bound (scheduler + TCP probe), leaves it out and finishes on the other
worker. ASHA and Hyperband re-pin worker-1's rows onto worker-0; ASHA queues the jobs it
interrupted again from their checkpoints, Hyperband goes on with the diagonal in flight from
its last checkpointed iteration, and ``fit_multiple(elastic=True)`` resumes each model from its
own last checkpoint on the remaining worker. Iris, a small dense model."""

from __future__ import annotations

import os
import pathlib
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dask
import pytest

import dvml
from dvml.search import journal as j
from tests.helpers import Background, iris_frame, iris_mlp, poll_for, worker_trainers

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.003, 0.01, 0.03, 0.1]}],
    "metrics": ["accuracy"],
}
COMPILE_RANGE = {**COMPILE, "optimizer_params_list": [{"optimizer": ["Adam"],
                                                        "lr": [0.001, 0.1, "log"]}]}  # fmt: skip
FIT = {"batch_size": [8, 16], "epochs": [2]}
BOUND_S = 30.0  # the watcher's: a probe every 2 s, 3 s of TCP timeout; generous on 2 cores


@pytest.fixture
def env(local_cluster: Any, tmp_path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """A 2-worker LocalCluster of the test's own (a killed worker's Nanny starts a new worker
    process: it must be closed with the test), iris packed on it, a registry."""
    frame = iris_frame()
    model = iris_mlp()
    settings = {"dvml.cluster.state-dir": str(tmp_path / "state")}
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    client = cluster.client
    with dask.config.set(settings):
        dvml.training_preprocessor(
            frame.iloc[:120], y="label", x="x", name="dep_iris", overwrite=True, client=client
        )
        dvml.validation_preprocessor(
            frame.iloc[120:], y="label", x="x", training="dep_iris", name="dep_iris_val",
            overwrite=True, client=client,
        )  # fmt: skip
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    arch = dvml.load_keras_model(model.to_json(), name="iris_mlp", registry=registry)
    yield {"cluster": cluster, "client": client, "registry": registry, "arch": arch,
           "state": tmp_path / "state", "settings": settings}  # fmt: skip
    registry.close()


def _kill_worker_1(env: dict[str, Any]) -> float:
    """SIGKILL the Dask worker process worker-1 (its Nanny brings a new one up later)."""
    os.kill(env["cluster"].processes()["dask worker worker-1"], signal.SIGKILL)
    return time.monotonic()


def _kill_trainer_of_worker_1(env: dict[str, Any], output: str, job: Background) -> None:
    """SIGKILL the trainer of job ``output`` on worker-1 (the worker stays)."""
    victims = worker_trainers(env["cluster"], "worker-1", model_output=output)
    assert len(victims) == 1 and not job.done(), (victims, job.outcome)
    os.kill(victims[0], signal.SIGKILL)


def _checkpointed(env: dict[str, Any], pattern: str) -> Callable[[], bool]:
    """Whether a checkpoint file matching ``pattern`` (under the state directory) exists."""
    return lambda: any(True for _ in pathlib.Path(env["state"]).glob(f"checkpoints/{pattern}"))


def _holders(env: dict[str, Any]) -> set[str]:
    """The workers that hold a buffer of the training set now."""
    ds = dvml.datasets.describe("dep_iris", client=env["client"])
    return {b["worker_name"] for b in ds.layout["buffers"]}


def _hyperband(env: dict[str, Any], output: str) -> Callable[[Any], Any]:
    """A Background body: Hyperband R=9 (diagonals train iterations 1, 2..4 and 5..13)."""

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.automl(
                "dep_iris", output, env["arch"], COMPILE_RANGE, FIT, method="hyperband",
                params="R=9, eta=3, skip_last=0", seed=4, validation_set="dep_iris_val",
                progress=True, registry=env["registry"], client=env["client"],
            )  # fmt: skip

    return run


def _fit_multiple(env: dict[str, Any], output: str, rates: Sequence[float]) -> Callable[[Any], Any]:
    """A Background body: an elastic fit_multiple of 6 iterations, one configuration per
    learning rate in ``rates`` (mst_key 1, 2, ...)."""
    configs = [
        {"mst_key": k, "model_id": env["arch"], "fit_params": "batch_size=8, epochs=2",
         "compile_params": f"loss='categorical_crossentropy', optimizer='Adam(learning_rate="
                           f"{lr})', metrics=['accuracy']"}
        for k, lr in enumerate(rates, start=1)
    ]  # fmt: skip

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.fit_multiple(
                "dep_iris", output, configs, num_iterations=6, validation_set="dep_iris_val",
                elastic=True, progress=True, registry=env["registry"], client=env["client"],
            )  # fmt: skip

    return run


def _journal(env: dict[str, Any], output: str) -> j.Journal | None:
    try:
        summary = env["registry"].model_selection_run(output)["summary"]
    except dvml.exceptions.RegistryNotFoundError:
        return None
    return j.Journal.loads(summary["journal"])


def _decisions(env: dict[str, Any], output: str, kind: type) -> list[Any]:
    journal = _journal(env, output)
    return [] if journal is None else [d for _, d in journal.pairs() if isinstance(d, kind)]


def _events(env: dict[str, Any], output: str, kind: type) -> list[Any]:
    journal = _journal(env, output)
    return [] if journal is None else [e for e, _ in journal.pairs() if isinstance(e, kind)]


def test_asha_goes_on_without_a_departed_worker(env: dict[str, Any]) -> None:
    """Killed once a model is parked: the departure is journaled within the bound, the jobs
    it interrupted are queued again (from a checkpoint, or from scratch before any), and every
    later job runs on worker-0; the search finishes with every configuration in .info."""

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.automl(
                "dep_iris", "dep_asha", env["arch"], COMPILE, FIT, method="asha",
                params="max_t=9, eta=3, grace_period=1, max_configs=6", seed=3,
                validation_set="dep_iris_val", progress=True, registry=env["registry"],
                client=env["client"],
            )  # fmt: skip

    search = Background(run)
    assert poll_for(lambda: search.done() or bool(_decisions(env, "dep_asha", j.Park)), 300), (
        search.outcome
    )
    assert not search.done(), search.outcome
    killed = _kill_worker_1(env)
    assert poll_for(lambda: bool(_events(env, "dep_asha", j.Departed)), BOUND_S), (
        f"no departure journaled within {BOUND_S:.0f}s",
        search.outcome,
        search.stack(),
    )
    noticed = time.monotonic() - killed
    result = search.result(600)
    summary = result.summary
    info = result.info.set_index("mst_key")
    context = (summary["journal"][-3000:], info[["status", "rung", "iterations"]])
    assert summary["status"] == "finished" and summary["departed"] == ["worker-1"], context
    # worker-1's rows were copied off its vineyardd onto worker-0 for the rest of the search
    # (main went on with worker-0's own rows only)
    assert summary["repinned_rows"] == 60 and summary["rows_left_out"] == 0, summary
    assert _holders(env) == {"worker-0"}
    journal = j.Journal.loads(summary["journal"])
    pairs = list(journal.pairs())
    at = next(n for n, (e, _) in enumerate(pairs) if isinstance(e, j.Departed))
    event, queued = pairs[at]
    assert event.workers == ["worker-1"] and queued == j.Queued(event.requeue)
    later = [d for _, d in pairs[at + 1 :] if isinstance(d, j.Start | j.Promote)]
    assert later and all(d.worker == "worker-0" for d in later), (later, context)
    # each job that was in flight was given out again (or failed: its state had gone)
    retried = {d.trial_id for d in later if d.retry}
    assert set(event.requeue) <= retried, context
    assert list(info.index) == list(range(1, 7)), context
    kept = info[info["status"] != "failed"]
    assert set(kept["status"]) <= {"parked", "finished"} and len(kept) >= 5, context
    assert summary["best_mst_key"] in set(kept.index), context
    models = set(env["registry"].list_models()["name"])
    assert {f"dep_asha_{k}" for k in kept.index} <= models
    print(f"departure noticed and journaled {noticed:.1f}s after the kill")


def test_hyperband_goes_on_without_a_departed_worker(env: dict[str, Any]) -> None:
    """Killed during the last diagonal: the diagonal goes on on worker-0 from the last
    iteration all of its configurations checkpointed (else from the states they began it
    with); MADlib's .info is whole (15 configurations, each one's metrics_iters as without the
    departure) and every configuration is registered. A configuration carried into the last
    diagonal whose state and checkpoints were all on worker-1 is failed (summary["failed"]);
    whether Dask still held a copy of its state on worker-0 at the kill varies from run to run
    (its evaluation copied it there; the active memory manager drops such copies)."""
    search = Background(_hyperband(env, "dep_hb"))
    last_diagonal = _checkpointed(env, "dep_hb-hop-*/*-5.npz.json")
    assert poll_for(lambda: search.done() or last_diagonal(), 300), search.outcome
    assert not search.done(), search.outcome
    _kill_worker_1(env)
    result = search.result(600)
    summary = result.summary
    assert summary["departed"] == ["worker-1"]
    # worker-1's rows were copied off its vineyardd onto worker-0 for the rest of the search
    assert summary["repinned_rows"] > 0 and summary["rows_left_out"] == 0, summary
    assert summary["departed_at_iterations"]["worker-1"] >= 5, summary  # the last diagonal
    assert _holders(env) == {"worker-0"}
    info = result.info.set_index("mst_key")
    assert list(info.index) == list(range(1, 16))
    # MADlib's schedule as without the departure: bracket 2 (keys 1..9), 1 (10..12), 0 (13..15)
    assert list(info["s"]) == [2] * 9 + [1] * 3 + [0] * 3
    # bracket 2: 6 dropped after [1], 2 after [1, 4], 1 to [1, 4, 13]; bracket 1: 2 after [4],
    # 1 to [4, 13]; bracket 0: 3 at [13]. A configuration whose state and checkpoints were all
    # on worker-1 is failed (one that had stopped keeps its metrics; one carried into the last
    # diagonal stops where the diagonal began); bracket 0's start in the client's memory.
    (top,) = info.index[info["i"] == 2]
    (second,) = info.index[(info["s"] == 1) & (info["i"] == 1)]
    failed = set(summary["failed"])
    assert failed <= set(range(1, 13)), failed
    expected = {top: [1, 4, 13], second: [4, 13]}
    for k, iters in expected.items():
        assert info.loc[k, "metrics_iters"] == (iters[:-1] if k in failed else iters), k
    for k in range(13, 16):  # bracket 0 starts in the last diagonal: one evaluation, at 13
        assert info.loc[k, "metrics_iters"] == [13]
    dropped = sorted(len(m) for k, m in info["metrics_iters"].items() if k not in expected)
    assert dropped == [1] * 11 + [2] * 2, dropped  # bracket 2: 6 + 2, bracket 1: 2, bracket 0: 3
    models = set(env["registry"].list_models()["name"])
    assert {f"dep_hb_{k}" for k in range(1, 16)} <= models


def test_hyperband_goes_on_without_a_worker_whose_trainer_died(env: dict[str, Any]) -> None:
    """worker-1's trainer SIGKILLed during the second diagonal while the worker stays: the
    search leaves worker-1 out as it would a departed worker, its rows copied onto worker-0,
    and finishes with every configuration (main: the search stopped with a
    TrainerFailedError)."""
    search = Background(_hyperband(env, "dep_hbk"))
    second_diagonal = _checkpointed(env, "dep_hbk-hop-*/*-2.npz.json")
    assert poll_for(lambda: search.done() or second_diagonal(), 300), search.outcome
    _kill_trainer_of_worker_1(env, "dep_hbk", search)
    result = search.result(600)
    summary = result.summary
    assert summary["departed"] == ["worker-1"], summary
    assert summary["repinned_rows"] > 0 and summary["rows_left_out"] == 0, summary
    assert _holders(env) == {"worker-0"}
    info = result.info.set_index("mst_key")
    assert list(info.index) == list(range(1, 16))
    assert list(info["s"]) == [2] * 9 + [1] * 3 + [0] * 3
    for k in range(13, 16):  # bracket 0, after the kill: trained whole on worker-0
        assert info.loc[k, "metrics_iters"] == [13], k
    models = set(env["registry"].list_models()["name"])
    assert {f"dep_hbk_{k}" for k in range(1, 16) if k not in summary["failed"]} <= models


def test_an_elastic_fit_multiple_goes_on_without_a_departed_worker(env: dict[str, Any]) -> None:
    """Killed once a model has checkpointed iteration 2: every model resumes from its own last
    checkpoint kept on worker-0 (or from its start) and trains every remaining iteration there;
    the summary names worker-1 and the first iteration trained without it, and every
    configuration is registered with MADlib's metrics at the last iteration."""
    job = Background(_fit_multiple(env, "dep_mop", (0.003, 0.01, 0.03)))
    checkpointed = _checkpointed(env, "dep_mop-mop-*/*-2.npz.json")
    assert poll_for(lambda: job.done() or checkpointed(), 300), job.outcome
    assert not job.done(), job.outcome
    _kill_worker_1(env)
    selection = job.result(600)
    summary = selection.summary
    assert summary["departed"] == ["worker-1"], summary
    first = summary["departed_at_iterations"]["worker-1"]
    # 6 iterations, so that the kill (once iteration 2 is checkpointed) lands before the last
    # hop: with 4, a check on the idle machine found the departure only after every iteration
    assert 1 <= first <= 6, summary
    # a model's checkpoints are on the worker of its last hop of each iteration: those on
    # worker-0 resumed from them (MOP's rotation puts models 1 and 3 there)
    assert max(summary["resumed_from_iterations"]) >= 1, summary
    after = [(k, it, w) for k, it, w in summary["hop_workers"] if it >= first]
    assert after and all(w == "worker-0" for _, _, w in after), summary["hop_workers"]
    info = selection.info.set_index("mst_key")
    assert list(info.index) == [1, 2, 3]
    assert all(list(m) == [6] for m in info["metrics_iters"]), info["metrics_iters"]
    models = set(env["registry"].list_models()["name"])
    assert {"dep_mop_1", "dep_mop_2", "dep_mop_3"} <= models


def test_an_elastic_fit_multiple_goes_on_without_a_worker_whose_trainer_died(
    env: dict[str, Any],
) -> None:
    """worker-1's trainer SIGKILLed once a model has checkpointed iteration 2, the worker
    staying: the job leaves worker-1 out as it would a departed worker, its rows copied onto
    worker-0, and every model trains every iteration on every row (main: the job stopped
    with a TrainerFailedError)."""
    job = Background(_fit_multiple(env, "dep_mopk", (0.003, 0.01)))
    checkpointed = _checkpointed(env, "dep_mopk-mop-*/*-2.npz.json")
    assert poll_for(lambda: job.done() or checkpointed(), 300), job.outcome
    _kill_trainer_of_worker_1(env, "dep_mopk", job)
    selection = job.result(600)
    summary = selection.summary
    assert summary["departed"] == ["worker-1"], summary
    assert summary["repinned_rows"] > 0 and summary["rows_left_out"] == 0, summary
    first = summary["departed_at_iterations"]["worker-1"]
    after = [(k, it, w) for k, it, w in summary["hop_workers"] if it >= first]
    assert after and all(w == "worker-0" for _, _, w in after), summary["hop_workers"]
    info = selection.info.set_index("mst_key")
    assert all(list(m) == [6] for m in info["metrics_iters"]), info["metrics_iters"]
    # every model trained all 120 rows in every iteration, before the kill and after it
    for k, rows in info["rows_per_epoch"].items():
        assert [r for _, r in rows] == [120] * 6, (k, rows)
