"""Worker-side launch of trainer processes (these functions run as pinned Dask tasks).

:func:`run_trainer` starts ``python -m dvml.train.trainer`` on its worker, forwards its
progress lines to the client (``worker.log_event``), and stops it when the job's abort event
is set (another trainer failed), when it runs past the job's timeout, or when it fails. The
trainer is a child process, not a thread, so TensorFlow and its GPU memory go away with it.

Standby trainers: importing TensorFlow is most of a trainer's start (several seconds), so after
a job each worker starts ONE standby trainer (``python -m dvml.train.trainer --standby``) that
imports TensorFlow and tf-keras and waits on stdin; the next CPU job is handed to it (its
``TF_CONFIG`` and thread budget are set then, before TensorFlow's runtime starts). It still
runs one job and exits. GPU jobs (``use_gpus=True``) always get a fresh process: a standby is
started with every GPU hidden (``CUDA_VISIBLE_DEVICES=-1``, read when CUDA initialises, which
may already happen while TensorFlow loads), so it could not use one, and a fresh process per
GPU job keeps the rule that its GPU memory goes with it. A standby is stopped when its worker
closes (a WorkerPlugin's teardown, and ``atexit``) and exits by itself when its stdin closes,
so a killed worker leaves none behind. ``dvml.train.standby-trainer: false`` turns it off.

Control path: a launcher gives its worker thread back as soon as it starts
(``distributed.secede``), so a fit never holds a worker's task slots: other dvml calls run on
the workers while trainers train, and two fits on single-thread workers cannot deadlock each
other.

Client lease: a launcher stops its trainer (SIGTERM, then SIGKILL; the checkpoint stays, so a
rerun resumes) when nobody waits for the result any more: its task was released (the fit's
client disconnected or cancelled it), or the scheduler has not heard from any client that
wants the result for ``job["client_timeout"]`` seconds (a client that hangs or was cut off).

Thread budget: each trainer gets the cores of its host divided by the trainers of the fit
placed on that host (``job["trainers_on_host"]``), unless the user set
``dvml.train.intra-op-threads`` / ``inter-op-threads`` (see :func:`dvml.tf_runtime.thread_budget`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

from dvml import config, tf_runtime
from dvml.exceptions import TrainerFailedError, TrainingError
from dvml.train.exits import describe_exit

__all__ = ["checkpoint_state", "clear_checkpoint", "reserve_port", "run_trainer"]

PROTOCOL_PREFIX = "DVML "


def reserve_port() -> tuple[str, int]:
    """A free TCP port on this worker's host and the address other trainers reach it at."""
    from distributed import get_worker

    host = get_worker().address.split("://")[-1].rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return host, int(s.getsockname()[1])


def checkpoint_state(directory: str, worker_name: str) -> dict[str, Any] | None:
    """This worker's last checkpoint (iteration, history, job key, weights), or None."""
    path = os.path.join(directory, f"{worker_name}.npz")
    try:
        with open(path + ".json") as f:
            state = json.load(f)
        with open(path, "rb") as f:
            state["weights"] = f.read()
    except (OSError, ValueError):
        return None
    return dict(state)


