"""B8: starting and stopping a cluster: dvml.LocalCluster vs distributed.LocalCluster.

What is measured, per repeat and side: the wall time from the constructor call until every
worker is connected, plus ``close()`` until every process has stopped.

- dvml side: ``dvml.LocalCluster(n_workers=2, threads_per_worker=1, vineyard_memory="256MiB")``:
  etcd, 2 vineyardd (256 MiB of /dev/shm each, RPC off), a Dask scheduler and 2 Nanny workers.
- baseline: ``distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``
  with a ``Client`` that waits for both workers: a scheduler and 2 Nanny workers.

Both sides: dashboard on a free loopback port, worker memory limit ``auto``. ``--quick``
changes nothing here (the sizes are already minimal). Target: ratio <= 1.5, i.e. etcd and the
vineyard daemons add at most half of what Dask alone costs.
"""

from __future__ import annotations

import logging
import time

from benchmarks.harness import Benchmark, register

N_WORKERS = 2


def prepare(quick: bool) -> None:
    """Import both stacks before timing, so that neither side pays for the first import."""
    import distributed  # noqa: F401
    import vineyard  # noqa: F401

    import dvml.cluster.local_cluster  # noqa: F401


def dvml_side(context: None) -> float:
    import dvml

    start = time.perf_counter()
    cluster = dvml.LocalCluster(
        n_workers=N_WORKERS, threads_per_worker=1, vineyard_memory="256MiB",
        dashboard_address="127.0.0.1:0", set_as_default=False,
    )  # fmt: skip
    cluster.close()
    return time.perf_counter() - start


def baseline_side(context: None) -> float:
    from distributed import Client, LocalCluster

    start = time.perf_counter()
    cluster = LocalCluster(
        n_workers=N_WORKERS, threads_per_worker=1, processes=True,
        dashboard_address="127.0.0.1:0", silence_logs=logging.WARNING,
    )  # fmt: skip
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(N_WORKERS)
    client.close()
    cluster.close()
    return time.perf_counter() - start


BENCHMARK = register(
    Benchmark(
        key="B8",
        title="cluster start+stop, 2 workers",
        unit="s",
        dvml=dvml_side,
        baseline=baseline_side,
        target=1.5,
        target_op="<=",
        prepare=prepare,
    )
)
