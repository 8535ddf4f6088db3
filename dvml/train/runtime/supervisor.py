"""Worker side: the one supervisor of trainer processes, for every kind of job.

:class:`TrainerProcess` starts a trainer (``python -m dvml.train.runtime.trainer``) fresh, or
hands the job to the worker's warm standby (:mod:`dvml.cluster.standby`), reads its protocol
messages (:mod:`dvml.train.runtime.protocol`) on a thread, sends it commands, and waits for
the next message within bounds: a deadline, and a ``stop`` check polled a few times a second
(another trainer failed, the job's client is gone). Whatever ends a trainer, the error says
how: the reason dvml stopped it, or its exit (the signal that killed it, its last real lines
and the tail of its TensorFlow output).

:class:`ClientLease` is the client lease of every job: trainers stop when nobody waits for
them any more (the job's client disconnected, or the scheduler has not heard from it for
``dvml.train.client-timeout`` seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from dvml import config, tf_runtime
from dvml.cluster.standby import (
    Trainer,
    forked_standby,
    popen_trainer,
    start_standby_when_idle,
    stderr_tail,
    stop_trainer,
    take_standby,
)
from dvml.exceptions import ProtocolError, TrainerFailedError, TrainerStoppedError
from dvml.train.runtime.exits import describe_exit
from dvml.train.runtime.protocol import Failed, Handover, Line, encode, parse

__all__ = ["STOP_GRACE", "ClientLease", "TrainerProcess", "private_workdir"]

# Seconds a trainer gets between SIGTERM and SIGKILL: a trainer keeps nothing in memory that
# its checkpoint does not have, so a stopped job ends at once rather than after a long grace.
STOP_GRACE = 1.0
# How often a wait checks its ``stop`` condition (an abort event, the client lease).
POLL = 0.25


def private_workdir(worker: Any, prefix: str) -> str:
    """A new owner-only directory for one trainer under the worker's local directory; it is
    also the trainer's temporary directory (TensorFlow's autograph files go there)."""
    workdir = tempfile.mkdtemp(prefix=prefix, dir=worker.local_directory)
    os.makedirs(os.path.join(workdir, "tmp"), mode=0o700)
    return workdir


def _stop(proc: Trainer) -> None:
    """Close the trainer's stdin and stop its process group (SIGKILL after :data:`STOP_GRACE`)."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
    stop_trainer(proc, grace=STOP_GRACE)


class TrainerProcess:
    """One trainer process on this worker, its messages and its fate.

    Use :meth:`start`. ``name`` says which trainer it is in errors (``"trainer on worker w0"``).
    """

    def __init__(self, proc: Trainer, name: str, workdir: str) -> None:
        self.proc, self.name, self.workdir = proc, name, workdir
        self.messages: queue.Queue[Line | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=30)
        self.stopped: str | None = None  # why dvml stopped it, once it did
        self.failed: Failed | None = None  # its fatal error message, if it sent one
        self.ended_at: float | None = None
        self.threads: dict[str, Any] = {}  # its thread budget
        self.reader = threading.Thread(target=self._read, name="dvml-trainer-output", daemon=True)
        self.reader.start()

    @classmethod
    def start(
        cls,
        job: dict[str, Any],
        workdir: str,
        *,
        use_gpus: bool,
        trainers_on_host: int,
        standby: bool,
        extra_env: dict[str, str] | None = None,
    ) -> TrainerProcess:
        """Write ``job`` to ``workdir/job.json`` and start its trainer: the worker's standby
        when ``standby`` (and one is alive), else a fresh process. The trainer's thread budget
        is its share of the host's cores (``trainers_on_host``), unless configured."""
        intra, inter = job.get("threads") or (None, None)
        budget = tf_runtime.thread_budget(tf_runtime.host_cores(), trainers_on_host, intra, inter)
        env = tf_runtime.trainer_environment(os.environ, budget, use_gpus)
        env.update(extra_env or {})
        env["TMPDIR"] = os.path.join(workdir, "tmp")
        job_path = os.path.join(workdir, "job.json")
        job = {**job, "launched_at": time.time()}  # the trainer times its start from here
        with open(job_path, "w", opener=lambda p, f: os.open(p, f, 0o600)) as f:
            json.dump(job, f)
        proc = _handover(job_path, workdir, env) if standby and not use_gpus else None
        if proc is None:
            proc = popen_trainer(job_path, env, workdir, subprocess.PIPE)
        trainer = cls(proc, f"trainer on worker {job['worker_name']}", workdir)
        trainer.threads = vars(budget)
        return trainer

    def _read(self) -> None:
        for text in self.proc.stdout or ():
            try:
                line = parse(text.rstrip("\n"))
            except ProtocolError:
                line = None
            if line is None:
                self.tail.append(text.rstrip())
                continue
            if isinstance(line, Failed) and line.fatal:
                self.failed = line
            self.messages.put(line)
        self.ended_at = time.monotonic()
        self.messages.put(None)  # the process ended

    def send(self, command: Line) -> None:
        """Write one command line to the trainer (a dead trainer is reported by :meth:`next`)."""
        if self.proc.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(encode(command) + "\n")
            self.proc.stdin.flush()

    def next(self, timeout: float, stop: Callable[[], str | None] | None = None) -> Line:
        """The trainer's next message.

        Raises
        ------
        TrainerStoppedError
            ``stop()`` gave a reason, or no message came within ``timeout`` seconds: the
            trainer was stopped.
        TrainerFailedError
            The trainer ended (its exit described).
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.messages.get(timeout=POLL)
            except queue.Empty:
                reason = stop() if stop is not None else None
                if reason is None and time.monotonic() > deadline:
                    reason = f"stopped after running past the timeout of {timeout:.0f}s"
                if reason is not None:
                    self.stop(reason)
                    raise TrainerStoppedError(f"The {self.name} was {reason}.") from None
                continue
            if line is None:
                self.messages.put(None)  # and again to every later call
                raise self.failure()
            return line

    def stop(self, reason: str | None = None) -> None:
        """Stop the trainer (idempotent); ``reason`` goes into later errors."""
        if reason is not None and self.stopped is None:
            self.stopped = reason
        _stop(self.proc)

    def failure(self, said: str = "") -> TrainerFailedError:
        """The error for a trainer that ended without its result: how it ended and its last
        words (the tail of its output and of its TensorFlow output)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        error = {"type": self.failed.type, "message": self.failed.message} if self.failed else {}
        trainer_stderr = stderr_tail(self.proc, error.get("message") or "")
        if self.stopped is not None:
            message = f"it was {self.stopped}"
        else:
            lines = [*self.tail, *trainer_stderr.splitlines()]
            message = describe_exit(self.proc.returncode, error, lines)
            if error.get("message") and trainer_stderr:
                message += f"\nIts TensorFlow output ended with:\n{trainer_stderr}"
        return TrainerFailedError(f"The {self.name} (pid {self.proc.pid}) failed: {message}{said}")

    def close(self, standby_worker: Any = None) -> None:
        """Stop the trainer and remove its directory; with ``standby_worker`` (CPU jobs),
        start that worker's next standby once it is idle."""
        self.stop()
        self.reader.join(10)
        stderr_tail(self.proc)  # removes its file
        shutil.rmtree(self.workdir, ignore_errors=True)
        if standby_worker is not None:
            start_standby_when_idle(standby_worker)


