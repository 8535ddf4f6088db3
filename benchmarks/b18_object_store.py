"""B18: packing Parquet from an S3-compatible store vs ``dd.read_parquet(...).compute()``.

What is measured, per repeat and side: the wall time of one call, as MiB/s of Parquet data.
The data set is 256 float32 columns ``f0`` ... ``f255`` and an int64 label ``y`` in 32 Parquet
files (1 GiB of x in all; ``--quick``: 64 MiB; the environment variable ``DVML_B18_MIB``
sets another size) in a bucket of moto's S3 server on 127.0.0.1, written once before timing.
One LocalCluster of 2 workers, 1 thread each.

- dvml side: ``dvml.training_preprocessor("s3://bench/data", y="y", x=[[f0..f255]],
  storage_options=...)``: each worker reads its own files straight from the store and packs
  the rows into its vineyardd; the dataset is dropped after the clock stops.
- baseline: ``dd.read_parquet("s3://bench/data", storage_options=...).compute()``: the same
  files read by the workers and gathered into the client process (what a single-process
  trainer would do to get at the data).

Before timing, each side runs once untimed (see B5). Target: ratio >= 2 (as B5 for local
data). Both sides share one moto server, a single Python process: it serves every request of
both sides, so its throughput bounds both.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks._clusters import drop_and_close
from benchmarks.harness import Benchmark, register

MiB = 1 << 20
COLUMNS, CLASSES, FILES = 256, 10, 32
X_COLUMNS = [f"f{i}" for i in range(COLUMNS)]
# quick -> (bytes of x, vineyard memory per worker)
SIZES = {False: (1 << 30, 768 * MiB), True: (64 * MiB, 96 * MiB)}
NAME = "bench_b18"
URL = "s3://bench/data"


def _write_parquet(server: Any, nbytes: int) -> float:
    """Write the data set into the bucket; its size in MiB."""
    import io

    import numpy as np
    import pandas as pd
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options)
    fs.mkdir("bench")
    rows = nbytes // (4 * COLUMNS)
    total = 0
    for i, part in enumerate(np.array_split(np.arange(rows), FILES)):
        rng = np.random.default_rng([i, 18])
        frame = pd.DataFrame(rng.random((len(part), COLUMNS), dtype=np.float32), columns=X_COLUMNS)
        frame["y"] = rng.integers(0, CLASSES, size=len(part))
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        data = buf.getvalue()
        fs.pipe(f"bench/data/part-{i:03d}.parquet", data)
        total += len(data)
    return total / MiB


def pack(context: dict[str, Any]) -> float:
    import dvml

    client = context["cluster"].client
    start = time.perf_counter()
    dvml.training_preprocessor(URL, y="y", x=[X_COLUMNS], name=NAME, overwrite=True,
                               storage_options=context["options"], client=client)  # fmt: skip
    seconds = time.perf_counter() - start
    dvml.datasets.drop(NAME, client=client)
    return float(context["mib"] / seconds)


def read_compute(context: dict[str, Any]) -> float:
    import dask.dataframe as dd

    client = context["cluster"].client
    start = time.perf_counter()
    frame = dd.read_parquet(URL, storage_options=context["options"]).compute(scheduler=client.get)
    seconds = time.perf_counter() - start
    del frame
    return float(context["mib"] / seconds)


def prepare(quick: bool) -> dict[str, Any]:
    import dvml
    from benchmarks._s3 import start_s3

    nbytes, memory = SIZES[quick]
    if os.environ.get("DVML_B18_MIB"):
        nbytes = int(os.environ["DVML_B18_MIB"]) * MiB
        memory = max(96 * MiB, int(nbytes * 0.75))  # each of 2 workers holds half, packed
    server = start_s3()
    context: dict[str, Any] = {"server": server, "options": server.storage_options}
    try:
        context["mib"] = _write_parquet(server, nbytes)
        context["cluster"] = dvml.LocalCluster(
            n_workers=2, threads_per_worker=1, vineyard_memory=memory, dashboard_address=None,
            set_as_default=False,
        )  # fmt: skip
        context["first runs"] = {
            "Parquet MiB in the store": round(context["mib"], 1),
            "first dvml run MiB/s": round(pack(context), 1),
            "first baseline run MiB/s": round(read_compute(context), 1),
        }
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    try:
        if "cluster" in context:
            drop_and_close(context["cluster"], NAME)
    finally:
        context["server"].stop()


B18 = register(
    Benchmark(
        key="B18",
        title="pack Parquet from a local S3 server vs dd.read_parquet(...).compute()",
        unit="MiB/s",
        dvml=pack,
        baseline=read_compute,
        target=2.0,
        target_op=">=",
        prepare=prepare,
        cleanup=cleanup,
        details=lambda context: dict(context["first runs"]),
    )
)
