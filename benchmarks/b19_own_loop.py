"""B19: your own training loop, ``dvml.run`` vs Ray Train's ``TensorflowTrainer`` + Ray Data.

The same custom loop on both sides: a ``tf.function`` step with a ``GradientTape`` under
``MultiWorkerMirroredStrategy`` on 2 workers of one CPU each, ``strategy.run`` per batch, the
digits CNN (:func:`dvml.examples.digits_cnn_json`), Adam(0.003), global batch 256. Data: B4's
shifted, noisy digits (20 copies: 28,760 rows, 4 epochs; ``--quick``: 4 copies, 2 epochs),
given to each side as a pandas frame with one 8x8x1 image per row.

Each side runs as a FRESH process, and its figure is that process's wall time from start to
trained model (then exit):

- dvml (``python -m benchmarks.b19_own_loop dvml DIR``): a 2-worker :class:`dvml.LocalCluster`
  (TLS, private etcd, the defaults), :func:`dvml.training_preprocessor` of the frame
  (``normalizing_const=16``), :func:`dvml.run` of the loop (``context.distributed_dataset``:
  each trainer's LOCAL rows, zero-copy), then the cluster's close.
- Ray (``benchmarks/ray_peer.py loop DIR`` in Ray's own environment, ``./scripts/peer-ray``):
  ``ray.init``, ``ray.data.from_pandas`` + ``map_batches`` (stack, scale) + ``materialize``,
  ``TensorflowTrainer`` with the loop reading ``get_dataset_shard("train").to_tf(...)`` per
  epoch, then ``ray.shutdown``.

Rows: B19a the whole job's wall time (target <= 0.5x Ray's); B19b training throughput,
samples per second of the chief's loop over all epochs (target >= 1.0x Ray's). B19b takes its
figures from B19a's runs (the same processes, in the same alternating order); only where
B19a did not run (``--only B19b``) does it start its own. Details: each side's phases
(seconds since its process started) and per-epoch times.

Without the Ray environment the rows fail with the command that installs it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import b4_end_to_end as b4
from benchmarks.harness import Benchmark, register

SIZES = {False: (20, 4), True: (4, 2)}  # quick -> (copies of the 1797 digits, epochs)
BATCH, WORKERS = 256, 2
TRAIN = "bench_b19_digits"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ray_python() -> str:
    """The Python of Ray's own environment: ``$DVML_RAY_PYTHON`` or ``.venv-ray``."""
    path = os.environ.get("DVML_RAY_PYTHON") or os.path.join(ROOT, ".venv-ray", "bin", "python")
    if not os.access(path, os.X_OK):
        raise RuntimeError(
            f"The Ray peer is not installed: no executable {path!r}. Run ./scripts/peer-ray "
            "(Ray Train + Ray Data in their own environment, .venv-ray) or set DVML_RAY_PYTHON "
            "to the Python of an environment that has ray[data,train], tensorflow and tf_keras."
        )
    return path


def write_inputs(directory: str, copies: int, epochs: int, mode: str) -> int:
    """The shared inputs of both sides: ``data.npz``, ``valid.npz`` and ``job.json``."""
    import numpy as np

    from dvml.examples import digits_cnn_json

    train, valid = b4.digits_frames(copies)
    for name, frame in (("data", train), ("valid", valid)):
        np.savez(
            os.path.join(directory, f"{name}.npz"),
            x=np.stack(frame["pixels"].to_list()).astype("float32"),
            y=frame["label"].to_numpy().astype("int64"),
        )
    job = {"model_json": digits_cnn_json(), "epochs": epochs, "batch": BATCH // WORKERS,
           "workers": WORKERS, "mode": mode}  # fmt: skip
    with open(os.path.join(directory, "job.json"), "w") as f:
        json.dump(job, f)
    return len(train)


def prepare(quick: bool) -> dict[str, Any]:
    copies, epochs = SIZES[quick]
    context: dict[str, Any] = {
        "python": ray_python(), "directory": tempfile.mkdtemp(prefix="dvml-bench-b19-"),
        "runs": {"dvml": [], "ray": []}, "taken": {"dvml": 0, "ray": 0},
    }  # fmt: skip
    context["rows"] = write_inputs(context["directory"], copies, epochs, "loop")
    return context


def cleanup(context: dict[str, Any]) -> None:
    shutil.rmtree(context["directory"], ignore_errors=True)


def run_side(
    context: dict[str, Any], side: str, mode: str = "loop", dvml_module: str = __name__
) -> dict[str, Any]:
    """Run one side as a fresh process; its result with ``wall_s`` (spawn to exit).

    ``mode`` is the Ray peer's (``loop`` or ``fit``); ``dvml_module`` the module whose
    ``python -m MODULE dvml DIR`` runs dvml's side.
    """
    directory = context["directory"]
    result_path = os.path.join(directory, f"result-{side}.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    if side == "dvml":
        command = [sys.executable, "-m", dvml_module, "dvml", directory]
    else:
        command = [context["python"], os.path.join(ROOT, "benchmarks", "ray_peer.py"), mode,
                   directory]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True,
                          timeout=1800, check=False)  # fmt: skip
    wall = time.perf_counter() - start
    if done.returncode != 0 or not os.path.exists(result_path):
        raise RuntimeError(
            f"The {side} side failed (rc {done.returncode}): {' '.join(command)}. Its output "
            f"ends with: {(done.stdout + done.stderr)[-3000:]}"
        )
    with open(result_path) as f:
        result = dict(json.load(f))
    result["wall_s"] = wall
    return result


