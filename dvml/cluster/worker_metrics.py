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
import pathlib
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dvml.cluster.connection import local_client

METRIC = "dvml_vineyard"
"""The name of the vineyardd's metric in ``WorkerState.metrics``."""

HOST_METRIC = "dvml_host_memory"
"""The name of the host memory's metric in ``WorkerState.metrics``."""

PLUGIN_NAME = "dvml-vineyard-metrics"

_EVERY_S = 1.0


_NO_LIMIT = 2**60  # cgroup v1 reports "no limit" as a huge number (9223372036854771712)


def _read_int(path: str) -> int | None:
    try:
        text = pathlib.Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def host_memory() -> tuple[str, int, int | None]:
    """This kernel's boot id (hosts that share it share one machine's memory), its
    ``MemAvailable`` and, when this process's cgroup has a memory limit, that limit less the
    cgroup's usage (cgroup v2, else v1); bytes. Runs on a worker (heartbeats send it as
    :data:`HOST_METRIC`: reading these files takes well under a millisecond)."""
    try:
        boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    available = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (v1 + "limit_in_bytes", v1 + "usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < _NO_LIMIT:
            return boot, available, max(0, limit - usage)
    return boot, available, None


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
