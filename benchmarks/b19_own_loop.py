"""B19: your own training loop, ``dvml.run`` vs Ray Train's ``TensorflowTrainer`` + Ray Data.

The same custom loop on both sides: a ``tf.function`` step with a ``GradientTape`` under
``MultiWorkerMirroredStrategy`` on 2 workers of one CPU each, ``strategy.run`` per batch, the
digits CNN (:func:`dvml.examples.digits_cnn_json`), Adam(0.003), global batch 256. Data: B4's
shifted, noisy digits (20 copies: 28,760 rows, 4 epochs; ``--quick``: 4 copies, 2 epochs),
given to each side as a pandas frame with one 8x8x1 image per row.

Each side runs as a FRESH process (:mod:`benchmarks._peers`), and its figure is the time from
its spawn to the trained model:

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

Without the Ray environment both rows are skipped (:class:`benchmarks.harness.Skipped`),
with the command that installs it.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
from typing import Any

from benchmarks import _peers
from benchmarks.harness import Benchmark, register

SIZES = {False: (20, 4), True: (4, 2)}  # quick -> (copies of the 1797 digits, epochs)
BATCH, WORKERS = 256, 2
TRAIN = "bench_b19_digits"


def prepare(quick: bool) -> dict[str, Any]:
    copies, epochs = SIZES[quick]
    context: dict[str, Any] = {"python": _peers.ray_python(),
                               "directory": tempfile.mkdtemp(prefix="dvml-bench-b19-")}  # fmt: skip
    context["rows"] = _peers.write_inputs(context["directory"], copies, epochs, BATCH, WORKERS)
    return context


def _run(context: dict[str, Any], side: str) -> dict[str, Any]:
    directory = context["directory"]
    if side == "dvml":
        command = _peers.dvml_command(__name__, "dvml", directory)
    else:
        command = _peers.ray_command(context["python"], "loop", directory)
    return _peers.run_side(command, directory, side)


def throughput(result: dict[str, Any]) -> float:
    """Samples per second of the chief's loop, all epochs."""
    return float(result["rows_per_epoch"]) * len(result["epoch_s"]) / float(result["training_s"])


def _figure(context: dict[str, Any], row: str, side: str) -> float:
    result = _peers.take(context, row, side, functools.partial(_run, context, side))
    return float(result["to_model_s"]) if row == "B19a" else throughput(result)


def details(context: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": context["rows"]}
    for side, runs in context.get("runs", {}).items():
        out[f"{side}: to trained model s (median)"] = round(
            statistics.median(r["to_model_s"] for r in runs), 2
        )
        out[f"{side}: training s (median)"] = round(
            statistics.median(r["training_s"] for r in runs), 3
        )
        last = runs[-1]
        out[f"{side}: phases (s since spawn, last run)"] = last["phases"]
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
    since = _peers.since_spawn()
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
            frame,
            y="label",
            x="pixels",
            normalizing_const=16.0,
            name=TRAIN,
            overwrite=True,
            client=cluster.client,
        )
        phases["ingest"] = since()
        registry = dvml.Registry(f"sqlite:///{directory}/registry.db")
        result = dvml.run(
            _dvml_train_fn,
            train,
            {"model_json": job["model_json"], "epochs": job["epochs"]},
            batch_size=BATCH,
            resume=False,
            progress=False,
            registry=registry,
            client=cluster.client,
            name="b19",
        )
        phases["model"] = since()  # trained
        out = dict(result.value)
    phases["cluster closed"] = since()
    out["phases"] = phases
    with open(os.path.join(directory, "result-dvml.json"), "w") as f:
        json.dump(out, f)
    return 0


def _register(key: str, title: str, unit: str, target: float, op: str) -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=title,
            unit=unit,
            target=target,
            target_op=op,
            dvml=functools.partial(_figure, row=key, side="dvml"),
            baseline=functools.partial(_figure, row=key, side="ray"),
            prepare=prepare,
            cleanup=_peers.cleanup,
            details=details,
        )
    )


B19A = _register("B19a", "own loop (dvml.run), whole job wall vs Ray Train + Ray Data", "s",
                 0.5, "<=")  # fmt: skip
B19B = _register("B19b", "own loop, training throughput vs Ray Train + Ray Data", "samples/s",
                 1.0, ">=")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "dvml":
        sys.exit("usage: python -m benchmarks.b19_own_loop dvml DIR")
    sys.exit(dvml_job(sys.argv[2]))
