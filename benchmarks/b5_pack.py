"""B5: packing Dask partitions into placed vineyard buffers vs computing them to the client.

What is measured, per repeat and side: the wall time (``time.perf_counter`` in the benchmark
process) of one call, turned into MiB/s of source data. Two sources, one row each:

- B5a, Dask arrays ``x`` float32 (rows, 256) and ``y`` int64 labels in [0, 10):
  dvml ``dvml.training_preprocessor({"x": x, "y": y}, y="y", x="x")`` vs the baseline
  ``dask.compute(x, y)``.
- B5b, a Dask DataFrame of 256 float32 columns ``f0`` ... ``f255`` and an int64 column ``y``
  (values of the same distribution): dvml ``dvml.training_preprocessor(ddf, y="y",
  x=[["f0", ..., "f255"]])`` (one model input made of the 256 columns) vs the baseline
  ``ddf.compute()``.

The dvml side uses the default rules (both workers) and buffer size: validate, normalize,
one-hot encode, shuffle and pack the rows into balanced float32 buffers written straight into
the two workers' vineyardds, then publish the named dataset; the dataset is dropped after the
clock stops. The baselines gather the same partitions into the client process (what a
single-process trainer would do to get at the data).

Sources are generated ON the workers from seeds (never through the client), in partitions of
32 MiB of x. Sizes: 1,048,576 rows, 1 GiB of x plus 8 MiB of labels (``--quick``: 32,768
rows, 32 MiB, partitions of 4 MiB). One LocalCluster of 2 workers, 1 thread each, whose
vineyardds hold 640 MiB each (``--quick``: 64 MiB), serves both rows.

Before timing, each side of each row runs once at the full size, untimed; those first runs
are reported as details. The first run after a cluster starts pays for memory that neither the
worker processes nor the vineyardds have touched yet (about 2-4x slower here), and that cost
falls on whichever side runs first: without the untimed runs, the order of the sides would
decide the figures. Figure: MiB/s of source (x and y); the ratio dvml / baseline equals
baseline_time / dvml_time. Target: >= 2 (at the full size; with ``--quick`` the fixed cost
of a preprocessor call, a few hundred ms of small tasks, discovery and publication, outweighs
moving 32 MiB).
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks._clusters import drop_and_close
from benchmarks.harness import Benchmark, register

MiB = 1 << 20
COLUMNS, CLASSES = 256, 10
X_COLUMNS = [f"f{i}" for i in range(COLUMNS)]
# quick -> (rows, rows per partition, vineyard memory per worker)
SIZES = {False: (1 << 20, 1 << 15, 640 * MiB), True: (1 << 15, 1 << 12, 64 * MiB)}
NAME = "bench_b5"


def _arrays(rows: int, chunk: int) -> dict[str, Any]:
    import dask.array as da
    import numpy as np

    x = da.random.default_rng(0).random((rows, COLUMNS), dtype=np.float32, chunks=(chunk, -1))
    y = da.random.default_rng(1).integers(0, CLASSES, size=rows, chunks=chunk)
    return {"x": x, "y": y}


def frame_part(block: tuple[int, int]) -> Any:
    """Worker task: partition ``block = (index, rows)`` of the B5b DataFrame."""
    import numpy as np
    import pandas as pd

    index, rows = block
    rng = np.random.default_rng([index, 5])
    frame = pd.DataFrame(rng.random((rows, COLUMNS), dtype=np.float32), columns=X_COLUMNS)
    frame["y"] = rng.integers(0, CLASSES, size=rows)
    return frame


def _frame(rows: int, chunk: int) -> Any:
    import dask.dataframe as dd

    blocks = [(i, min(chunk, rows - start)) for i, start in enumerate(range(0, rows, chunk))]
    return dd.from_map(frame_part, blocks, meta=frame_part((0, 0)), enforce_metadata=False)


def _source_mib(rows: int) -> float:
    return rows * (4 * COLUMNS + 8) / MiB


def _pack(client: Any, source: Any, x: Any) -> float:
    import dvml

    start = time.perf_counter()
    dvml.training_preprocessor(source, y="y", x=x, name=NAME, overwrite=True, client=client)
    seconds = time.perf_counter() - start
    dvml.datasets.drop(NAME, client=client)
    return seconds


def _time_compute(client: Any, *collections: Any) -> float:
    import dask

    start = time.perf_counter()
    results = dask.compute(*collections, scheduler=client.get)
    seconds = time.perf_counter() - start
    del results
    return seconds


def pack_arrays(context: dict[str, Any]) -> float:
    rows, chunk = context["rows"], context["chunk"]
    return _source_mib(rows) / _pack(context["cluster"].client, _arrays(rows, chunk), "x")


def compute_arrays(context: dict[str, Any]) -> float:
    rows, chunk = context["rows"], context["chunk"]
    source = _arrays(rows, chunk)
    return _source_mib(rows) / _time_compute(context["cluster"].client, source["x"], source["y"])


def pack_frame(context: dict[str, Any]) -> float:
    rows, chunk = context["rows"], context["chunk"]
    # [X_COLUMNS]: one model input of 256 columns (a flat list would make 256 inputs).
    return _source_mib(rows) / _pack(context["cluster"].client, _frame(rows, chunk), [X_COLUMNS])


def compute_frame(context: dict[str, Any]) -> float:
    rows, chunk = context["rows"], context["chunk"]
    return _source_mib(rows) / _time_compute(context["cluster"].client, _frame(rows, chunk))


SIDES = {
    "B5a": (pack_arrays, compute_arrays),
    "B5b": (pack_frame, compute_frame),
}


def prepare(quick: bool) -> dict[str, Any]:
    import dvml

    rows, chunk, memory = SIZES[quick]
    cluster = dvml.LocalCluster(
        n_workers=2, threads_per_worker=1, vineyard_memory=memory, dashboard_address=None,
        set_as_default=False,
    )  # fmt: skip
    context: dict[str, Any] = {"cluster": cluster, "rows": rows, "chunk": chunk}
    try:
        context["first runs"] = {
            key: {
                "first dvml run MiB/s": round(dvml_side(context), 1),
                "first baseline run MiB/s": round(baseline_side(context), 1),
            }
            for key, (dvml_side, baseline_side) in SIDES.items()
        }
    except BaseException:
        cluster.close()
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    drop_and_close(context["cluster"], NAME)


def _register(key: str, title: str) -> Benchmark:
    dvml_side, baseline_side = SIDES[key]
    return register(
        Benchmark(
            key=key,
            title=title,
            unit="MiB/s",
            dvml=dvml_side,
            baseline=baseline_side,
            target=2.0,
            target_op=">=",
            prepare=prepare,
            cleanup=cleanup,
            details=lambda context: dict(context["first runs"][key]),
        )
    )


B5A = _register("B5a", "pack Dask arrays into placed buffers vs dask.compute() to the client")
B5B = _register("B5b", "pack a Dask DataFrame into placed buffers vs ddf.compute() to the client")
