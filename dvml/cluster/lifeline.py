"""Daemons that never outlive the process that owns them, and the sweep of what a dead one left.

A process that owns a LocalCluster can die without running any clean-up (SIGKILL, the OOM
killer). Two guards:

- every etcd and vineyardd is started with ``PR_SET_PDEATHSIG`` = SIGKILL (Linux): the kernel
  kills it when its parent dies. The signal fires when the parent THREAD that forked the child
  exits, not the process, so every daemon is forked by :func:`spawn`'s one long-lived thread
  (a daemon thread that lives as long as the process), never by a short-lived start thread.
  The Dask workers die with their Nanny's process by themselves (distributed watches its
  parent), and the scheduler runs inside the owner.
- the cluster directory holds ``owner.json`` (pid, start time and command line of the owner):
  :func:`sweep_dead_clusters` removes the directories whose owner is proven gone. It runs when
  a LocalCluster starts and in ``dvml cluster status`` and ``down``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "CLUSTER_DIR_PREFIX",
    "OWNER_FILE",
    "ProcessIdentity",
    "identity_of",
    "is_same_process",
    "spawn",
    "sweep_dead_clusters",
    "write_owner",
]

logger = logging.getLogger("dvml.cluster")

CLUSTER_DIR_PREFIX = "dvml-cluster-"
OWNER_FILE = "owner.json"
_PR_SET_PDEATHSIG = 1

ProcessIdentity = dict[str, Any]  # {"pid": int, "start_time": float, "cmdline": [str, ...]}


# -- identity ------------------------------------------------------------------------------


def identity_of(pid: int) -> ProcessIdentity | None:
    """The pid, start time and command line of a running process; None when it does not run."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return {"pid": pid, "start_time": float(proc.create_time()), "cmdline": proc.cmdline()}
    except psutil.Error:
        return None


def is_same_process(recorded: ProcessIdentity | None) -> bool:
    """Whether the recorded process still runs: pid, start time AND command line must match.

    A record that lacks one of them proves nothing and answers False, so that nothing is ever
    signalled on an unproven identity (a pid reused by another process, pid 1 in a forged file).
    """
    if not recorded or not isinstance(recorded, dict):
        return False
    pid, start, cmdline = recorded.get("pid"), recorded.get("start_time"), recorded.get("cmdline")
    if not isinstance(pid, int) or pid <= 1 or start is None or not cmdline:
        return False
    now = identity_of(pid)
    if now is None:
        return False
    return abs(now["start_time"] - float(start)) < 1.0 and list(now["cmdline"]) == list(cmdline)


# -- spawning ------------------------------------------------------------------------------


def _die_with_parent(parent: int) -> Callable[[], None]:
    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will kill us
            os._exit(1)

    return preexec


_REQUESTS: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = queue.Queue()
_SPAWNER: threading.Thread | None = None
_SPAWNER_LOCK = threading.Lock()


def _serve_requests() -> None:
    while True:
        job, reply = _REQUESTS.get()
        try:
            reply.put((True, job()))
        except BaseException as exc:  # handed back to the caller
            reply.put((False, exc))


def spawn(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen_kwargs)`` for a child that dies with this process.

    On Linux the child gets ``PR_SET_PDEATHSIG`` = SIGKILL and is forked by one long-lived
    thread (see the module doc). Elsewhere it is a plain Popen.
    """
    if not sys.platform.startswith("linux"):
        return subprocess.Popen(argv, **popen_kwargs)
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or not _SPAWNER.is_alive():
            _SPAWNER = threading.Thread(target=_serve_requests, name="dvml-spawner", daemon=True)
            _SPAWNER.start()
    parent = os.getpid()
    reply: queue.Queue[Any] = queue.Queue()
    _REQUESTS.put(
        (lambda: subprocess.Popen(argv, preexec_fn=_die_with_parent(parent), **popen_kwargs),
         reply)
    )  # fmt: skip
    ok, value = reply.get()
    if not ok:
        raise value
    return value


# -- the owner file and the sweep ----------------------------------------------------------


def write_owner(directory: str) -> None:
    """Record this process as the owner of the cluster directory ``directory``."""
    me = identity_of(os.getpid())
    path = pathlib.Path(directory) / OWNER_FILE
    tmp = path.with_name(f".{OWNER_FILE}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(me, f)
    os.replace(tmp, path)


def _owner_gone(directory: pathlib.Path) -> bool:
    try:
        with open(directory / OWNER_FILE) as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return False  # no record (still starting, or not ours): leave it alone
    if not isinstance(owner, dict) or not owner.get("start_time") or not owner.get("cmdline"):
        return False
    return not is_same_process(owner)


def sweep_dead_clusters(
    root: str | None = None, min_age: float = 0.0, only: str | None = None
) -> list[str]:
    """Remove the cluster directories under ``root`` whose owner process is proven gone.

    Only directories named ``dvml-cluster-*`` that belong to this user and hold an
    ``owner.json`` naming a process that no longer runs (pid, start time and command line) are
    removed; their daemons died with the owner (``PR_SET_PDEATHSIG``). ``only`` restricts the
    sweep to the directory of that name. Returns what was removed.
    """
    import tempfile

    base = pathlib.Path(root or tempfile.gettempdir())
    removed: list[str] = []
    try:
        candidates = list(base.glob(f"{CLUSTER_DIR_PREFIX}*"))
        if only is not None:
            candidates = [c for c in candidates if c.name == only]
    except OSError:
        return removed
    now = time.time()
    for directory in candidates:
        try:
            st = directory.lstat()
            if not directory.is_dir() or directory.is_symlink() or st.st_uid != os.getuid():
                continue
            # Age from the owner's record, written once at its start: the directory's own
            # mtime moves when a dying daemon removes its socket there.
            record = directory / OWNER_FILE
            born = record.stat().st_mtime if record.exists() else st.st_mtime
            if now - born < min_age:
                continue
        except OSError:
            continue
        if _owner_gone(directory):
            shutil.rmtree(directory, ignore_errors=True)
            logger.info("removed %s, left by a cluster owner that is gone", directory)
            removed.append(str(directory))
    return removed
