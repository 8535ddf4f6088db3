"""dvml.evaluate and dvml.predict run in the runtime's TensorFlow processes, never in a Dask worker.

One fresh LocalCluster (its workers have never imported TensorFlow), one small fit, then
evaluate and every kind of predict: no Dask worker imports TensorFlow and no worker's memory
grows by its size; evaluate's figures are those of a plain tf-keras evaluate of the same
weights on the same rows; evaluate right after the fit runs in the fit's own trainers (no
new process, no TensorFlow import); consecutive calls reuse one session per worker; a model
that cannot run on the rows fails the call, not the session; sessions stop with their client
and when unused.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pandas as pd
import psutil
import pytest

import dvml
from dvml.exceptions import TrainingError
from dvml.train.runtime import sessions
from tests.helpers import cnn, keras, pid_gone, poll_for, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', metrics=['accuracy']"
)
# TensorFlow's import alone adds ~600 MiB to a process; a worker that predicts keeps its
# partitions and results for a while, far less than that.
GROWTH_BOUND = 200 * 2**20


def worker_state(dask_worker: Any = None) -> dict[str, Any]:
    """(On a worker.) Which TensorFlow modules this process imported, and its resident memory."""
    loaded = [m for m in ("tensorflow", "tf_keras", "keras") if m in sys.modules]
    return {"tf": loaded, "rss": psutil.Process().memory_info().rss}


def session_job(pid: int) -> dict[str, Any]:
    """The job file of an inference session's trainer (in its working directory)."""
    with open(os.path.join(psutil.Process(pid).cwd(), "job.json")) as f:
        job: dict[str, Any] = json.load(f)
    return job


def session_pids(client: Any, client_id: str | None = None) -> dict[str, int | None]:
    return client.run(sessions.inference_pid, client_id or client.id)


@pytest.fixture(scope="module")
def job(tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """A fresh 2-worker cluster, digits packed, the CNN fitted for one iteration."""
    from sklearn.datasets import load_digits

    tmp = tmp_path_factory.mktemp("inference")
    d = load_digits()
    frame = pd.DataFrame(
        {
            "id": np.arange(len(d.target)),
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target,
        }
    ).sample(frac=1.0, random_state=0)
    train, test = frame.iloc[:1400], frame.iloc[1400:].reset_index(drop=True)
    with (
        dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}),
        running_cluster(n_workers=2, vineyard_memory="128MiB") as cluster,
    ):
        client = cluster.client
        dvml.training_preprocessor(
            train, y="label", x="pixels", normalizing_const=16.0, name="inf_digits",
            client=client,
        )  # fmt: skip
        dvml.validation_preprocessor(
            test, y="label", x="pixels", training="inf_digits", name="inf_digits_val",
            client=client,
        )  # fmt: skip
        before = client.run(worker_state)
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        try:
            arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
            model = dvml.fit(
                "inf_digits", "inf_cnn", arch, COMPILE, "batch_size=64, epochs=1",
                num_iterations=1, progress=False, registry=registry, client=client,
            )  # fmt: skip
            evaluated = dvml.evaluate("inf_cnn", "inf_digits_val", registry=registry,
                                      client=client)  # fmt: skip
            after_evaluate = session_pids(client)
            yield {
                "cluster": cluster, "client": client, "registry": registry, "arch": arch,
                "model": model, "test": test, "before": before, "evaluated": evaluated,
                "after_evaluate": after_evaluate, "tmp": tmp,
            }  # fmt: skip
        finally:
            registry.close()


def test_evaluate_right_after_a_fit_runs_in_the_fits_own_trainers(job: dict[str, Any]) -> None:
    pids = job["after_evaluate"]
    assert len(pids) == 2 and all(pids.values()), pids
    for pid in pids.values():
        assert pid is not None
        served = session_job(pid)
        # The trainer of the fit that just ended: no new process, no TensorFlow import.
        assert served["adopted_from"], served  # the fit's job key
        assert served["inference"] == job["client"].id


def test_no_dask_worker_imports_tensorflow(job: dict[str, Any], tmp_path: Any) -> None:
    client, registry, test = job["client"], job["registry"], job["test"]
    top1 = dvml.predict("inf_cnn", test, "id", "pixels", registry=registry, client=client)
    top1 = top1.compute(scheduler=client)
    assert sorted(top1["id"]) == sorted(test["id"])
    accuracy = (top1.merge(test, on="id").eval("class_value == label")).mean()
    assert accuracy == pytest.approx(job["evaluated"]["metric"], abs=1e-6)  # float32
    # A Dask DataFrame stays partition-parallel: one task per partition, on the workers.
    parts = dd_from(test, 4)
    probs = dvml.predict("inf_cnn", parts, "id", "pixels", pred_type="prob", registry=registry,
                         client=client).compute(scheduler=client)  # fmt: skip
    sums = probs.groupby("id")["prob"].sum()
    assert len(sums) == len(test) and np.allclose(sums, 1.0, atol=1e-5)
    byom_arch = dvml.load_keras_model(cnn().to_json(), weights=job["model"].weights(),
                                      name="byom_cnn", registry=registry)  # fmt: skip
    byom = dvml.predict_byom(
        byom_arch, test, "id", "pixels", normalizing_const=16.0, registry=registry, client=client
    ).compute(scheduler=client)
    same = top1.merge(byom, on="id", suffixes=("", "_byom"))
    assert (same["class_value"] == same["class_value_byom"].astype(same["class_value"].dtype)).all()
    # Image files: 40 of the rows as 8x8 grayscale PNGs in class folders, read by the workers.
    images = write_images(test.iloc[:40], tmp_path / "images")
    from_files = dvml.predict_byom(
        byom_arch, str(tmp_path / "images"), normalizing_const=16.0, registry=registry,
        client=client,
    ).compute(scheduler=client)  # fmt: skip
    by_id = top1.set_index("id")["class_value"]
    got = {images[os.path.basename(str(p))]: int(v)
           for p, v in zip(from_files["id"], from_files["class_value"], strict=True)}  # fmt: skip
    assert got == {i: int(by_id[i]) for i in test["id"].iloc[:40]}

    assert all(state["tf"] == [] for state in job["before"].values()), job["before"]
    now = client.run(worker_state)
    for address, state in now.items():
        assert state["tf"] == [], f"worker {address} imported {state['tf']}"
        grown = state["rss"] - job["before"][address]["rss"]
        assert grown < GROWTH_BOUND, f"worker {address} grew by {grown / 2**20:.0f} MiB"
    # Consecutive calls of one client reuse its session on each worker.
    assert session_pids(client) == job["after_evaluate"]


