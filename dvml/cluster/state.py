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
from typing import IO, Any

from dvml import config
from dvml.cluster.lifeline import identity_of, is_same_process
from dvml.exceptions import ClusterError, LockHeldError, NoClusterError

__all__ = [
    "API_HINT",
    "LOG_FILE",
    "STATE_FILE",
    "private_dir",
    "private_file",
    "process_identity",
    "process_start_time",
    "read_state",
    "recorded_identities",
    "recorded_processes",
    "recorded_scheduler",
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


def private_dir(
    path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None
) -> pathlib.Path:
    """Create ``path`` owner-only (0700), with every missing parent 0700 too.

    ``os.makedirs(path, mode=0o700)`` gives the mode to the last directory only: a fit that
    made ``STATE_DIR/locks`` created the state directory 0755, so every local user could read
    ``cluster.log`` and ``cluster.json`` (pids, command lines, certificate paths) there.

    Parameters
    ----------
    path : path
        The directory.
    root : path, optional
        An ancestor of ``path`` (the state directory) from which every directory down to
        ``path`` is tightened to 0700 when it is ours and others may enter it (one made by an
        older dvml). Without it only ``path`` is tightened.

    Returns
    -------
    pathlib.Path
        ``path``, expanded.
    """
    target = pathlib.Path(path).expanduser()
    missing = []
    probe = target
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made at the same moment by another process
            directory.mkdir(mode=0o700)
    tighten = [target]
    if root is not None:
        top = pathlib.Path(root).expanduser()
        tighten += [p for p in target.parents if p == top or top in p.parents]
    uid = os.geteuid()
    for directory in tighten:
        st = directory.stat()
        if st.st_uid == uid and st.st_mode & 0o077:
            os.chmod(directory, 0o700)
    return target


def private_file(path: str | os.PathLike[str], mode: str = "w") -> IO[Any]:
    """Open ``path`` for writing, created 0600 (an existing file of ours is tightened)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def state_path(state_dir: str | os.PathLike[str]) -> pathlib.Path:
    """Path of the state file in ``state_dir``."""
    return pathlib.Path(state_dir) / STATE_FILE


def write_state(state_dir: str | os.PathLike[str], state: dict[str, Any]) -> pathlib.Path:
    """Write the state file atomically (a temporary file, then :func:`os.replace`).

    A reader never sees a half-written file: either the old one, none, or the new one.
    """
    path = state_path(state_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with private_file(tmp) as f:  # pids, command lines and certificate paths: owner-only
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


API_HINT = (
    "Pass an address to dvml.connect('tls://host:8786'), start a cluster with `dvml cluster "
    "up` (found by dvml.connect() and every dvml call), or use `with dvml.LocalCluster() as "
    "cluster:`."
)
"""What to do when no cluster is recorded, for the Python API."""


def recorded_scheduler(
    state_dir: str | os.PathLike[str] | None = None, hint: str = API_HINT
) -> str:
    """The scheduler address of the running cluster recorded by ``dvml cluster up``.

    Parameters
    ----------
    state_dir : path, optional
        Where ``dvml cluster up`` wrote ``cluster.json``; None: ``dvml.cluster.state-dir``.
    hint : str
        The next step the error suggests when no cluster is recorded (the CLI names its flags).

    Raises
    ------
    NoClusterError
        No cluster is recorded in ``state_dir``.
    ClusterError
        The recorded cluster no longer runs.
    """
    directory = pathlib.Path(state_dir).expanduser() if state_dir else config.state_dir()
    state = read_state(directory)
    if state is None:
        raise NoClusterError(
            f"No cluster to use: none was given and none is recorded in "
            f"{state_path(directory)}. {hint}"
        )
    if not same_process(int(state["pid"]), state.get("start_time")):
        raise ClusterError(
            f"The cluster recorded in {state_path(directory)} ({state['scheduler_address']}) "
            f"is not running: its serve process (pid {state['pid']}) is gone. Run `dvml "
            "cluster down` to clean up, then `dvml cluster up`, or pass a scheduler address."
        )
    return str(state["scheduler_address"])


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