def clear_checkpoint(directory: str) -> None:
    """Remove a finished job's checkpoints on this worker."""
    shutil.rmtree(directory, ignore_errors=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the trainer's process group, then SIGKILL; always reap it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        proc.wait(10)


_STANDBY_LOCK = threading.Lock()
_STANDBY: dict[str, Any] = {}  # "proc": this worker's standby trainer, if any
_PLUGIN_NAME = "dvml-standby-trainer"


def _trainer_command(arg: str) -> list[str]:
    return [sys.executable, "-m", "dvml.train.trainer", arg]


# pid of a trainer → the file that receives its fd 2 (TensorFlow's C++ output goes there
# before Python's logging exists); its tail goes into the error when the trainer fails.
_STDERR_LOGS: dict[int, str] = {}


def _popen(arg: str, env: dict[str, str], cwd: str, stdin: Any) -> subprocess.Popen[str]:
    if tf_runtime.show_startup_log():
        stderr: Any = subprocess.STDOUT  # into the output pipe, as before
        path = None
    else:
        fd, path = tempfile.mkstemp(prefix="dvml-trainer-", suffix=".stderr", dir=cwd)
        stderr = fd
        env = {**env, tf_runtime.STDERR_CAPTURED_ENV: "1"}
    try:
        proc = subprocess.Popen(
            _trainer_command(arg),
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=stdin,
            env=env,
            text=True,
            start_new_session=True,  # its own process group: _stop ends TensorFlow's children
            cwd=cwd,
        )
    finally:
        if path is not None:
            os.close(stderr)
    if path is not None:
        _STDERR_LOGS[proc.pid] = path
    return proc


def _stderr_tail(proc: subprocess.Popen[str], said: str = "", lines: int = 20) -> str:
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


def stop_standby() -> None:
    """Stop this worker process's standby trainer, if any (idempotent)."""
    with _STANDBY_LOCK:
        proc = _STANDBY.pop("proc", None)
    if proc is not None:
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        _stop(proc)
        _stderr_tail(proc)  # removes its file


class _StandbyPlugin:
    """Stops the standby trainer when the worker closes (a distributed WorkerPlugin)."""

    name = _PLUGIN_NAME

    def setup(self, worker: Any) -> None:
        pass

    def teardown(self, worker: Any) -> None:
        stop_standby()

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
    atexit.register(stop_standby)


def start_standby(dask_worker: Any = None) -> None:
    """Start this worker's standby trainer unless one is alive (CPU jobs only, see above).

    Runs in a task, or with ``client.run(start_standby)`` to warm every worker before a fit.
    """
    from distributed import get_worker

    worker = dask_worker or get_worker()
    with _STANDBY_LOCK:
        proc = _STANDBY.get("proc")
        if proc is not None and proc.poll() is None:
            return
        env = tf_runtime.trainer_environment(os.environ, None, use_gpus=False)
        _STANDBY["proc"] = _popen("--standby", env, worker.local_directory, subprocess.PIPE)
    _register_teardown(worker)


def _take_standby(job: dict[str, Any], env: dict[str, str], workdir: str, job_path: str) -> Any:
    """Hand the job to this worker's standby trainer; None when there is none alive."""
    with _STANDBY_LOCK:
        proc = _STANDBY.pop("proc", None)
    if proc is None or proc.poll() is not None or proc.stdin is None:
        if proc is not None:
            _stop(proc)
            _stderr_tail(proc)
        return None
    keys = ("TF_CONFIG", *tf_runtime.ThreadBudget(1, 1, 1).environment())
    message = {
        "job_path": job_path,
        "cwd": workdir,
        "env": {k: env[k] for k in keys if k in env},
    }
    try:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.close()
    except OSError:  # it died in between: start a fresh trainer instead
        _stop(proc)
        _stderr_tail(proc)
        return None
    return proc


def run_trainer(
    job: dict[str, Any],
    weights: bytes | None,
    topic: str,
    abort_event: str,
    timeout: float,
) -> dict[str, Any]:
    """Run one trainer process to completion and return its result.

    Returns
    -------
    dict
        ``worker``, ``weights_sha256``, ``iterations`` (this trainer's progress records),
        ``local_rows``, and ``weights`` (bytes) from the chief (task index 0) only.

    Raises
    ------
    TrainerFailedError
        Naming the worker, the exit code and the trainer's last words.
    """
    from distributed import Event, get_worker, secede

    worker = get_worker()
    task_key = worker.get_current_task()
    # From here on this task runs outside the worker's thread pool: the slot is free for other
    # tasks (datasets.list, another fit's launcher) while the trainer runs.
    secede()
    workdir = tempfile.mkdtemp(prefix="dvml-trainer-", dir=worker.local_directory)
    job = dict(job)
    job["worker_name"] = str(worker.name)
    job["output_weights_path"] = os.path.join(workdir, "weights.npz")
    if weights is not None:
        job["weights_path"] = os.path.join(workdir, "initial.npz")
        with open(job["weights_path"], "wb") as initial:
            initial.write(weights)
    job_path = os.path.join(workdir, "job.json")
    use_standby = bool(job.get("standby", True)) and not job["use_gpus"]
    intra, inter = job.get("threads") or (None, None)
    budget = tf_runtime.thread_budget(
        tf_runtime.host_cores(), int(job.get("trainers_on_host") or 1), intra, inter
    )
    env = tf_runtime.trainer_environment(os.environ, budget, job["use_gpus"])
    env["TF_CONFIG"] = json.dumps(job["tf_config"])

    records: list[dict[str, Any]] = []
    resolved: dict[str, Any] = {}
    done: dict[str, Any] = {}
    error: dict[str, Any] = {}
    startup: dict[str, Any] = {"threads": vars(budget)}
    tail: deque[str] = deque(maxlen=30)

    job["launched_at"] = time.time()  # wall clock: the trainer measures its start from here
    with open(job_path, "w") as job_file:
        json.dump(job, job_file)
    proc = _take_standby(job, env, workdir, job_path) if use_standby else None
    if proc is None:
        proc = _popen(job_path, env, workdir, subprocess.DEVNULL)

    def read_output() -> None:
        for line in proc.stdout or ():
            if not line.startswith(PROTOCOL_PREFIX):
                tail.append(line.rstrip())
                continue
            message = json.loads(line[len(PROTOCOL_PREFIX) :])
            kind = message.pop("kind")
            message["worker"] = job["worker_name"]
            if kind == "iteration":
                records.append(message)
            elif kind == "resolved":
                resolved.update(message)
            elif kind == "done":
                done.update(message)
            elif kind == "error":
                error.update(message)
            elif kind == "startup":
                startup.update(message)
            worker.log_event(topic, {"kind": kind, **message})

    reader = threading.Thread(target=read_output, name="dvml-trainer-output", daemon=True)
    reader.start()
    abort = Event(abort_event)
    deadline = time.monotonic() + timeout
    lease = _ClientLease(worker, task_key, job.get("client_timeout"))
    reason = None
    try:
        while proc.poll() is None:
            time.sleep(0.25)
            if abort.is_set():
                reason = "stopped because another trainer failed"
                break
            if time.monotonic() > deadline:
                reason = f"stopped after running past the timeout of {timeout:.0f}s"
                break
            gone = lease.lost()
            if gone is not None:
                reason = f"stopped because {gone}; its checkpoint is kept, a rerun resumes"
                break
    finally:
        _stop(proc)
        reader.join(10)
        if use_standby:  # for the next job; it imports while this worker idles
            start_standby()
    stderr_tail = _stderr_tail(proc, error.get("message") or "")
    try:
        if reason is not None:
            raise TrainingError(f"The trainer on {job['worker_name']} was {reason}.")
        if proc.returncode != 0 or not done:
            # The trainer's stdout tail and its fd 2 (TensorFlow's own output, in a file):
            # describe_exit drops TensorFlow's start-up banner from both.
            message = describe_exit(proc.returncode, error, [*tail, *stderr_tail.splitlines()])
            if error.get("message") and stderr_tail:
                message += f"\nIts TensorFlow output ended with:\n{stderr_tail}"
            raise TrainerFailedError(
                f"The trainer on worker {job['worker_name']} (pid {proc.pid}) failed: {message}"
            )
        result = {
            "worker": job["worker_name"],
            "weights_sha256": done["weights_sha256"],
            "local_rows": done["local_rows"],
            "iterations": records,
            "resolved": resolved,
            "startup": startup,
            "weights": None,
        }
        if job["tf_config"]["task"]["index"] == 0:
            with open(done["weights_path"], "rb") as final:
                result["weights"] = final.read()
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _client_silence(dask_scheduler: Any, key: Any) -> float | None:
    """(Runs on the scheduler.) Seconds since it last heard from the freshest client that
    wants ``key``; None when no connected client wants it any more."""
    ts = dask_scheduler.tasks.get(key)
    if ts is None or not ts.who_wants:
        return None
    now = time.time()
    return min(now - cs.last_seen for cs in ts.who_wants)


class _ClientLease:
    """Whether anybody still waits for this launcher's result (see the module docstring)."""

    def __init__(self, worker: Any, key: Any, timeout: float | None) -> None:
        self.worker, self.key = worker, key
        self.timeout = float(config.get("train.client-timeout", timeout))
        # Asking the scheduler costs a round trip: a few times per timeout, at most every 2 s.
        self.interval = min(2.0, max(self.timeout / 4, 0.25))
        self.next_check = time.monotonic() + self.interval

    def lost(self) -> str | None:
        """Why the result is no longer wanted, or None while it is."""
        if self.key is None:
            return None
        ts = self.worker.state.tasks.get(self.key)
        if ts is None or ts.state in ("cancelled", "released", "forgotten"):
            return "its fit's client went away (the task was released)"
        if time.monotonic() < self.next_check:
            return None
        self.next_check = time.monotonic() + self.interval
        try:
            from distributed import get_client

            silence = get_client().run_on_scheduler(_client_silence, key=self.key)
        except Exception:  # the scheduler is unreachable: the worker itself will go away
            return None
        if silence is None:
            return "its fit's client went away (no client waits for the result)"
        if silence > self.timeout:
            return (
                f"the scheduler has not heard from its fit's client for {silence:.0f}s "
                f"(train.client-timeout: {self.timeout:g}s)"
            )
        return None
