"""A fit_multiple rerun after a killed Dask worker (issue 42, items 2 and 7), on a real 2-worker
LocalCluster of each test's own with real TensorFlow hop trainers.

The same kill (SIGKILL of worker-1's Dask worker process; its Nanny brings it back) at several
moments of a job. Whatever the moment, the rerun resumes EACH model from its own last
checkpoint on disk (not from the last iteration every model completed: models checkpoint in
bursts, and one lagging model used to send every model back to the start), and ends with the
weights and the per-iteration history an uninterrupted run of the same call gives: weights
and optimizer state are restored, and every hop runs on the worker it would have had.
"""

from __future__ import annotations

import os
import pathlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import RegistryNotFoundError, TrainerFailedError
from tests.helpers import Background, cnn, pid_gone, poll_for, worker_trainers

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

ITERATIONS = 6  # a kill at a model's third iteration still comes well before the end
KEYS = [1, 2, 3]


def _configs(arch: int) -> pd.DataFrame:
    # 3 models on 2 workers: a worker trains two models in some rounds, so the models drift
    # apart; Adam, so that a resume without the optimizer's state would not match
    return pd.DataFrame(
        [
            {
                "mst_key": k,
                "model_id": arch,
                "compile_params": (
                    "loss='categorical_crossentropy',"
                    f"optimizer='Adam(learning_rate={lr})',metrics=['accuracy']"
                ),
                "fit_params": "batch_size=32,epochs=1",
            }
            for k, lr in zip(KEYS, (0.003, 0.01, 0.001), strict=True)
        ]
    )


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The uninterrupted run's per-model losses and weights, filled by the first test (on its
    own cluster: a killed worker comes back as a new process, which a cluster shared across
    tests would count as leaked)."""
    return {}


@pytest.fixture
def env(local_cluster: Any, tmp_path: Any, reference: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {"pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")), "label": d.target}
    )
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    client = cluster.client
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name="mopr", client=client
        )
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        out = {"cluster": cluster, "registry": registry, "table": _configs(arch)}
        out.update(state=tmp_path / "state")
        if not reference:  # the uninterrupted run every resumed one must match
            ref = _fit(out, "mopr_ref")
            for k in KEYS:
                model = ref.model(k)
                reference[k] = (model.history()["training_loss"].tolist(), model.weights())
            reference["hop_workers"] = {tuple(h) for h in ref.summary["hop_workers"]}
        yield out
        dvml.datasets.drop("mopr", client=client)
    registry.close()


def _fit(env: dict[str, Any], output: str) -> dvml.ModelSelection:
    return dvml.fit_multiple(
        "mopr", output, env["table"], num_iterations=ITERATIONS, metrics_compute_frequency=1,
        progress=False, registry=env["registry"], client=env["cluster"].client,
    )  # fmt: skip


def _files(state: pathlib.Path, output: str) -> set[str]:
    return {p.name for p in state.glob(f"checkpoints/{output}-mop-*/*")}


def kept_points(files: set[str]) -> dict[int, int]:
    """Each model's last checkpoint on disk a rerun can resume from: its state is kept and
    the records of every iteration up to it are (they are written in order)."""
    points = {}
    for k in KEYS:
        last = 0
        while f"{k}-{last + 1}.npz.json" in files:
            last += 1
        points[k] = max((i for i in range(1, last + 1) if f"{k}-{i}.npz" in files), default=0)
    return points


def _iteration(n: int) -> Callable[[set[str]], bool]:
    return lambda files: any(f"{k}-{n}.npz.json" in files for k in KEYS)


MOMENTS = {
    # the trainers run their first hops: no model has checkpointed yet
    "first_hops": lambda files: True,
    # the first checkpoint is written: some models have checkpointed, others not yet
    "first_checkpoint": _iteration(1),
    # a model is at its third iteration: its first state is pruned, others may lag behind
    "a_model_ahead": _iteration(3),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_rerun_after_a_killed_worker_resumes_each_model_from_its_own_checkpoint(
    env: dict[str, Any], reference: dict[str, Any], moment: str
) -> None:
    cluster, registry, state = env["cluster"], env["registry"], env["state"]
    output = f"mopr_{moment}"
    with dask.config.set({"dvml.cluster.state-dir": str(state)}):
        fit = Background(lambda seen: _fit(env, output))
        assert poll_for(
            lambda: (
                fit.done()
                or (
                    len(worker_trainers(cluster, model_output=output)) == 2
                    and MOMENTS[moment](_files(state, output))
                )
            ),
            300,
        ), f"the moment {moment!r} never came"
        trainers = worker_trainers(cluster, model_output=output)
        assert len(trainers) == 2 and not fit.done(), (trainers, fit.outcome)
        os.kill(cluster.processes()["dask worker worker-1"], signal.SIGKILL)
        error = fit.error(180)
        assert isinstance(error, TrainerFailedError), repr(error)
        assert "worker-1" in str(error) and "left the cluster" in str(error), str(error)
        assert poll_for(lambda: all(pid_gone(p) for p in trainers), 60), trainers
        assert not any(registry.model_exists(f"{output}_{k}") for k in KEYS)
        with pytest.raises(RegistryNotFoundError):
            registry.model_selection_run(output)  # nothing of the stopped job registered
        # what the stopped job left on disk (a checkpoint task under way may still finish)
        last: list[set[str] | None] = [None]

        def settled() -> bool:
            now = _files(state, output)
            same, last[0] = now == last[0], now
            return same

        assert poll_for(settled, 30, interval=1.0)
        expected = kept_points(last[0] or set())

        def back() -> bool:
            identity = cluster.client.sync(cluster.client.scheduler.identity, n_workers=-1)
            names = {str(w.get("name")) for w in identity["workers"].values()}
            return {"worker-0", "worker-1"} <= names

        assert poll_for(back, 120), "the Nanny did not bring worker-1 back"
        resumed = _fit(env, output)

    summary = resumed.summary
    assert summary["resumed_from_iterations"] == [expected[k] for k in KEYS], (expected, last)
    assert summary["resumed_from_iteration"] == (
        min(expected.values()) if any(expected.values()) else None
    )
    for k in KEYS:
        model = resumed.model(k)
        ref_loss, ref_weights = reference[k]
        assert model.summary["resumed_from_iteration"] == (expected[k] or None)
        # the history up to the checkpoint came from it, the rest from the rerun: together
        # the uninterrupted run's, iteration by iteration
        history = model.history()
        assert history["iteration"].tolist() == list(range(1, ITERATIONS + 1))
        np.testing.assert_allclose(history["training_loss"], ref_loss, rtol=1e-4, atol=1e-5)
        for got, want in zip(model.weights(), ref_weights, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # every model visited every worker in every iteration, on the uninterrupted run's schedule
    hops = {tuple(h) for h in summary["hop_workers"]}
    assert hops <= reference["hop_workers"]
    # and the rerun trained each model only after its own checkpoint, once per worker
    for k in KEYS:
        trained = sorted(it for m, it, _ in hops if m == k)
        assert trained == sorted(2 * list(range(expected[k] + 1, ITERATIONS + 1))), (k, hops)
