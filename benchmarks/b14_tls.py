"""B14: what Dask TLS (the default since issue 16) costs a pack and a fit.

Two LocalClusters of 2 workers (1 thread each, 256 MiB of vineyard memory each) run side by
side in one process: ``tls=True`` (the dvml side) and ``tls=False`` (the baseline); the
harness alternates them. Per repeat and side, the wall time of one call:

- B14a, pack: ``dvml.training_preprocessor`` of Dask arrays generated on the workers, ``x``
  float32 (rows, 256) and ``y`` int64 in [0, 10) (B5a's source): 131,072 rows, 128 MiB of x
  (``--quick``: 16,384 rows, 16 MiB), in partitions of 8 MiB. Blocks move between the workers
  over Dask's comms, TLS or not; the buffers go into vineyard through its IPC socket.
- B14b, fit: ``dvml.fit`` of dvml's digits CNN (1 iteration, 2 epochs, batch 128) on 5 copies
  of scikit-learn's digits packed beforehand (outside the clock): the control traffic of a fit
  (launcher tasks, peers, the trainers' results and weights back to the client).

- B14c, transfer: a 64 MiB numpy array made on one worker and summed on the other (one
  worker-to-worker transfer over Dask's comms).
- B14d, control: 100 tiny tasks, submitted and gathered one after another (round trips of
  the client, the scheduler and a worker).

B14c and B14d use the two clusters only; they isolate what TLS adds, in seconds that a busy
machine disturbs less than a whole pack or fit. Target: TLS costs at most 10 % (ratio <= 1.1).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

from benchmarks import _training as t
from benchmarks.harness import Benchmark, register

COLUMNS, CLASSES = 256, 10
# quick -> (rows, rows per partition)
SIZES = {False: (1 << 17, 1 << 13), True: (1 << 14, 1 << 13)}
PACKED, DIGITS, MODEL = "bench_b14_pack", "bench_b14_digits", "bench_b14_cnn"


def _arrays(rows: int, chunk: int) -> dict[str, Any]:
    import dask.array as da
    import numpy as np

    x = da.random.default_rng(0).random((rows, COLUMNS), dtype=np.float32, chunks=(chunk, -1))
    y = da.random.default_rng(1).integers(0, CLASSES, size=rows, chunks=chunk)
    return {"x": x, "y": y}


def prepare(quick: bool) -> dict[str, Any]:
    import dvml
    from benchmarks.b4_end_to_end import digits_frames
    from dvml.examples import digits_cnn_json

    context: dict[str, Any] = {
        "clusters": {}, "sizes": SIZES[quick], "registry": None,
        "directory": tempfile.mkdtemp(prefix="dvml-bench-b14-"),
    }  # fmt: skip
    try:
        for side, tls in (("tls", True), ("plain", False)):
            context["clusters"][side] = dvml.LocalCluster(
                n_workers=2, vineyard_memory=256 * t.MiB, dashboard_address=None,
                set_as_default=False, tls=tls,
            )  # fmt: skip
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        context["arch_id"] = dvml.load_keras_model(
            digits_cnn_json(), name="digits-cnn", registry=context["registry"]
        )
        train, _ = digits_frames(5)
        for cluster in context["clusters"].values():
            dvml.training_preprocessor(
                train, y="label", x="pixels", normalizing_const=16.0, name=DIGITS,
                overwrite=True, client=cluster.client,
            )  # fmt: skip
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    for cluster in context["clusters"].values():
        if context.get("sizes"):  # the pack and fit context
            for name in (PACKED, DIGITS):
                t.drop_dataset(cluster, name)
        cluster.close()
    if context.get("registry") is not None:
        context["registry"].close()
    shutil.rmtree(context["directory"], ignore_errors=True)


def pack(context: dict[str, Any], side: str) -> float:
    import dvml

    cluster = context["clusters"][side]
    rows, chunk = context["sizes"]
    start = time.perf_counter()
    dvml.training_preprocessor(
        _arrays(rows, chunk), y="y", x="x", name=PACKED, overwrite=True, client=cluster.client
    )
    elapsed = time.perf_counter() - start
    t.drop_dataset(cluster, PACKED)  # outside the clock
    return elapsed


def fit(context: dict[str, Any], side: str) -> float:
    import dvml
    from dvml.examples import COMPILE_PARAMS

    cluster = context["clusters"][side]
    start = time.perf_counter()
    dvml.fit(
        DIGITS, f"{MODEL}_{side}", context["arch_id"], COMPILE_PARAMS,
        "batch_size=128, epochs=2", num_iterations=1, resume=False, overwrite=True, progress=False,
        registry=context["registry"], client=cluster.client,
    )  # fmt: skip
    return time.perf_counter() - start


def prepare_clusters(quick: bool) -> dict[str, Any]:
    import dvml

    context: dict[str, Any] = {"clusters": {}, "directory": tempfile.mkdtemp(prefix="b14-")}
    try:
        for side, tls in (("tls", True), ("plain", False)):
            context["clusters"][side] = dvml.LocalCluster(
                n_workers=2, vineyard_memory=64 * t.MiB, dashboard_address=None,
                set_as_default=False, tls=tls,
            )  # fmt: skip
    except BaseException:
        cleanup(context)
        raise
    return context


def _block(nbytes: int) -> Any:
    import numpy as np

    return np.ones(nbytes // 8)


def _total(block: Any) -> float:
    return float(block.sum())


def _noop(i: int) -> int:
    return i


def transfer(context: dict[str, Any], side: str) -> float:
    cluster = context["clusters"][side]
    first, second = (w.address for w in cluster.workers)
    start = time.perf_counter()
    block = cluster.client.submit(_block, 64 * t.MiB, workers=[first], pure=False)
    total = cluster.client.submit(_total, block, workers=[second], allow_other_workers=False)
    total.result()
    elapsed = time.perf_counter() - start
    del block, total
    return elapsed


def control(context: dict[str, Any], side: str) -> float:
    client = context["clusters"][side].client
    start = time.perf_counter()
    for i in range(100):
        client.submit(_noop, i, pure=False).result()
    return time.perf_counter() - start


def _register(key: str, title: str, side_fn: Any, prepare_fn: Any = prepare) -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=title,
            unit="s",
            dvml=lambda context: side_fn(context, "tls"),
            baseline=lambda context: side_fn(context, "plain"),
            target=1.1,
            target_op="<=",
            prepare=prepare_fn,
            cleanup=cleanup,
        )
    )


B14A = _register("B14a", "pack 128 MiB, Dask TLS on vs off", pack)
B14B = _register("B14b", "digits fit (2 trainers), Dask TLS on vs off", fit)
B14C = _register("B14c", "64 MiB worker-to-worker, Dask TLS on vs off", transfer, prepare_clusters)
B14D = _register("B14d", "100 task round trips, Dask TLS on vs off", control, prepare_clusters)
