"""The state file of a cluster started with ``dvml cluster up``: write, read, check, remove.

``<state-dir>/cluster.json`` records the scheduler address, the pid of the ``dvml.cluster.serve``
process that owns the cluster and the pid of every process it started, each with its start
time and command line, so that a pid reused by an unrelated process is never mistaken for (or
killed as) ours: a process is signalled only when all three match (:func:`signal_process`).
``<state-dir>/.cluster.lock`` is held by ``dvml cluster up`` while it starts a cluster
(:func:`state_lock`), so that two commands started at once cannot both start one.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

from dvml.cluster.lifeline import identity_of, is_same_process
from dvml.exceptions import ClusterError, LockHeldError

__all__ = [
    "LOG_FILE",
    "STATE_FILE",
    "process_identity",
    "process_start_time",
    "read_state",
    "recorded_identities",
    "recorded_processes",
    "remove_state",
    "same_process",
    "signal_process",
    "state_lock",
    "state_path",
    "write_state",
]

STATE_FILE = "cluster.json"
LOG_FILE = "cluster.log"
LOCK_FILE = ".cluster.lock"
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

    A pid whose start time differs belongs to another process (the pid was reused); without a
    recorded start time nothing is proven and the answer is False.
    """
    if start_time is None or pid <= 1:
        return False
    now = process_start_time(pid)
    if now is None:
        return False
    return abs(now - start_time) < 1.0


def signal_process(identity: dict[str, Any], sig: signal.Signals) -> bool:
    """Send ``sig`` to a recorded process if its pid, start time AND command line still match.

    Returns whether the signal was sent. A record that lacks any of the three (an old or
    forged state file) is never signalled.
    """
    if not is_same_process(identity):
        return False
    try:
        os.kill(int(identity["pid"]), sig)
    except ProcessLookupError:
        return False
    return True


def process_identity(pid: int) -> dict[str, Any] | None:
    """pid, start time and command line of a running process (recorded in the state file)."""
    return identity_of(pid)


@contextlib.contextmanager
def state_lock(state_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``<state_dir>/.cluster.lock`` (an exclusive ``flock``) for the duration.

    Raises
    ------
    LockHeldError
        At once, when another process holds it (another ``dvml cluster up`` is starting).
    """
    import fcntl

    path = pathlib.Path(state_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeldError(
                f"Another `dvml cluster up` is starting a cluster in {state_dir} right now (it "
                f"holds {path}). Wait for it to finish, then check `dvml cluster status`; or "
                "give another --state-dir."
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def recorded_processes(state: dict[str, Any]) -> dict[str, tuple[int, float | None]]:
    """Every recorded process, the serve process first: ``{name: (pid, start_time)}``."""
    times = state.get("start_times", {})
    procs: dict[str, tuple[int, float | None]] = {
        "serve": (int(state["pid"]), state.get("start_time"))
    }
    for name, pid in state.get("processes", {}).items():
        procs[name] = (int(pid), times.get(name))
    return procs


def recorded_identities(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every recorded process as ``{name: {"pid", "start_time", "cmdline"}}``, serve first.

    A value the file lacks is None: such a process can never be proven ours, so it is never
    signalled (:func:`signal_process`).
    """
    times = state.get("start_times", {})
    cmdlines = state.get("cmdlines", {})
    ids = {
        "serve": {
            "pid": state.get("pid"),
            "start_time": state.get("start_time"),
            "cmdline": state.get("cmdline"),
        }
    }
    for name, pid in state.get("processes", {}).items():
        ids[name] = {"pid": pid, "start_time": times.get(name), "cmdline": cmdlines.get(name)}
    return ids
