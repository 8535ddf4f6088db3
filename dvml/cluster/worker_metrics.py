"""A worker's vineyardd bytes and its host's memory, sent to the scheduler with the worker's
heartbeats.

:class:`VineyardMetrics` adds two metrics to every worker; the scheduler keeps them in
``WorkerState.metrics``:

- ``dvml_vineyard`` (``{"used", "limit"}`` bytes of the worker's vineyardd, or None), read by
  dvml's dashboard page (:mod:`dvml.dashboard`). The vineyard call runs in a thread, at most
  once a second, and the heartbeat never waits for it: it sends the last answer (a frozen
  vineyardd must not stop the worker's heartbeats, which would make the scheduler drop the
  worker).
- ``dvml_host_memory`` (:func:`host_memory`: the machine's boot id, ``MemAvailable`` and
  cgroup room), read by memory plans (:func:`dvml.train.trainer_memory.host_rooms`) in one
  scheduler call instead of a task per host.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dvml.cluster.connection import local_client
from dvml.cluster.host_room import host_memory

METRIC = "dvml_vineyard"
"""The name of the vineyardd's metric in ``WorkerState.metrics``."""

HOST_METRIC = "dvml_host_memory"
"""The name of the host memory's metric in ``WorkerState.metrics``."""

PLUGIN_NAME = "dvml-vineyard-metrics"

_EVERY_S = 1.0


def _host_memory_metric(worker: Any) -> tuple[str, int, int | None] | None:
    try:
        return host_memory()
    except OSError:
        return None


def vineyard_bytes() -> dict[str, int] | None:
    """This worker's vineyardd: ``{"used", "limit"}`` bytes, or None when it has none or it
    does not answer."""
    if not os.environ.get("VINEYARD_IPC_SOCKET"):
        return None
    try:
        status = local_client().status  # the process's shared connection
    except Exception:
        return None
    return {"used": int(status.memory_usage), "limit": int(status.memory_limit)}


class VineyardMetrics(WorkerPlugin):
    """Installed on every worker by :class:`dvml.Cluster` (LocalCluster and ``connect``)."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self._last: dict[str, int] | None = None
        self._at = 0.0
        self._pending: concurrent.futures.Future[dict[str, int] | None] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def setup(self, worker: Any) -> None:
        worker.metrics[METRIC] = self._metric
        worker.metrics[HOST_METRIC] = _host_memory_metric

    def teardown(self, worker: Any) -> None:
        worker.metrics.pop(METRIC, None)
        worker.metrics.pop(HOST_METRIC, None)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def _metric(self, worker: Any) -> dict[str, int] | None:
        if self._pending is not None and self._pending.done():
            self._last = None if self._pending.exception() else self._pending.result()
            self._pending = None
        if self._pending is None and time.monotonic() - self._at >= _EVERY_S:
            if self._pool is None:  # one thread: a frozen call never piles up others
                self._pool = concurrent.futures.ThreadPoolExecutor(1, "dvml-vineyard-metrics")
            self._at = time.monotonic()
            self._pending = self._pool.submit(vineyard_bytes)
        return self._last
