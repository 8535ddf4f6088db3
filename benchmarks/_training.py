"""Helpers shared by the training-side benchmarks (B1, B3, B4, B7): clusters, datasets, processes.

A synthetic dataset here is what a preprocessor would pack: ``x_0`` (float32 features) and
``y`` (one-hot float32 labels), put into ONE worker's vineyardd with dvml's own
:func:`dvml.store.tensors.put_arrays` and published with :func:`dvml.store.catalog.publish`, the
same two calls a pack task makes. Building it this way skips the preprocessing graph, so a
1 GiB buffer is ready in seconds; the stored objects and the catalog entry are identical to
what :func:`dvml.training_preprocessor` writes. The arrays are a pure function of
``(rows, features, classes, seed)``, so a baseline regenerates the very same bytes in its own
process.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    import dvml

__all__ = [
    "FEATURES",
    "ROOT",
    "ROW_BYTES",
    "MiB",
    "drop_dataset",
    "publish_synthetic",
    "rows_for_bytes",
    "start_cluster",
    "stop_process",
    "synthetic_arrays",
    "tf_child_env",
    "worker_socket",
]

MiB = 1 << 20
ROOT = pathlib.Path(__file__).resolve().parents[1]  # cwd of the subprocesses (python -m)

# 246 float32 features + 10 one-hot float32 labels: exactly 1 KiB per row.
FEATURES, CLASSES = 246, 10
ROW_BYTES = 4 * (FEATURES + CLASSES)


def rows_for_bytes(nbytes: int, features: int = FEATURES, classes: int = CLASSES) -> int:
    """Rows whose ``x_0`` and ``y`` together take ``nbytes`` (rounded down)."""
    return max(1, nbytes // (4 * (features + classes)))


def synthetic_arrays(
    rows: int, features: int = FEATURES, classes: int = CLASSES, seed: int = 0
) -> dict[str, np.ndarray]:
    """``{"x_0": float32 (rows, features) in [0, 1), "y": one-hot float32 (rows, classes)}``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.random((rows, features), dtype=np.float32)
    y = np.zeros((rows, classes), dtype=np.float32)
    y[np.arange(rows), rng.integers(0, classes, rows)] = 1.0
    return {"x_0": x, "y": y}


def _put_and_publish(name: str, rows: int, features: int, classes: int, seed: int) -> dict:
    """Worker task: put one buffer into THIS worker's vineyardd and publish it as ``name``."""
    from distributed import get_worker

    from dvml.store import catalog
    from dvml.store.tensors import put_arrays

    arrays = synthetic_arrays(rows, features, classes, seed)
    record = put_arrays(arrays)
    del arrays  # the worker keeps no copy: the only one is in vineyard
    worker = get_worker()
    buffer = {
        "index": 0,
        "rows": rows,
        "instance_id": record["instance_id"],
        "worker": worker.address,
        "worker_name": str(worker.name),
        "host": os.environ.get("DVML_HOST") or worker.address,
        "fields": record["fields"],
    }
    layout = {
        "fields": {k: {"shape": v["shape"]} for k, v in record["fields"].items()},
        "buffers": [buffer],
    }
    summary = {
        "kind": "training",
        "x_shapes": [[features]],
        "y_shape": [classes],
        "rows": rows,
        "class_values": list(range(classes)),
        "num_classes": classes,
        "normalizing_const": 1.0,
        "source_table": f"benchmarks: synthetic, seed {seed}",
    }
    catalog.publish(name, "dataset", summary, layout, True)
    return layout


def start_cluster(n_workers: int, vineyard_memory: int) -> dvml.LocalCluster:
    """A LocalCluster that is not the default client (the benchmarks pass it explicitly)."""
    import dvml

    return dvml.LocalCluster(
        n_workers=n_workers, vineyard_memory=int(vineyard_memory), dashboard_address="127.0.0.1:0",
        set_as_default=False,
    )  # fmt: skip


def worker_socket(cluster: dvml.LocalCluster, index: int = 0) -> str:
    """The vineyard IPC socket of worker ``index``: a trainer there sets VINEYARD_IPC_SOCKET."""
    return str(cluster.worker_table()["vineyard_socket"].iloc[index])


def publish_synthetic(
    cluster: dvml.LocalCluster,
    name: str,
    rows: int,
    features: int = FEATURES,
    classes: int = CLASSES,
    seed: int = 0,
    worker: int = 0,
) -> dict[str, Any]:
    """Put a synthetic one-buffer dataset on worker ``worker`` and name it; return its layout."""
    address = str(cluster.worker_table()["address"].iloc[worker])
    future = cluster.client.submit(
        _put_and_publish, name, rows, features, classes, seed,
        workers=[address], allow_other_workers=False, pure=False,
    )  # fmt: skip
    return dict(future.result())


def drop_dataset(cluster: dvml.LocalCluster, name: str) -> None:
    """Free a dataset's vineyard memory; a missing one is fine (cleanup after a failure)."""
    import dvml
    from dvml.exceptions import DatasetNotFoundError

    try:
        dvml.datasets.drop(name, client=cluster.client)
    except DatasetNotFoundError:
        pass


def close_context(context: dict[str, Any], datasets: tuple[str, ...]) -> None:
    """A model benchmark's cleanup: drop ``datasets`` and close the cluster (when ``prepare``
    got that far), close the registry and remove the context's directory."""
    cluster = context.get("cluster")
    if cluster is not None:
        for name in datasets:
            drop_dataset(cluster, name)
        cluster.close()
    if context.get("registry") is not None:
        context["registry"].close()
    shutil.rmtree(context["directory"], ignore_errors=True)


def tf_child_env() -> dict[str, str]:
    """The environment of a TensorFlow child process of a benchmark (a plain runner): CPU
    only, tf-keras, quiet, and a temporary directory of its own, removed when this process
    exits (TensorFlow's autograph modules stay behind in a child stopped by a signal)."""
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="dvml-bench-tmp-")
    atexit.register(shutil.rmtree, tmp, True)
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
                CUDA_VISIBLE_DEVICES="-1", TMPDIR=tmp)  # fmt: skip


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Stop a child this benchmark started, by its pid: SIGTERM, then SIGKILL; always reap."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
        except ProcessLookupError:
            pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
