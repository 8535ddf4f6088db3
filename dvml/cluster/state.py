"""The state file of a cluster started with ``dvml cluster up``: write, read, check, remove.

``<state-dir>/cluster.json`` records the scheduler address, the pid of the ``dvml.cluster.serve``
process that owns the cluster and the pid of every process it started, each with its start
time, so that a pid reused by an unrelated process is never mistaken for (or killed as) ours.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
from typing import Any

from dvml.exceptions import ClusterError

__all__ = [
    "LOG_FILE",
    "STATE_FILE",
    "process_start_time",
    "read_state",
    "recorded_processes",
    "remove_state",
    "same_process",
    "signal_process",
    "state_path",
    "write_state",
]

STATE_FILE = "cluster.json"
LOG_FILE = "cluster.log"
STATE_VERSION = 1


def state_path(state_dir: str | os.PathLike[str]) -> pathlib.Path:
    """Path of the state file in ``state_dir``."""
    return pathlib.Path(state_dir) / STATE_FILE


def write_state(state_dir: str | os.PathLike[str], state: dict[str, Any]) -> pathlib.Path:
    """Write the state file atomically (a temporary file, then :func:`os.replace`).

    A reader never sees a half-written file: either the old one, none, or the new one.
    """
    path = state_path(state_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"version": STATE_VERSION, **state}, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_state(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The recorded state, or None when no state file exists.

    Raises
    ------
    ClusterError
        When the file exists but cannot be parsed.
    """
    path = state_path(state_dir)
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"The cluster state file {path} cannot be read: {exc}. If no cluster is running, "
            "delete the file; otherwise stop the cluster's processes by their pids."
        ) from exc
    if not isinstance(state, dict) or "pid" not in state or "scheduler_address" not in state:
        raise ClusterError(
            f"The cluster state file {path} is not one that dvml wrote. Received keys: "
            f"{sorted(state) if isinstance(state, dict) else type(state).__name__}. "
            "Delete it if no cluster is running."
        )
    return state


def remove_state(state_dir: str | os.PathLike[str], pid: int | None = None) -> bool:
    """Remove the state file; with ``pid``, only when the file still records that pid.

    Returns whether a file was removed.
    """
    path = state_path(state_dir)
    if pid is not None:
        try:
            current = read_state(state_dir)
        except ClusterError:
            return False
        if current is None or current.get("pid") != pid:
            return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def process_start_time(pid: int) -> float | None:
    """Start time of process ``pid`` (seconds since the epoch), None when it does not run."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except psutil.Error:
        return None


def same_process(pid: int, start_time: float | None) -> bool:
    """Whether ``pid`` runs and is the process that was recorded with ``start_time``.

    A pid whose start time differs belongs to another process (the pid was reused).
    """
    now = process_start_time(pid)
    if now is None:
        return False
    return start_time is None or abs(now - start_time) < 1.0


def signal_process(pid: int, start_time: float | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` if it is still the recorded process; return whether it was sent."""
    if not same_process(pid, start_time):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def recorded_processes(state: dict[str, Any]) -> dict[str, tuple[int, float | None]]:
    """Every recorded process, the serve process first: ``{name: (pid, start_time)}``."""
    times = state.get("start_times", {})
    procs: dict[str, tuple[int, float | None]] = {
        "serve": (int(state["pid"]), state.get("start_time"))
    }
    for name, pid in state.get("processes", {}).items():
        procs[name] = (int(pid), times.get(name))
    return procs
