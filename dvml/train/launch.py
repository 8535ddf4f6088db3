"""Worker-side launch of trainer processes (these functions run as pinned Dask tasks).

:func:`run_trainer` starts ``python -m dvml.train.trainer`` on its worker, forwards its
progress lines to the client (``worker.log_event``), and stops it when the job's abort event
is set (another trainer failed), when it runs past the job's timeout, or when it fails. The
trainer is a child process, not a thread, so TensorFlow and its GPU memory go away with it.
"""

from __future__ import annotations

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

from dvml.exceptions import TrainerFailedError, TrainingError

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
    from distributed import Event, get_worker

    worker = get_worker()
    workdir = tempfile.mkdtemp(prefix="dvml-trainer-", dir=worker.local_directory)
    job = dict(job)
    job["worker_name"] = str(worker.name)
    job["output_weights_path"] = os.path.join(workdir, "weights.npz")
    if weights is not None:
        job["weights_path"] = os.path.join(workdir, "initial.npz")
        with open(job["weights_path"], "wb") as initial:
            initial.write(weights)
    job_path = os.path.join(workdir, "job.json")
    with open(job_path, "w") as job_file:
        json.dump(job, job_file)

    env = dict(os.environ)
    env["TF_CONFIG"] = json.dumps(job["tf_config"])
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not job["use_gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = "-1"  # hide GPUs: TF must not take their memory

    records: list[dict[str, Any]] = []
    resolved: dict[str, Any] = {}
    done: dict[str, Any] = {}
    error: dict[str, Any] = {}
    tail: deque[str] = deque(maxlen=30)

    proc = subprocess.Popen(
        [sys.executable, "-m", "dvml.train.trainer", job_path],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
        start_new_session=True,
        cwd=workdir,
    )

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
            worker.log_event(topic, {"kind": kind, **message})

    reader = threading.Thread(target=read_output, name="dvml-trainer-output", daemon=True)
    reader.start()
    abort = Event(abort_event)
    deadline = time.monotonic() + timeout
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
    finally:
        _stop(proc)
        reader.join(10)
    try:
        if reason is not None:
            raise TrainingError(f"The trainer on {job['worker_name']} was {reason}.")
        if proc.returncode != 0 or not done:
            said = error.get("message") or "\n".join(list(tail)[-8:])
            kind = error.get("type", "exit")
            raise TrainerFailedError(
                f"The trainer on worker {job['worker_name']} failed (exit code {proc.returncode}"
                f", {kind}): {said}"
            )
        result = {
            "worker": job["worker_name"],
            "weights_sha256": done["weights_sha256"],
            "local_rows": done["local_rows"],
            "iterations": records,
            "resolved": resolved,
            "weights": None,
        }
        if job["tf_config"]["task"]["index"] == 0:
            with open(done["weights_path"], "rb") as final:
                result["weights"] = final.read()
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