def throughput(result: dict[str, Any]) -> float:
    """Samples per second of the chief's loop, all epochs."""
    return float(result["rows_per_epoch"]) * len(result["epoch_s"]) / float(result["training_s"])


def _wall(context: dict[str, Any], side: str) -> float:
    result = run_side(context, side)
    context["runs"][side].append(result)
    return float(result["wall_s"])


def _rate(context: dict[str, Any], side: str) -> float:
    index = context["taken"][side]
    if index < len(context["runs"][side]):  # B19a's run of the same side, in the same order
        context["taken"][side] += 1
        return throughput(context["runs"][side][index])
    result = run_side(context, side)
    context["runs"][side].append(result)
    context["taken"][side] += 1
    return throughput(result)


def details(context: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": context["rows"]}
    for side in ("dvml", "ray"):
        runs = context["runs"][side]
        if not runs:
            continue
        out[f"{side}: wall s (median)"] = round(statistics.median(r["wall_s"] for r in runs), 2)
        out[f"{side}: training s (median)"] = round(
            statistics.median(r["training_s"] for r in runs), 3
        )
        last = runs[-1]
        out[f"{side}: phases (s since process start, last run)"] = last["phases"]
        out[f"{side}: epoch s (last run)"] = [round(s, 3) for s in last["epoch_s"]]
        out[f"{side}: final training loss (last run)"] = round(last["losses"][-1], 4)
    return out


# ---------------------------------------------------------------- the dvml side's process


def _dvml_train_fn(context: Any) -> dict[str, Any]:
    """The custom loop (shipped to the trainers by value)."""
    import time as clock

    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    with context.strategy.scope():
        model = keras.models.model_from_json(context.config["model_json"])
        optimizer = keras.optimizers.Adam(learning_rate=0.003)
        loss_fn = keras.losses.CategoricalCrossentropy(reduction=keras.losses.Reduction.NONE)

    @tf.function
    def step(batch: Any) -> Any:
        x, y = batch
        with tf.GradientTape() as tape:
            per_row = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=context.global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    batches = iter(context.distributed_dataset())
    began = clock.time()
    epoch_seconds, losses = [], []
    for _ in range(int(context.config["epochs"])):
        start, total = clock.time(), 0.0
        for _ in range(context.steps_per_epoch):
            per_replica = context.strategy.run(step, args=(next(batches),))
            total += float(context.strategy.reduce("SUM", per_replica, axis=None))
        epoch_seconds.append(clock.time() - start)
        losses.append(total / context.steps_per_epoch)
    return {
        "training_s": clock.time() - began,
        "epoch_s": epoch_seconds,
        "losses": losses,
        "rows_per_epoch": context.steps_per_epoch * context.global_batch_size,
        "weights_sum": float(sum(float(np.sum(w)) for w in model.get_weights())),
    }


def dvml_job(directory: str) -> int:
    """The dvml side, from a fresh process: cluster, ingest, dvml.run, close."""
    started = time.time()

    def since() -> float:
        return round(time.time() - started, 4)

    import numpy as np
    import pandas as pd

    import dvml

    phases = {"import dvml": since()}
    with open(os.path.join(directory, "job.json")) as f:
        job = json.load(f)
    with dvml.LocalCluster(n_workers=WORKERS, dashboard_address="127.0.0.1:0",
                           set_as_default=False) as cluster:  # fmt: skip
        phases["cluster start"] = since()
        data = np.load(os.path.join(directory, "data.npz"))
        frame = pd.DataFrame({"pixels": list(data["x"]), "label": data["y"]})
        train = dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name=TRAIN, overwrite=True,
            client=cluster.client,
        )  # fmt: skip
        phases["ingest"] = since()
        registry = dvml.Registry(f"sqlite:///{directory}/registry.db")
        result = dvml.run(
            _dvml_train_fn, train, {"model_json": job["model_json"], "epochs": job["epochs"]},
            batch_size=BATCH, resume=False, progress=False, registry=registry,
            client=cluster.client, name="b19",
        )  # fmt: skip
        phases["trained"] = since()
        out = dict(result.value)
    phases["cluster closed"] = since()
    out["phases"] = phases
    with open(os.path.join(directory, "result-dvml.json"), "w") as f:
        json.dump(out, f)
    return 0


def _register(key: str, title: str, unit: str, dvml_side: Any, ray_side: Any, target: float,
              op: str) -> Benchmark:  # fmt: skip
    return register(
        Benchmark(
            key=key,
            title=title,
            unit=unit,
            dvml=dvml_side,
            baseline=ray_side,
            target=target,
            target_op=op,
            prepare=prepare,
            cleanup=cleanup,
            details=details,
        )
    )


B19A = _register(
    "B19a", "own loop (dvml.run) whole job wall vs Ray Train + Ray Data", "s",
    functools.partial(_wall, side="dvml"), functools.partial(_wall, side="ray"), 0.5, "<=",
)  # fmt: skip
B19B = _register(
    "B19b", "own loop training throughput vs Ray Train + Ray Data", "samples/s",
    functools.partial(_rate, side="dvml"), functools.partial(_rate, side="ray"), 1.0, ">=",
)  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "dvml":
        sys.exit("usage: python -m benchmarks.b19_own_loop dvml DIR")
    sys.exit(dvml_job(sys.argv[2]))