def _handover(job_path: str, workdir: str, env: dict[str, str]) -> Trainer | None:
    """Hand the job to this worker's standby trainer, or to a new one forked from the
    machine's zygote; None when there is neither."""
    proc = take_standby() or forked_standby(env, workdir)
    if proc is None or proc.stdin is None:
        return None
    keys = ("TF_CONFIG", "TMPDIR", *tf_runtime.ThreadBudget(1, 1, 1).environment())
    message = Handover(job_path=job_path, cwd=workdir, env={k: env[k] for k in keys if k in env})
    try:
        proc.stdin.write(encode(message) + "\n")
        proc.stdin.flush()
    except OSError:  # it died in between: start a fresh trainer instead
        _stop(proc)
        stderr_tail(proc)
        return None
    return proc


def _client_silence(dask_scheduler: Any, client_id: str) -> float | None:
    """(Runs on the scheduler.) Seconds since it last heard from client ``client_id``; None
    when that client is not connected any more."""
    cs = dask_scheduler.clients.get(client_id)
    if cs is None:
        return None
    return time.time() - cs.last_seen


class ClientLease:
    """Whether the client of a job still waits for it (checked a few times per timeout).

    Parameters
    ----------
    worker : distributed.Worker
        The worker the trainer runs on (it asks the scheduler).
    client_id : str
        The job's client (``client.id``).
    timeout : float, optional
        Seconds of silence after which a connected client counts as gone (config
        ``dvml.train.client-timeout``).
    task_key : optional
        A task of the job running on this worker: its release (the client cancelled it or
        disconnected) ends the lease at once, without asking the scheduler.
    """

    def __init__(
        self, worker: Any, client_id: str, timeout: float | None, task_key: Any = None
    ) -> None:
        self.worker, self.client_id, self.task_key = worker, client_id, task_key
        self.timeout = float(config.get("train.client-timeout", timeout))
        # Asking the scheduler costs a round trip: a few times per timeout, at most every 2 s.
        self.interval = min(2.0, max(self.timeout / 4, 0.25))
        self.next_check = 0.0

    def lost(self) -> str | None:
        """Why the job's client no longer waits, or None while it does (from a thread other
        than the worker's event loop: it waits for the scheduler's answer)."""
        released = self.released()
        if released is not None or time.monotonic() < self.next_check:
            return released
        self.next_check = time.monotonic() + self.interval
        try:
            silence = self.worker.client.run_on_scheduler(_client_silence, client_id=self.client_id)
        except Exception:  # the scheduler is unreachable: the worker itself will go away
            return None
        return self.verdict(silence)

    async def lost_now(self) -> str | None:
        """:meth:`lost`, asking the scheduler at once, on the worker's event loop (where the
        worker's client answers with a coroutine: ``client.run`` functions run there)."""
        released = self.released()
        if released is not None:
            return released
        try:
            silence = await self.worker.client.run_on_scheduler(
                _client_silence, client_id=self.client_id
            )
        except Exception:  # the scheduler is unreachable: the worker itself will go away
            return None
        return self.verdict(silence)

    def released(self) -> str | None:
        """Why the job's client no longer waits, told by its task's release; None if not."""
        if self.task_key is not None:
            ts = self.worker.state.tasks.get(self.task_key)
            if ts is None or ts.state in ("cancelled", "released", "forgotten"):
                return "stopped because its client went away (the task was released)"
        return None

    def verdict(self, silence: float | None) -> str | None:
        """Why the job's client no longer waits, from the scheduler's ``silence`` (seconds
        since it last heard from the client; None: disconnected); None while it waits."""
        if silence is None:
            return "stopped because its client went away (disconnected); its checkpoint is kept"
        if silence > self.timeout:
            return (
                f"stopped because the scheduler has not heard from its client for "
                f"{silence:.0f}s (train.client-timeout: {self.timeout:g}s); its checkpoint "
                "is kept, a rerun resumes"
            )
        return None
