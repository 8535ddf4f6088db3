"""Trainer processes on a Dask worker, and the one *standby* trainer each worker keeps warm.

A trainer is ``python -m dvml.train.runtime.trainer`` in its own session (so that
:func:`stop_trainer` ends TensorFlow's children too), its fd 2 in a file whose tail goes into a
failure's message (:func:`stderr_tail`). The trainer runtime (:mod:`dvml.train.runtime`) runs
one per job and worker; this module only starts, stops and hands out processes, so that the
preprocessors (a lower layer than ``dvml.train``) can warm the future trainers too.

Standby trainers: importing TensorFlow is most of a trainer's start (~5 s of one core), so a
worker keeps ONE ``python -m dvml.train.runtime.trainer --standby`` that imports TensorFlow and
tf-keras and waits on stdin; the next CPU job is handed to it (:func:`take_standby`). It still
runs one job and exits. When the standby starts matters, as its import takes a core:

- after a fit (:func:`start_standby_when_idle`): only once the worker has run no task for
  :data:`QUIET_SECONDS` and no trainer or other seceded task runs on it, so the standby does
  not compete with an ``evaluate`` that follows the fit (measured in B4a), nor with another
  fit's trainer. dvml's own fit control tasks (a port, a checkpoint look-up or clean-up) do
  not count as work: a fit that follows a fit still finds its standby warm.
- when a training set is preprocessed (:func:`warm_trainers`): at once, on the workers that
  will hold it, so the first fit does not pay the process start and the import.

Either way the standby imports at a lower CPU priority (``nice`` +10 for its import thread,
:mod:`dvml.train.runtime.trainer`), so it takes the cores only when nothing else wants them; the job
itself runs at normal priority. GPU jobs always get a fresh process (see
:mod:`dvml.train.runtime.launch`): a standby hides every GPU.

Where it can (Linux, ``dvml.train.fork-trainers``, the default), a standby is not a process of
its own but forked from its machine's *zygote* (:mod:`dvml.cluster.zygote`), which imported
TensorFlow once for every worker of the machine: a standby then starts in milliseconds, and a
CPU job that finds none forks one as quickly. A standby is stopped when its worker
closes (a WorkerPlugin's teardown, and ``atexit``) and exits by itself when its stdin closes,
so a killed worker leaves none behind. ``dvml.train.standby-trainer: false`` turns it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from dvml import config, tf_runtime
from dvml.cluster import zygote
from dvml.cluster.isolation import TRAINER_NAMESPACE_ENV, trainer_prefix
from dvml.cluster.zygote import ForkedProcess
from dvml.exceptions import ClusterError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

__all__ = [
    "QUIET_SECONDS",
    "Trainer",
    "add_busy_probe",
    "forked_standby",
    "popen_trainer",
    "standby_pid",
    "start_standby",
    "start_standby_when_idle",
    "stderr_tail",
    "stop_standby",
    "stop_trainer",
    "take_standby",
    "warm_trainers",
]

# How long a worker must have run no task before a deferred standby starts: longer than the
# gap between a fit and an evaluate that follows it (the client saves the model, reads it
# back and ships it; not measured apart, a fraction of a second in B4a). A fit's own control
# tasks do not reset it.
QUIET_SECONDS = 1.5
# Tasks of dvml's fit control path (keys start with the function's name): not "work".
_CONTROL_TASKS = ("reserve_port-", "checkpoint_state-", "clear_checkpoint-")

_LOCK = threading.Lock()
# "proc": this worker's standby, "wanted": a deferred start is pending, "watcher": its thread,
# "registered": the teardown is in place.
_STANDBY: dict[str, Any] = {}
_PLUGIN_NAME = "dvml-standby-trainer"
logger = logging.getLogger("dvml.cluster")

Trainer = subprocess.Popen[str] | ForkedProcess
"""A trainer process: a subprocess of the worker, or forked by its machine's zygote."""

