"""B3: training throughput (samples/s into ``model.fit``) from vineyard vs three other inputs.

What is measured: samples per second that one tf-keras ``model.fit`` consumes, over
``EPOCHS`` epochs of the same rows, batches of ``BATCH``, reshuffled every epoch. The clock
starts before the input is set up (so a side pays for getting its data) and stops when fit
returns; the model (``Dense(64, relu) -> Dense(10, softmax)``, Adam) is rebuilt for every
run and its train function traced beforehand on two batches, so tracing is not counted.

Every side runs in ONE long-lived trainer-like process (``python -m benchmarks.b3_input
runner``), started once per row with ``VINEYARD_IPC_SOCKET`` of worker-0 of a two-worker
LocalCluster, TensorFlow imported once. Sizes: 131072 rows of 32 float32 features and 10
one-hot classes (21 MiB), 5 epochs; ``--quick``: 8192 rows, 1 epoch.

- dvml side: :func:`dvml.resolve.open_local` of a dataset whose buffer is in worker-0's
  vineyardd, then :func:`dvml.resolve.tfdata.training_dataset` (per-epoch shuffle by index;
  one gather per batch from the shared-memory views).

Three rows, one per baseline (target on dvml / baseline, both in samples/s):

- ``B3a``: the same arrays already in the process:
  ``tf.data.Dataset.from_tensor_slices(arrays).shuffle(rows).batch(BATCH)``. Target >= 0.95.
- ``B3b``: the rows as 4 Parquet files read every epoch (pyarrow -> numpy -> tf.data, shuffled
  per epoch). Target >= 1 (dvml faster).
- ``B3c``: a persisted Dask DataFrame on the cluster, ``compute()``\\d into the process, then
  ``from_tensor_slices(...).shuffle(rows).batch(BATCH)``. Target >= 1 (dvml faster).
- ``B3d``: the dvml side reads a dataset in the compact format instead (the features as
  uint8, packed with ``compact=True``: x normalized and y one-hot encoded on the fly by the
  input pipeline's map), against the dvml side of B3a-c (float32 x, one-hot y as stored).
  Target >= 0.95 (decoding on the fly costs no throughput).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benchmarks import _training as t
from benchmarks.harness import Benchmark, register

FEATURES, CLASSES, BATCH, SEED = 32, 10, 128, 0
SIZES = {False: (131072, 5), True: (8192, 1)}  # quick -> (rows, epochs)
PARQUET_FILES = 4
NAME, FRAME = "bench_b3", "bench_b3_frame"
SIDES = ("dvml", "in_process", "parquet", "compute", "compact")
COMPACT = "bench_b3_compact"
PROTOCOL = "B3 "


# -- the benchmark process -------------------------------------------------------------------


def prepare(quick: bool) -> dict[str, Any]:
    """The runner, the cluster and every input, shared by B3a, B3b and B3c."""
    rows, epochs = SIZES[quick]
    # TensorFlow's chatter goes to a file; its tail explains a failure. Closed by cleanup.
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115
    # The runner imports TensorFlow while the cluster starts.
    runner = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.b3_input", "runner"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=t.ROOT,
        env=t.tf_child_env(),
    )  # fmt: skip
    context: dict[str, Any] = {
        "runner": runner, "log": log, "cluster": None,
        "directory": tempfile.mkdtemp(prefix="dvml-bench-b3-"),
    }  # fmt: skip
    try:
        cluster = context["cluster"] = t.start_cluster(2, 64 * t.MiB)
        t.publish_synthetic(cluster, NAME, rows, FEATURES, CLASSES, SEED)
        _publish_compact(cluster, rows)
        _publish_frame(cluster, rows)
        setup = {
            "rows": rows, "epochs": epochs, "dataset": NAME, "socket": t.worker_socket(cluster),
            "compact": COMPACT,
            "parquet": _write_parquet(context["directory"], rows),
            "scheduler": cluster.scheduler_address,
            "tls": cluster.tls_files,  # the runner is another process: it needs the certificate
        }  # fmt: skip
        _ask(context, {"setup": setup})
        for side in SIDES:  # warm-up, not measured: first-use costs of each input
            _ask(context, {"side": side, "epochs": 1})
    except BaseException:
        cleanup(context)
        raise
    return context


def _publish_compact(cluster: Any, rows: int) -> None:
    """The same kind of rows, x as uint8, packed in the compact format into worker-0's
    vineyardd (one buffer, like the float32 dataset)."""
    import numpy as np

    import dvml

    arrays = t.synthetic_arrays(rows, FEATURES, CLASSES, SEED)
    x = (arrays["x_0"] * 256).astype(np.uint8)
    labels = arrays["y"].argmax(axis=1)
    worker = str(cluster.worker_table()["address"].iloc[0])
    dvml.training_preprocessor(
        {"x": x, "y": labels}, y="y", x="x", normalizing_const=255.0, num_classes=CLASSES,
        compact=True, buffer_size=rows, distribution_rules=[worker], name=COMPACT,
        overwrite=True, client=cluster.client,
    )  # fmt: skip


def _frame(rows: int) -> Any:
    """The rows as a table: one float32 column per feature and an integer label."""
    import pandas as pd

    arrays = t.synthetic_arrays(rows, FEATURES, CLASSES, SEED)
    frame = pd.DataFrame(arrays["x_0"], columns=[f"f{i}" for i in range(FEATURES)])
    frame["label"] = arrays["y"].argmax(axis=1)
    return frame


def _write_parquet(directory: str, rows: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame, paths = _frame(rows), []
    step = -(-rows // PARQUET_FILES)
    for i in range(PARQUET_FILES):
        path = os.path.join(directory, f"part-{i}.parquet")
        piece = frame.iloc[i * step : (i + 1) * step]
        pq.write_table(pa.Table.from_pandas(piece, preserve_index=False), path)
        paths.append(path)
    return paths


def _frame_part(rows: int, part: int, parts: int) -> Any:
    """Partition ``part`` of :func:`_frame`, built on the worker (no data in the graph)."""
    step = -(-rows // parts)
    return _frame(rows).iloc[part * step : (part + 1) * step]


def _publish_frame(cluster: Any, rows: int) -> None:
    import dask.dataframe as dd

    ddf = dd.from_map(_frame_part, [rows] * 2, [0, 1], [2, 2], meta=_frame(1).iloc[:0])
    cluster.client.publish_dataset(cluster.client.persist(ddf), name=FRAME, override=True)


def _ask(context: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    runner = context["runner"]
    runner.stdin.write(json.dumps(message) + "\n")
    runner.stdin.flush()
    while True:
        line = runner.stdout.readline()
        if not line:
            context["log"].seek(0)
            tail = context["log"].read()[-2000:]
            raise RuntimeError(f"The B3 runner exited (code {runner.wait(10)}). Its log:\n{tail}")
        if line.startswith(PROTOCOL):
            reply = json.loads(line[len(PROTOCOL) :])
            if "error" in reply:
                raise RuntimeError(f"The B3 runner failed: {reply['error']}")
            return dict(reply)


def cleanup(context: dict[str, Any]) -> None:
    t.stop_process(context["runner"])
    context["log"].close()
    cluster = context["cluster"]
    if cluster is not None:
        try:
            cluster.client.unpublish_dataset(FRAME)
        except KeyError:
            pass
        t.drop_dataset(cluster, NAME)
        t.drop_dataset(cluster, COMPACT)
        cluster.close()
    shutil.rmtree(context["directory"], ignore_errors=True)


def _side(name: str) -> Any:
    def run(context: dict[str, Any]) -> float:
        return float(_ask(context, {"side": name})["samples_per_s"])

    run.__name__ = f"{name}_side"
    return run


# -- the runner process ----------------------------------------------------------------------


class _Runner:
    """The trainer-like process: one TensorFlow, every input pipeline."""

    def __init__(self, setup: dict[str, Any]) -> None:
        import numpy as np
        import tensorflow as tf

        # The runner starts before the cluster does; now it learns its worker's vineyardd.
        os.environ["VINEYARD_IPC_SOCKET"] = setup["socket"]
        self.tf, self.np = tf, np
        self.rows, self.epochs = int(setup["rows"]), int(setup["epochs"])
        self.steps = self.rows // BATCH
        self.setup = setup
        arrays = t.synthetic_arrays(self.rows, FEATURES, CLASSES, SEED)
        self.x, self.y = arrays["x_0"], arrays["y"]
        from distributed import Client

        from dvml.cluster.security import resolve_security

        security = resolve_security(setup.get("tls"), setup["scheduler"])
        self.client = Client(setup["scheduler"], security=security, set_as_default=False)
        # Imports are a process's one-time cost, not part of any input's throughput.
        import pyarrow.parquet  # noqa: F401

        import dvml.resolve.partitions
        import dvml.resolve.tfdata  # noqa: F401

        self.warm = tf.data.Dataset.from_tensor_slices((self.x[: 2 * BATCH], self.y[: 2 * BATCH]))

    def model(self) -> Any:
        import tf_keras as keras

        keras.utils.set_random_seed(SEED)
        model = keras.Sequential(
            [
                keras.layers.InputLayer(input_shape=(FEATURES,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(CLASSES, activation="softmax"),
            ]
        )
        model.compile(optimizer="adam", loss="categorical_crossentropy")
        model.fit(self.warm.batch(BATCH), epochs=1, verbose=0)  # trace train_function now
        return model

    def in_process(self) -> tuple[Any, int | None, Any]:
        ds = self.tf.data.Dataset.from_tensor_slices((self.x, self.y))
        return ds.shuffle(self.rows, seed=SEED).batch(BATCH), None, None

    def dvml(self) -> tuple[Any, int | None, Any]:
        from dvml.resolve.partitions import open_local
        from dvml.resolve.tfdata import training_dataset

        parts = open_local(self.setup["dataset"])
        return training_dataset(parts, BATCH, self.steps, SEED), self.steps, parts.close

    def compact(self) -> tuple[Any, int | None, Any]:
        from dvml.resolve.partitions import open_local
        from dvml.resolve.tfdata import training_dataset

        parts = open_local(self.setup["compact"])
        return training_dataset(parts, BATCH, self.steps, SEED), self.steps, parts.close

    def parquet(self) -> tuple[Any, int | None, Any]:
        import pyarrow.parquet as pq

        np, paths, epoch = self.np, self.setup["parquet"], [0]

        def batches() -> Iterator[tuple[Any, Any]]:
            tables = [pq.read_table(p) for p in paths]  # every epoch: the files again
            x = np.concatenate(
                [np.stack([c.to_numpy() for c in tb.columns[:FEATURES]], axis=1) for tb in tables]
            )
            labels = np.concatenate([tb.column("label").to_numpy() for tb in tables])
            y = np.eye(CLASSES, dtype=np.float32)[labels]
            order = np.random.default_rng([SEED, epoch[0]]).permutation(len(x))
            epoch[0] += 1
            for step in range(len(x) // BATCH):
                rows = order[step * BATCH : (step + 1) * BATCH]
                yield x[rows], y[rows]

        spec = (
            self.tf.TensorSpec((None, FEATURES), self.tf.float32),
            self.tf.TensorSpec((None, CLASSES), self.tf.float32),
        )
        return self.tf.data.Dataset.from_generator(batches, output_signature=spec), None, None

    def compute(self) -> tuple[Any, int | None, Any]:
        np = self.np
        frame = self.client.compute(self.client.get_dataset(FRAME)).result()
        x = frame[[f"f{i}" for i in range(FEATURES)]].to_numpy(np.float32)
        y = np.eye(CLASSES, dtype=np.float32)[frame["label"].to_numpy()]
        ds = self.tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shuffle(len(x), seed=SEED).batch(BATCH), None, None

    def run(self, side: str, epochs: int | None = None) -> dict[str, Any]:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}. Received: side={side!r}.")
        epochs = epochs or self.epochs
        model = self.model()
        start = time.perf_counter()
        dataset, steps, close = getattr(self, side)()
        ready = time.perf_counter()
        model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0)
        end = time.perf_counter()
        if close is not None:
            close()
        samples = epochs * self.steps * BATCH
        return {"samples_per_s": samples / (end - start), "setup_s": ready - start}


def runner() -> int:
    """Serve ``{"setup": ...}`` then ``{"side": ...}`` requests, one JSON line each."""
    import tensorflow  # noqa: F401  (now, while the benchmark process starts the cluster)
    import tf_keras  # noqa: F401

    state: _Runner | None = None
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if "setup" in message:
                state = _Runner(message["setup"])
                reply: dict[str, Any] = {"ready": True}
            elif state is None:
                raise RuntimeError(f"side {message.get('side')!r} asked before setup")
            else:
                reply = state.run(message["side"], message.get("epochs"))
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(PROTOCOL + json.dumps(reply), flush=True)
    return 0


def _register(key: str, baseline: str, title: str, target: float, side: str = "dvml") -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=title,
            unit="samples/s",
            dvml=_side(side),
            baseline=_side(baseline),
            target=target,
            target_op=">=",
            prepare=prepare,
            cleanup=cleanup,
        )
    )


B3A = _register("B3a", "in_process", "samples/s into fit: vineyard vs in-process arrays", 0.95)
B3B = _register("B3b", "parquet", "samples/s into fit: vineyard vs Parquet read per epoch", 1.0)
B3C = _register("B3c", "compute", "samples/s into fit: vineyard vs ddf.compute()", 1.0)
B3D = _register(
    "B3d", "dvml", "samples/s into fit: compact (uint8, indices) vs float32 format", 0.95,
    side="compact",
)  # fmt: skip

if __name__ == "__main__":
    sys.exit(runner())