def write_images(rows: pd.DataFrame, root: Any) -> dict[str, int]:
    """The rows' pixels (0..16) as 8-bit grayscale PNG files in class folders; file -> id."""
    from PIL import Image

    names = {}
    for row in rows.itertuples():
        folder = root / str(row.label)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"digit-{row.id}.png"
        Image.fromarray(np.asarray(row.pixels)[:, :, 0].astype(np.uint8), mode="L").save(
            folder / name
        )
        names[name] = int(row.id)
    return names


def dd_from(frame: pd.DataFrame, n: int) -> Any:
    import dask.dataframe as dd

    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(frame, npartitions=n)


def test_evaluate_equals_a_plain_tf_keras_evaluate(job: dict[str, Any]) -> None:
    test = job["test"]
    k = keras()
    plain = k.models.model_from_json(cnn().to_json())
    plain.set_weights(job["model"].weights())
    plain.compile(loss="categorical_crossentropy", metrics=["accuracy"])
    x = np.stack(test["pixels"].to_list()) / np.float32(16.0)
    y = k.utils.to_categorical(test["label"], 10)
    expected = plain.evaluate(x, y, batch_size=len(test), verbose=0, return_dict=True)
    evaluated = job["evaluated"]
    assert evaluated["rows"] == len(test)
    assert evaluated["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert evaluated["metric"] == pytest.approx(expected["accuracy"], abs=1e-6)


def test_a_model_that_cannot_run_fails_the_call_not_the_session(job: dict[str, Any]) -> None:
    client, registry, test = job["client"], job["registry"], job["test"]
    # A model for 8x8x3 images, given the 8x8x1 digits: Keras refuses inside the session.
    rgb = cnn(input_shape=(8, 8, 3))
    wrong = dvml.load_keras_model(rgb.to_json(), weights=rgb.get_weights(), name="wrong_cnn",
                                  registry=registry)  # fmt: skip
    with pytest.raises(TrainingError, match="could not run the model: ValueError") as caught:
        dvml.predict_byom(wrong, test, "id", "pixels", registry=registry,
                          client=client).compute(scheduler=client)  # fmt: skip
    # the model's error, not a trainer that failed or was stopped (those are subclasses)
    assert type(caught.value) is TrainingError, repr(caught.value)
    assert "inference trainer on worker" in str(caught.value)
    assert session_pids(client) == job["after_evaluate"]  # the sessions serve on
    again = dvml.evaluate("inf_cnn", "inf_digits_val", registry=registry, client=client)
    assert again["loss"] == pytest.approx(job["evaluated"]["loss"], rel=1e-6)


def test_sessions_stop_with_their_client_and_when_unused(job: dict[str, Any]) -> None:
    from distributed import Client

    cluster, registry = job["cluster"], job["registry"]
    second: dict[str, int | None] = {}
    with dask.config.set({"dvml.train.inference-idle-timeout": 3}):
        other = Client(cluster.scheduler_address, security=cluster.security, set_as_default=False)
        try:
            dvml.evaluate("inf_cnn", "inf_digits_val", registry=registry, client=other)
            first = session_pids(job["client"], other.id)
            assert all(first.values()), first
            # A session the client's own fit did not leave: the worker's standby, or fresh.
            for pid in first.values():
                assert pid is not None and session_job(pid)["inference"] == other.id
            # Unused for 3 s: stopped (checked every 2 s), its memory returned.
            assert poll_for(lambda: all(pid_gone(p) for p in first.values() if p), 30)
            assert not any(session_pids(job["client"], other.id).values())
            # The next call starts another one.
            again = dvml.evaluate("inf_cnn", "inf_digits_val", registry=registry, client=other)
            assert again["loss"] == pytest.approx(job["evaluated"]["loss"], rel=1e-6)
            second = session_pids(job["client"], other.id)
            assert all(second.values()) and set(second.values()).isdisjoint(first.values())
        finally:
            other.close()
    # Its client is gone: stopped within the lease's bound (a disconnect is seen at once).
    assert poll_for(lambda: all(pid_gone(p) for p in second.values() if p), 30)
    # The sessions of the module's client were not touched.
    assert session_pids(job["client"]) == job["after_evaluate"]