# This worker process's connections to its machine's zygote, by socket path.
_ZYGOTES: dict[str, zygote.Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()

# pid of a trainer → the file that receives its fd 2 (TensorFlow's C++ output goes there
# before Python's logging exists); its tail goes into the error when the trainer fails.
_STDERR_LOGS: dict[int, str] = {}


def _trainer_command(arg: str) -> list[str]:
    # In a LocalCluster's private network namespace where it has one: TensorFlow's gRPC
    # server listens on every interface (dvml.cluster.isolation).
    prefix = trainer_prefix(os.environ)
    return [*prefix, sys.executable, "-m", "dvml.train.runtime.trainer", arg]


def popen_trainer(arg: str, env: dict[str, str], cwd: str, stdin: Any) -> Trainer:
    """Start ``python -m dvml.train.runtime.trainer ARG`` in its own session, stdout piped
    (a standby, ``--standby``, is forked from this machine's zygote where it can be)."""
    proc = forked_standby(env, cwd) if arg == "--standby" else None
    if proc is not None:
        return proc
    stderr, path, env = _stderr_file(env, cwd)
    try:
        popen = subprocess.Popen(
            _trainer_command(arg),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if stderr is None else stderr,
            stdin=stdin,
            env=env,
            text=True,
            start_new_session=True,  # its own process group: stop_trainer ends its children
            cwd=cwd,
        )
    finally:
        if stderr is not None:
            os.close(stderr)
    if path is not None:
        _STDERR_LOGS[popen.pid] = path
    return popen


def _stderr_file(env: dict[str, str], cwd: str) -> tuple[int | None, str | None, dict[str, str]]:
    """The trainer's fd 2: a new file in ``cwd`` (its descriptor and path), or None for its
    stdout pipe where ``dvml.tf.show-startup-log`` lets TensorFlow's start-up output through."""
    if tf_runtime.show_startup_log():
        return None, None, env
    fd, path = tempfile.mkstemp(prefix="dvml-trainer-", suffix=".stderr", dir=cwd)
    return fd, path, {**env, tf_runtime.STDERR_CAPTURED_ENV: "1"}


def forked_standby(env: dict[str, str], cwd: str) -> ForkedProcess | None:
    """A standby trainer forked from this machine's zygote (:mod:`dvml.cluster.zygote`);
    None when ``dvml.train.fork-trainers`` is off or no zygote answers (the caller then
    starts a process of its own)."""
    if not config.get("train.fork-trainers") or not sys.platform.startswith("linux"):
        return None
    stderr, path, env = _stderr_file(env, cwd)
    try:
        socket_path = zygote.socket_path(env, os.environ.get(TRAINER_NAMESPACE_ENV, ""))
        with _ZYGOTES_LOCK:
            machine = _ZYGOTES.get(socket_path)
            if machine is None:
                command = _trainer_command("--zygote")
                machine = _ZYGOTES[socket_path] = zygote.Zygote(socket_path, command, env)
        proc = machine.fork(env, cwd, stderr)
    except (OSError, ClusterError) as exc:
        logger.warning("Starting a trainer as a process of its own: %s", exc)
        if path is not None:
            os.unlink(path)
        return None
    finally:
        if stderr is not None:
            os.close(stderr)
    if path is not None:
        _STDERR_LOGS[proc.pid] = path
    return proc


def stderr_tail(proc: Trainer, said: str = "", lines: int = 20) -> str:
    """The last ``lines`` lines the trainer wrote to fd 2 before the traceback of the error it
    reported (``said`` holds that error already); its file is removed."""
    path = _STDERR_LOGS.pop(proc.pid, None)
    if path is None:
        return ""
    try:
        with open(path, errors="replace") as f:
            written = [x.rstrip() for x in f]
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if said:
        starts = [i for i, x in enumerate(written) if x == "Traceback (most recent call last):"]
        written = written[: starts[-1]] if starts else written
    known = {x.strip() for x in said.splitlines()}
    return "\n".join(deque((x for x in written if x.strip() and x.strip() not in known), lines))


def stop_trainer(proc: Trainer, grace: float = 10.0) -> None:
    """SIGTERM the trainer's process group, then SIGKILL after ``grace`` seconds; always reap
    it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        proc.wait(10)


def _discard(proc: Trainer) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    stop_trainer(proc)
    stderr_tail(proc)  # removes its file


def stop_standby(final: bool = False) -> None:
    """Stop this worker process's standby trainer, if any, and any deferred start (one on
    its way is stopped once it arrives).

    ``final`` (the worker closes): no standby starts in this process any more.
    """
    with _LOCK:
        proc = _STANDBY.pop("proc", None)
        _STANDBY["wanted"] = False
        _STANDBY["discard"] = _STANDBY.get("starting")
        if final:
            _STANDBY["closed"] = True
    if proc is not None:
        _discard(proc)
    if final:
        with _ZYGOTES_LOCK:
            machines = list(_ZYGOTES.values())
            _ZYGOTES.clear()
        for machine in machines:
            machine.close()


class _StandbyPlugin:
    """Stops the standby trainer when the worker closes (a distributed WorkerPlugin)."""

    name = _PLUGIN_NAME

    def setup(self, worker: Any) -> None:
        pass

    def teardown(self, worker: Any) -> None:
        stop_standby(final=True)

    def transition(self, *args: Any, **kwargs: Any) -> None:
        pass


def _register_teardown(worker: Any) -> None:
    """Once per worker process: stop the standby on worker close and at interpreter exit."""
    if _STANDBY.get("registered"):
        return
    _STANDBY["registered"] = True
    import atexit

    from distributed.diagnostics.plugin import WorkerPlugin

    plugin = type("StandbyTrainerPlugin", (_StandbyPlugin, WorkerPlugin), {})()
    worker.loop.add_callback(worker.plugin_add, plugin=plugin, name=_PLUGIN_NAME)
    atexit.register(stop_standby, final=True)


def start_standby(dask_worker: Any = None) -> None:
    """Start this worker's standby trainer now, unless one is alive (CPU jobs only).

    Runs in a task, or with ``client.run(start_standby)`` to warm every worker before a fit.
    """
    from distributed import get_worker

    worker = dask_worker or get_worker()
    with _LOCK:
        _STANDBY["wanted"] = False
        proc = _STANDBY.get("proc")
        if (proc is not None and proc.poll() is None) or _STANDBY.get("closed"):
            return
        if not _running(worker) or _STANDBY.get("starting"):  # closing, or on its way
            return
        # In a thread: a fork waits for the zygote's import the first time (seconds), and
        # the caller (a pack's warm-up) must not.
        starting = threading.Thread(
            target=_start, args=(worker.local_directory,), name="dvml-standby-start", daemon=True
        )
        _STANDBY["starting"] = starting
        starting.start()
    _register_teardown(worker)


def _start(cwd: str) -> None:
    """(A thread of :func:`start_standby`.) Start the standby and keep it, unless the worker
    closed meanwhile."""
    proc = None
    try:
        env = tf_runtime.trainer_environment(os.environ, None, use_gpus=False)
        proc = popen_trainer("--standby", env, cwd, subprocess.PIPE)
    finally:
        with _LOCK:
            _STANDBY.pop("starting", None)
            stopped = _STANDBY.pop("discard", None) is threading.current_thread()
            stopped = stopped or bool(_STANDBY.get("closed"))
            keep = proc is not None and not stopped and "proc" not in _STANDBY
            if keep:
                _STANDBY["proc"] = proc
        if proc is not None and not keep:
            _discard(proc)


def take_standby() -> Trainer | None:
    """This worker's live standby, now owned by the caller (None when there is none).

    A deferred start still pending is dropped: the caller runs a job now and asks again
    (:func:`start_standby_when_idle`) when it ends.
    """
    with _LOCK:
        starting = _STANDBY.get("starting")
    if starting is not None:  # on its way: the job would wait for a fresh one as long
        starting.join(zygote.START_TIMEOUT)
    with _LOCK:
        proc = _STANDBY.pop("proc", None)
        _STANDBY["wanted"] = False
    if proc is None:
        return None
    if proc.poll() is not None or proc.stdin is None:
        _discard(proc)
        return None
    return proc


# Work of this worker that runs outside its tasks: while one of these says True, a deferred
# standby waits (dvml.train.runtime.sessions adds one: an inference session serving a call).
_BUSY_PROBES: list[Callable[[], bool]] = []


def add_busy_probe(probe: Callable[[], bool]) -> None:
    """Count ``probe()`` (True: busy) as work of this worker for a deferred standby's start.

    Layers above this module register their own work without this module importing them.
    """
    with _LOCK:
        if probe not in _BUSY_PROBES:
            _BUSY_PROBES.append(probe)


def _busy(worker: Any) -> bool:
    """Whether the worker runs work: a task other than fit's control tasks, a seceded one
    (a trainer's launcher, or any long task that gave its slot back), or a busy probe's."""
    if any(probe() for probe in list(_BUSY_PROBES)):
        return True
    state = worker.state
    try:
        if state.long_running or state.ready or state.constrained:
            return True
        keys = [str(ts.key) for ts in list(state.executing)]
    except RuntimeError:  # the set changed while we copied it: it is busy
        return True
    return any(not key.startswith(_CONTROL_TASKS) for key in keys)


def _running(worker: Any) -> bool:
    return getattr(getattr(worker, "status", None), "name", "running") in ("running", "paused")


def _watch(worker: Any, quiet: float, poll: float) -> None:
    """Start the standby once the worker has been idle for ``quiet`` seconds (see above)."""
    since = time.monotonic()
    try:
        while _running(worker):
            time.sleep(poll)
            with _LOCK:
                if not _STANDBY.get("wanted"):
                    return
            if _busy(worker):
                since = time.monotonic()
            elif time.monotonic() - since >= quiet:
                start_standby(worker)
                return
    finally:
        with _LOCK:
            if _STANDBY.get("watcher") is threading.current_thread():
                _STANDBY.pop("watcher", None)


def start_standby_when_idle(
    dask_worker: Any = None, quiet: float = QUIET_SECONDS, poll: float = 0.1
) -> None:
    """Start this worker's standby once the worker is idle (see the module docstring).

    Returns at once; a thread of the worker process waits. Nothing happens when a standby is
    alive, and a job that takes the standby meanwhile (:func:`take_standby`) cancels it.
    """
    from distributed import get_worker

    worker = dask_worker or get_worker()
    with _LOCK:
        proc = _STANDBY.get("proc")
        if (proc is not None and proc.poll() is None) or _STANDBY.get("closed"):
            return
        _STANDBY["wanted"] = True
        watcher = _STANDBY.get("watcher")
        if watcher is not None and watcher.is_alive():
            return
        watcher = threading.Thread(
            target=_watch, args=(worker, quiet, poll), name="dvml-standby-when-idle", daemon=True
        )
        _STANDBY["watcher"] = watcher
    watcher.start()


def standby_pid(dask_worker: Any = None) -> int | None:
    """The pid of this worker's live standby trainer, or None (for status and tests)."""
    with _LOCK:
        proc = _STANDBY.get("proc")
    return proc.pid if proc is not None and proc.poll() is None else None


def warm_trainers(client: Client, workers: Sequence[WorkerInfo]) -> None:
    """Start a standby trainer now on each of ``workers`` that has no GPU (returns at once).

    Called when a training set is being preprocessed: its workers are the next fit's
    trainers, and the import then overlaps the packing (at a lower priority) instead of
    delaying the fit. Does nothing when ``dvml.train.standby-trainer`` is false.
    """
    if not config.get("train.standby-trainer"):
        return
    addresses = [w.address for w in workers if not w.gpus]
    if addresses:
        # A Popen per worker (milliseconds). Best effort: a worker that cannot start one now
        # gets a fresh trainer at the fit, as without a standby.
        client.run(start_standby, workers=addresses, on_error="ignore")
