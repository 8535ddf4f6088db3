"""Child processes of the test process: what runs, what is gone, and the leak check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.helpers.polling import poll_for
from tests.helpers.trainers import inference_trainers, standby_trainers, zygotes

if TYPE_CHECKING:
    import dvml

__all__ = [
    "SESSION_CLUSTERS",
    "SESSION_PIDS",
    "assert_no_new_processes",
    "child_processes",
    "outputs_of",
    "pid_gone",
]

# Clusters that live for the whole session (conftest's cluster4 and cluster2): their
# processes are not counted by the leak check.
SESSION_CLUSTERS: list[dvml.LocalCluster] = []
# Other processes that live for the whole session (conftest's S3 server).
SESSION_PIDS: set[int] = set()


def pid_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (a zombie counts as gone: it holds nothing but its pid)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _excluded_pids() -> set[int]:
    pids: set[int] = set(SESSION_PIDS)
    for cluster in SESSION_CLUSTERS:
        pids.update(cluster.processes().values())
    # A session cluster's workers keep a standby trainer between fits (dvml.cluster.standby); it
    # belongs to the worker and is stopped with it, like the worker itself.
    for pid in list(pids):
        try:
            children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        pids.update(standby_trainers(children, idle=False))
        pids.update(zygotes(children))  # the machine's, started by a worker: it goes with them
        # ... and so does a client's inference session (evaluate/predict), kept between calls.
        pids.update(inference_trainers(children))
    return pids


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def child_processes() -> dict[int, str]:
    """Running descendants of the test process: ``{pid: command line}``.

    Zombies, multiprocessing's resource tracker (it lives as long as the interpreter) and the
    session clusters' processes are left out.
    """
    excluded = _excluded_pids()
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in excluded or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "multiprocessing.resource_tracker" in cmdline:
            continue
        found[proc.pid] = cmdline
    return found


def assert_no_new_processes(before: dict[int, str], timeout: float = 10.0) -> None:
    """Fail when a child process not in ``before`` still runs after ``timeout`` seconds."""
    new: dict[int, str] = {}

    def none_new() -> bool:
        nonlocal new
        new = {p: c for p, c in child_processes().items() if p not in before}
        # A standby trainer that a worker from before started (a pack warms one, a fit leaves
        # one) belongs to that worker and is stopped with it, like the worker itself.
        owned = {pid for pid in zygotes(new) if _parent(pid) in before}  # and their forks
        for pid in {*standby_trainers(new, idle=False), *inference_trainers(new), *owned}:
            if _parent(pid) in before or _parent(pid) in owned:
                new.pop(pid, None)
        return not new

    if not poll_for(none_new, timeout, interval=0.1):
        lines = "\n".join(f"  pid {p}: {c[:200]}" for p, c in sorted(new.items()))
        pytest.fail(f"{len(new)} child process(es) started by this test still run:\n{lines}")


def outputs_of(procs: list[Any], timeout: float = 240) -> list[str]:
    """Each process's whole output (``stdout=PIPE``, text), in order; any still running
    after it is killed, by its handle (only processes the test started)."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs
