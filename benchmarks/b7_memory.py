"""B7: three trainers on one host share one copy of a dataset instead of holding three.

What is measured: the total memory (MiB) of three trainer-like processes on one host that
each hold the whole of one 1 GiB dataset (``x_0`` float32 [1048576, 246] + one-hot ``y``, 1 KiB
a row) and have touched every page of it (each sums every array): the sum of the readers'
PSS (``psutil``; PSS splits a page shared by n processes into n parts), with vineyard's
shared memory taken out of each and counted once instead.

- dvml side: the dataset is in worker-0's vineyardd (a one-worker LocalCluster); each reader
  runs :func:`dvml.resolve.open_local` through that daemon's IPC socket and sums the
  read-only shared-memory views. Total = the readers' PSS outside vineyard's shared memory +
  the resident size of that shared memory once (the dataset) + the vineyardd's own PSS. The
  shared pages are not left to PSS alone because the Dask worker that put the data keeps the
  segment mapped (vineyard does not unmap on close), so PSS would hand a quarter of the
  data to a process that is not counted.
- baseline: each reader loads the same bytes with ``np.load`` from ``.npy`` files (written
  once, not timed) into its own memory and sums them. Total = the readers' PSS.

Each reader is a fresh ``python -m benchmarks.b7_memory`` that imports only what its side
needs (numpy; plus dvml.resolve and so vineyard on the dvml side). Memory is read once all
three report that they summed their arrays; then they exit. ``--quick``: 64 MiB.

Target: ratio <= 0.4 (the data alone gives 1/3; what is left is each reader's interpreter
and imports).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks import _training as t
from benchmarks.harness import Benchmark, register

READERS = 3
SIZES = {False: 1 << 30, True: 64 * t.MiB}
NAME = "bench_b7_shared"


def prepare(quick: bool) -> dict[str, Any]:
    import numpy as np

    nbytes = SIZES[quick]
    rows = t.rows_for_bytes(nbytes)
    cluster = t.start_cluster(1, nbytes + 64 * t.MiB)
    context: dict[str, Any] = {
        "cluster": cluster,
        "directory": tempfile.mkdtemp(prefix="dvml-bench-b7-"),
        "nbytes": nbytes,
        "stats": {"dvml": [], "baseline": []},
    }
    try:
        t.publish_synthetic(cluster, NAME, rows)
        context["socket"] = t.worker_socket(cluster)
        context["vineyardd_pid"] = cluster.processes()[f"vineyardd of {cluster.specs[0].name}"]
        paths = []
        for field, array in t.synthetic_arrays(rows).items():  # the same bytes as in vineyard
            path = os.path.join(context["directory"], f"{field}.npy")
            np.save(path, array)
            paths.append(path)
            del array
        context["paths"] = paths
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    t.drop_dataset(context["cluster"], NAME)
    context["cluster"].close()
    shutil.rmtree(context["directory"], ignore_errors=True)


def _memory(pid: int) -> dict[str, float]:
    """PSS, USS, and the PSS and RSS of vineyard's shared memory in ``pid``, in MiB."""
    import psutil

    process = psutil.Process(pid)
    full = process.memory_full_info()
    shared = [m for m in process.memory_maps(grouped=True) if "vineyard" in m.path]
    return {
        "pss": full.pss / t.MiB,
        "uss": full.uss / t.MiB,
        "shared_pss": sum(m.pss for m in shared) / t.MiB,
        "shared_rss": sum(m.rss for m in shared) / t.MiB,
    }


def _readers(context: dict[str, Any], args: list[str], env: dict[str, str]) -> dict[str, float]:
    """Start the readers, wait until each has summed its data, read their memory, stop them."""
    command = [sys.executable, "-m", "benchmarks.b7_memory", *args]
    procs = [
        subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=t.ROOT, env=env
        )
        for _ in range(READERS)
    ]
    try:
        for proc in procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line.startswith("summed"):
                raise RuntimeError(
                    f"A B7 reader ({' '.join(args)}) exited before summing its data (exit "
                    f"{proc.wait(10)}). Received: {line!r}."
                )
        found = [_memory(p.pid) for p in procs]
        return {
            "own": sum(m["pss"] - m["shared_pss"] for m in found),
            "shared": max(m["shared_rss"] for m in found),  # every reader touched all of it
            "uss_each": sum(m["uss"] for m in found) / READERS,
        }
    finally:
        for proc in procs:
            t.stop_process(proc)


def dvml_side(context: dict[str, Any]) -> float:
    env = dict(os.environ, VINEYARD_IPC_SOCKET=context["socket"])
    found = _readers(context, ["dvml", NAME], env)
    daemon = _memory(context["vineyardd_pid"])
    own = daemon["pss"] - daemon["shared_pss"]
    context["stats"]["dvml"].append({**found, "vineyardd": own})
    return found["own"] + found["shared"] + own


def baseline_side(context: dict[str, Any]) -> float:
    found = _readers(context, ["npy", *context["paths"]], dict(os.environ))
    context["stats"]["baseline"].append(found)
    return found["own"] + found["shared"]  # nothing is shared: "shared" is 0


def details(context: dict[str, Any]) -> dict[str, Any]:
    import statistics

    def median(side: str, key: str) -> float:
        return round(statistics.median(s[key] for s in context["stats"][side]), 1)

    return {
        "data MiB": context["nbytes"] // t.MiB,
        "shared MiB counted once": median("dvml", "shared"),
        "private MiB per dvml reader": median("dvml", "uss_each"),
        "per baseline reader": median("baseline", "uss_each"),
        "vineyardd own PSS MiB": median("dvml", "vineyardd"),
    }


def reader(argv: list[str]) -> int:
    """A trainer-like reader: hold the whole dataset, touch every page, wait for stdin EOF."""
    import numpy as np

    side, *rest = argv
    if side == "dvml":
        from dvml.resolve.partitions import open_local

        parts = open_local(rest[0])
        arrays = [a for views in parts.fields.values() for a in views]
    else:
        arrays = [np.load(path) for path in rest]
    total = sum(float(a.sum(dtype=np.float64)) for a in arrays)
    print(f"summed {total}", flush=True)
    sys.stdin.read()  # hold the data until the benchmark has read our memory
    return 0


BENCHMARK = register(
    Benchmark(
        key="B7",
        title="memory of 3 trainers reading one dataset",
        unit="MiB",
        dvml=dvml_side,
        baseline=baseline_side,
        target=0.4,
        target_op="<=",
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)

if __name__ == "__main__":
    sys.exit(reader(sys.argv[1:]))
