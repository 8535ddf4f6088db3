"""Which trainer process runs which job: the victims and survivors of the fault tests.

A fault test must kill the trainer of ITS job, not whatever looks like a trainer. A command
line is not enough: a worker keeps a standby trainer (``python -m dvml.train.runtime.trainer
--standby``, dvml.cluster.standby) that is not part of any job until one is handed to it (its
command line still says ``--standby`` then), and a fresh trainer's command line names only a
file. What identifies a job's trainer is its job file: every trainer (fit's, a standby that
was handed a job, fit_multiple's serving trainer) works in the job's directory, which holds
``job.json``. :func:`job_trainers` reads it and keeps the trainers whose job has the given
values (``training="digits"``, ``model_output="mop"``, ``job_key=...``).

Standby trainers are usually forked from their machine's zygote (``python -m
dvml.train.runtime.trainer --zygote SOCKET``, dvml.cluster.zygote): such a trainer has the
zygote's command line and is the zygote's child, not its worker's; it works in its worker's
local directory (a standby) or in a job directory below it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil

__all__ = [
    "STANDBY",
    "TRAINER_MODULES",
    "cpu_capped",
    "forked_trainers",
    "half_speed",
    "inference_trainers",
    "job_trainers",
    "slowed",
    "standby_trainers",
    "worker_descendants",
    "worker_trainers",
    "zygotes",
]

# What a trainer's command line runs: fit's trainer (fresh or standby) and the hop trainer.
TRAINER_MODULES = ("dvml.train.runtime.trainer",)
STANDBY = (
    "dvml.train.runtime.trainer --standby"  # a standby's command line, also once it runs a job
)
ZYGOTE = "dvml.train.runtime.trainer --zygote"  # the zygote's, and so its forked trainers'
REFRESH_S = 1.0  # how often slowed and cpu_capped look for the job's trainers again


def _forked(proc: psutil.Process) -> bool:
    """Whether ``proc`` is a trainer forked by a zygote (the zygote's child, its command line)."""
    cmdline = proc.cmdline()
    if ZYGOTE not in " ".join(cmdline):
        return False
    parent = proc.parent()
    return parent is not None and parent.cmdline() == cmdline


def zygotes(pids: Iterable[int]) -> list[int]:
    """The pids among ``pids`` of zygotes (not the trainers they forked)."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if ZYGOTE in " ".join(proc.cmdline()) and not _forked(proc):
                found.append(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def forked_trainers() -> dict[int, str]:
    """Every live trainer forked by a zygote of this user: ``{pid: working directory}``."""
    found = {}
    for proc in psutil.process_iter():
        try:
            if _forked(proc) and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc.cwd()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _job_of(proc: psutil.Process) -> dict[str, Any] | None:
    """The job a trainer process runs (its working directory's ``job.json``), or None."""
    if not any(m in " ".join(proc.cmdline()) for m in TRAINER_MODULES):
        return None
    try:
        with open(os.path.join(proc.cwd(), "job.json")) as f:
            job = json.load(f)
    except (OSError, ValueError):  # an idle standby (no job yet), or its job just ended
        return None
    return job if isinstance(job, dict) else None


def job_trainers(pids: Iterable[int], **fields: Any) -> list[int]:
    """The pids among ``pids`` of trainers running a job whose file has every ``fields`` value.

    Idle standby trainers, processes that are not trainers and processes that are gone are left
    out; with no ``fields`` every trainer that runs a job counts. Inference sessions (the
    TensorFlow processes that serve a client's evaluate and predict, kept between calls) run
    no job: they count only when ``fields`` names ``inference`` (the client's id).
    """
    found = []
    for pid in pids:
        try:
            job = _job_of(psutil.Process(pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if job is None or (job.get("inference") and "inference" not in fields):
            continue
        if all(job.get(k) == v for k, v in fields.items()):
            found.append(pid)
    return found


def inference_trainers(pids: Iterable[int]) -> list[int]:
    """The pids among ``pids`` of inference sessions (of any client): like a standby, such a
    process belongs to its worker, and stops with it, its client or its idle timeout."""
    found = []
    for pid in pids:
        try:
            job = _job_of(psutil.Process(pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if job is not None and job.get("inference"):
            found.append(pid)
    return found


def standby_trainers(pids: Iterable[int], idle: bool = True) -> list[int]:
    """The pids among ``pids`` of standby trainers: those still waiting for a job (``idle``),
    or every one started as a standby, also once it was handed a job (``idle=False``)."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            started = STANDBY in " ".join(proc.cmdline()) or _forked(proc)
            if started and not (idle and _job_of(proc)):
                found.append(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def worker_descendants(cluster: Any, worker: str | None = None) -> list[int]:
    """Pids of every process of the cluster's Dask workers (or of ``worker``): below their
    processes, and the trainers forked for them, which work in their local directories."""
    pids, directories = [], []
    for name, pid in cluster.processes().items():
        if not name.startswith("dask worker ") or worker not in (None, name[len("dask worker ") :]):
            continue
        directories.append(os.path.join(cluster.directory, "dask", name[len("dask worker ") :]))
        try:
            pids.extend(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    forked = forked_trainers()  # below the worker that started the zygote, whoever's they are
    mine = [p for p, cwd in forked.items() if any(_below(cwd, d) for d in directories)]
    return [p for p in pids if p not in forked] + mine


def _below(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + os.sep)


def worker_trainers(cluster: Any, worker: str | None = None, **fields: Any) -> list[int]:
    """The trainers (:func:`job_trainers`) of a LocalCluster's workers, or of ``worker`` only."""
    return job_trainers(worker_descendants(cluster, worker), **fields)


def _duty_cycle(find: Callable[[], list[int]], stopped: float, stop: threading.Event) -> None:
    pids: list[int] = []
    found_at = 0.0
    while not stop.is_set():
        if time.monotonic() - found_at >= REFRESH_S or not pids:
            # found again every second: a job that restarts its trainers (an elastic fit going
            # on from a checkpoint) is slowed on its new ones too
            pids, found_at = find(), time.monotonic()
        if not pids:
            stop.wait(0.02)
            continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stop.wait(stopped)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop.wait(0.1 - stopped)


@contextlib.contextmanager
def slowed(find: Callable[[], list[int]], stopped: float = 0.05) -> Iterator[None]:
    """Slow the processes ``find()`` lists (found again every second) for the ``with`` block:
    stopped ``stopped`` s of every 0.1 s. Never stopped for long: a trainer still answers its
    peers' heartbeats (a TensorFlow collective's coordination service fails a job whose task
    is silent for seconds)."""
    stop = threading.Event()
    slower = threading.Thread(target=_duty_cycle, args=(find, stopped, stop))
    slower.start()
    try:
        yield
    finally:
        stop.set()
        slower.join()


def half_speed(cluster: Any, worker: str, **fields: Any) -> contextlib.AbstractContextManager[None]:
    """Slow ``worker``'s trainers of the job with ``fields`` (:func:`job_trainers`) to about
    half speed for the ``with`` block: stopped 50 ms of every 100 (found again every second)."""
    return slowed(lambda: worker_trainers(cluster, worker, **fields))


@contextlib.contextmanager
def cpu_capped(find: Callable[[], list[int]], cpus: float) -> Iterator[None]:
    """Cap the processes ``find()`` lists (found again every second) at ``cpus`` cores for the
    ``with`` block: a cgroup v1 CPU quota (:mod:`dvml.testing.netns_os`), removed after it.

    Unlike :func:`slowed`'s stops, a quota is spent by the work a trainer does: one waiting in
    a collective spends little, so its slowness is its compute's, as on a slower machine.
    """
    from dvml.testing.netns_os import make_cpu_cgroup, move_to_cgroup, remove_cgroup

    path = make_cpu_cgroup(f"dvml-test-capped-{os.getpid()}-{time.monotonic_ns()}", cpus)
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            move_to_cgroup(path, find())
            stop.wait(REFRESH_S)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        yield
    finally:
        stop.set()
        follower.join()
        problem = remove_cgroup(path)
        if problem:
            raise RuntimeError(f"the test's CPU cgroup was not removed: {problem}")
