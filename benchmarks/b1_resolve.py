"""B1: resolving a partition in a trainer costs the same for 1 GiB as for 10 MiB.

What is measured: the wall time of :func:`dvml.resolve.open_local` in a trainer-like process
(this one, connected to worker-0's vineyardd through its IPC socket, as a trainer started on
that worker is): connect, look the dataset up by name, read its layout and summary, and map
every local buffer as a read-only numpy view on shared memory, ready for tf.data. One figure is
the median of ``CALLS`` open/close cycles (each cycle connects afresh, so no mapping is
reused); the views are not touched, as resolving must not read the data.

Sizes: one dataset whose only buffer is 1 GiB (``x_0`` float32 [1048576, 246] + one-hot ``y``
[1048576, 10], 1 KiB a row), on a one-worker LocalCluster; ``--quick``: 64 MiB.

Two rows, one per baseline:

- ``B1a``: the same call on a dataset whose buffer is 10 MiB (``--quick``: 1 MiB). Target:
  ratio <= 1.5 (resolving is O(number of buffers), not O(bytes)).
- ``B1b``: ``pickle.loads`` of the same 1 GiB of arrays (pickle protocol 5, in memory), what a
  trainer that receives its partition through Dask pays; median of ``LOADS`` loads. Target:
  ratio <= 0.01, i.e. resolving is at least 100x faster.
"""

from __future__ import annotations

import pickle
import statistics
import time
from typing import Any

from benchmarks import _training as t
from benchmarks.harness import Benchmark, register

CALLS = 25  # open_local cycles per figure
LOADS = 3  # pickle.loads per figure
SIZES = {False: (1 << 30, 10 * t.MiB), True: (64 * t.MiB, 1 * t.MiB)}  # quick -> (big, small)
BIG, SMALL = "bench_b1_big", "bench_b1_small"


def prepare(quick: bool) -> dict[str, Any]:
    """One cluster, both datasets and the pickled bytes, shared by B1a and B1b."""
    big, small = SIZES[quick]
    cluster = t.start_cluster(1, big + small + 64 * t.MiB)
    context: dict[str, Any] = {"cluster": cluster, "names": []}
    context["sizes"] = {"big": _size(big), "small": _size(small)}
    try:
        context["socket"] = t.worker_socket(cluster)
        rows = t.rows_for_bytes(big)
        t.publish_synthetic(cluster, BIG, rows)
        context["names"].append(BIG)
        t.publish_synthetic(cluster, SMALL, t.rows_for_bytes(small))
        context["names"].append(SMALL)
        # The same bytes as in vineyard, regenerated here from the same seed.
        context["pickled"] = pickle.dumps(t.synthetic_arrays(rows), protocol=5)
    except BaseException:
        cleanup(context)
        raise
    return context


def _size(nbytes: int) -> str:
    return f"{nbytes >> 30} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def cleanup(context: dict[str, Any]) -> None:
    context.pop("pickled", None)
    for name in context["names"]:
        t.drop_dataset(context["cluster"], name)
    context["cluster"].close()


def _resolve_time(context: dict[str, Any], name: str) -> float:
    from dvml.resolve.partitions import open_local

    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        parts = open_local(name, socket=context["socket"])
        times.append(time.perf_counter() - start)
        parts.close()
    return statistics.median(times)


def resolve_big(context: dict[str, Any]) -> float:
    return _resolve_time(context, BIG)


def resolve_small(context: dict[str, Any]) -> float:
    return _resolve_time(context, SMALL)


def unpickle_big(context: dict[str, Any]) -> float:
    times = []
    for _ in range(LOADS):
        start = time.perf_counter()
        arrays = pickle.loads(context["pickled"])
        times.append(time.perf_counter() - start)
        del arrays
    return statistics.median(times)


B1A = register(
    Benchmark(
        key="B1a",
        title="open_local of a big partition vs a small one",
        unit="s",
        dvml=resolve_big,
        baseline=resolve_small,
        target=1.5,
        target_op="<=",
        prepare=prepare,
        cleanup=cleanup,
        details=lambda context: dict(context["sizes"]),
    )
)

B1B = register(
    Benchmark(
        key="B1b",
        title="open_local of a big partition vs unpickling it",
        unit="s",
        dvml=resolve_big,
        baseline=unpickle_big,
        target=0.01,
        target_op="<=",
        prepare=prepare,
        cleanup=cleanup,
        details=lambda context: {"big": context["sizes"]["big"]},
    )
)
