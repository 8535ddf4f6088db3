"""B24: data that grows. An append against a full repack, and the feature cache after an append
against computing it for the whole grown dataset.

- B24a: a dataset of N rows (Dask arrays: ``x`` float32 (rows, 256), ``y`` labels in [0, 10),
  generated on the workers as in B5) grows by 10 %. dvml: ``dvml.datasets.append`` of the
  new rows (version 2 over version 1's buffers); baseline: ``dvml.training_preprocessor`` of
  the whole grown source with ``overwrite=True`` (what a workflow without appends does).
  Before each dvml run, version 1 is packed again, untimed. Sizes: N = 1,048,576 rows, 1 GiB
  of x (``--quick``: 32,768 rows). Target: <= 0.2. Detail: the shared-memory bytes the append
  added to the vineyardds against the new rows' packed bytes (the issue's second target:
  <= 1.1x).
- B24b: the feature cache of a grown image dataset (uint8 32x32x3 images, a small Conv2D
  backbone with seeded weights, average pooling) after a 10 % append. dvml:
  ``dvml.features.cache`` again after the append (the backbone runs on the new buffers only);
  baseline: the same request with ``overwrite=True`` (every row through the backbone). Sizes:
  N = 20,000 images (``--quick``: 2,000). Target: <= 0.2.

One LocalCluster of 2 workers, 1 thread each (vineyardds of 3 GiB; ``--quick``: 256 MiB),
serves both rows. Figure: seconds of the timed call; ratio dvml / baseline.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.harness import Benchmark, register

MiB = 1 << 20
COLUMNS, CLASSES = 256, 10
# quick -> (rows of B24a, rows per chunk, images of B24b, vineyard memory per worker)
SIZES = {False: (1 << 20, 1 << 15, 20_000, 3 << 30), True: (1 << 15, 1 << 12, 2_000, 256 * MiB)}
TABLE, IMAGES, CACHE = "bench_b24_table", "bench_b24_images", "bench_b24_features"


def _arrays(start: int, stop: int, chunk: int) -> dict[str, Any]:
    """Rows [start, stop) of the B24a source: each chunk from its own seed, so a row is the
    same whichever call reads it."""
    import dask.array as da
    import numpy as np

    def x_block(block_id: tuple[int, int]) -> Any:
        rng = np.random.default_rng([0, start // chunk + block_id[0]])
        return rng.random((min(chunk, stop - start - block_id[0] * chunk), COLUMNS), np.float32)

    def y_block(block_id: tuple[int]) -> Any:
        rng = np.random.default_rng([1, start // chunk + block_id[0]])
        return rng.integers(0, CLASSES, min(chunk, stop - start - block_id[0] * chunk))

    rows = stop - start
    chunks = tuple(min(chunk, rows - i) for i in range(0, rows, chunk))
    x = da.map_blocks(x_block, chunks=(chunks, (COLUMNS,)), dtype=np.float32)
    y = da.map_blocks(y_block, chunks=(chunks,), dtype=np.int64)
    return {"x": x, "y": y}


def _vineyard_used(cluster: Any) -> int:
    return int(cluster.status()["memory_used"].fillna(0).sum())


def append_rows(context: dict[str, Any]) -> float:
    import dvml

    client, rows, chunk = context["cluster"].client, context["rows"], context["chunk"]
    dvml.training_preprocessor(_arrays(0, rows, chunk), y="y", x="x", name=TABLE,
                               overwrite=True, client=client)  # fmt: skip
    packed = dvml.datasets.describe(TABLE, client=client).nbytes
    before = _vineyard_used(context["cluster"])
    start = time.perf_counter()
    grown = dvml.datasets.append(TABLE, _arrays(rows, rows + rows // 10, chunk), client=client)
    seconds = time.perf_counter() - start
    context["written"] = (_vineyard_used(context["cluster"]) - before, grown.nbytes - packed)
    return seconds


def repack_all(context: dict[str, Any]) -> float:
    import dvml

    client, rows, chunk = context["cluster"].client, context["rows"], context["chunk"]
    start = time.perf_counter()
    dvml.training_preprocessor(_arrays(0, rows + rows // 10, chunk), y="y", x="x", name=TABLE,
                               overwrite=True, client=client)  # fmt: skip
    return time.perf_counter() - start


def _images(start: int, stop: int) -> dict[str, Any]:
    import dask.array as da
    import numpy as np

    rng = np.random.default_rng(start)
    x = rng.integers(0, 256, (stop - start, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, CLASSES, stop - start)
    return {"image": da.from_array(x, chunks=2_000), "label": da.from_array(y, chunks=2_000)}


def _backbone() -> Any:
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.layers.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu", name="conv1"),
        keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
    ])  # fmt: skip


def _grown_images(context: dict[str, Any]) -> None:
    """Version 1 of the images and its cache, then the 10 % append (untimed)."""
    import dvml

    client, n = context["cluster"].client, context["images"]
    dvml.training_preprocessor(_images(0, n), y="label", x="image", normalizing_const=255.0,
                               name=IMAGES, overwrite=True, client=client)  # fmt: skip
    dvml.features.cache(IMAGES, context["backbone"], pooling="avg", name=CACHE, overwrite=True,
                        client=client)  # fmt: skip
    dvml.datasets.append(IMAGES, _images(n, n + n // 10), client=client)


def extend_cache(context: dict[str, Any]) -> float:
    import dvml

    _grown_images(context)
    start = time.perf_counter()
    cache = dvml.features.cache(IMAGES, context["backbone"], pooling="avg", name=CACHE,
                                client=context["cluster"].client)  # fmt: skip
    seconds = time.perf_counter() - start
    context["extended"] = cache.summary.get("incremental")
    return seconds


def cache_all(context: dict[str, Any]) -> float:
    import dvml

    _grown_images(context)
    start = time.perf_counter()
    dvml.features.cache(IMAGES, context["backbone"], pooling="avg", name=CACHE, overwrite=True,
                        client=context["cluster"].client)  # fmt: skip
    return time.perf_counter() - start


def prepare(quick: bool) -> dict[str, Any]:
    import dvml

    rows, chunk, images, memory = SIZES[quick]
    cluster = dvml.LocalCluster(
        n_workers=2, threads_per_worker=1, vineyard_memory=memory, dashboard_address=None,
        set_as_default=False,
    )  # fmt: skip
    return {"cluster": cluster, "rows": rows, "chunk": chunk, "images": images,
            "backbone": _backbone()}  # fmt: skip


def cleanup(context: dict[str, Any]) -> None:
    import dvml
    from dvml.exceptions import DatasetNotFoundError

    try:
        for name in (CACHE, IMAGES, TABLE):
            try:
                dvml.datasets.drop(name, client=context["cluster"].client)
            except DatasetNotFoundError:
                pass
    finally:
        context["cluster"].close()


def _written(context: dict[str, Any]) -> dict[str, Any]:
    used, new_bytes = context.get("written", (None, None))
    ratio = used / new_bytes if used is not None and new_bytes else None
    return {
        "shared memory added by the append (bytes)": used,
        "the new rows' packed bytes": new_bytes,
        "added / new rows' bytes (target <= 1.1)": None if ratio is None else round(ratio, 3),
    }


B24A = register(
    Benchmark(
        key="B24a", title="append 10 % more rows vs a full repack of the grown source", unit="s",
        dvml=append_rows, baseline=repack_all, target=0.2, target_op="<=", prepare=prepare,
        cleanup=cleanup, details=_written,
    )
)  # fmt: skip
B24B = register(
    Benchmark(
        key="B24b", title="the feature cache after a 10 % append vs computing it for every row",
        unit="s", dvml=extend_cache, baseline=cache_all, target=0.2, target_op="<=",
        prepare=prepare, cleanup=cleanup,
        details=lambda context: {"extension": context.get("extended")},
    )
)  # fmt: skip
