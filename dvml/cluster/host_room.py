"""What a host has for new processes: its kernel's boot id, available memory and cgroup room.

Read on a worker: by its heartbeats (:mod:`dvml.cluster.worker_metrics`), and by a task
where a worker sends none, for the memory plans' admissions (:mod:`dvml.train.trainer_memory`,
:mod:`dvml.features.cache_memory`).
"""

from __future__ import annotations

import pathlib

__all__ = ["host_memory"]

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
    cgroup's usage (cgroup v2, else v1); bytes. Runs on a worker (well under a millisecond:
    its heartbeats send it)."""
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
