"""Worker side of ``fit_multiple``: pinned Dask tasks that drive this worker's hop trainer.

Each worker keeps ONE :mod:`dvml.train.hop_trainer` process per job (started by the first
task of the job, kept in this worker process's ``_SESSIONS``), so TensorFlow is imported
once per worker and job. A hop is one task: it receives the model's state (weights and
optimizer variables, ``.npz`` bytes) as the result of the previous hop's task, which Dask
moves directly from the worker that trained it to this one (worker to worker: the client
only holds futures), hands it to the trainer through a file in this worker's directory, and
returns the new state. Tasks of one job on one worker are serialised by the session's lock.
A trainer that dies (killed, out of memory) is not replaced: every later task of the job on
that worker raises :class:`~dvml.exceptions.TrainerFailedError` saying how it ended, whether
it died during a hop or while it waited for one, and the job stops (a rerun resumes).

The state at the end of an iteration is written to the job's checkpoint directory on the
worker that holds it (:func:`checkpoint`), so that a rerun resumes every model from the last
iteration all of them completed.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

from dvml import tf_runtime
from dvml.cluster.state import private_dir
from dvml.exceptions import TrainerFailedError
from dvml.train.exits import describe_exit

__all__ = [
    "checkpoint",
    "evaluate_state",
    "list_checkpoints",
    "load_checkpoint",
    "stop_session",
    "train_hop",
]

PROTOCOL_PREFIX = "DVML "

_LOCK = threading.Lock()
_SESSIONS: dict[str, _Session] = {}
# Jobs whose sessions were stopped: a task of such a job that starts late (it was already on
# its way when the job was cancelled) must not start a new trainer nobody would stop.
_STOPPED: deque[str] = deque(maxlen=1000)


class _Session:
    """One hop trainer process and its output reader."""

    def __init__(self, job: dict[str, Any], workdir: str) -> None:
        self.job, self.workdir = job, workdir
        self.lock = threading.Lock()
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=30)
        budget = tf_runtime.thread_budget(
            tf_runtime.host_cores(), int(job.get("trainers_on_host") or 1), *job["threads"]
        )
        env = tf_runtime.trainer_environment(os.environ, budget, bool(job["use_gpus"]))
        path = os.path.join(workdir, "job.json")
        with open(path, "w") as f:
            json.dump(job, f)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dvml.train.hop_trainer", path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, name="dvml-hop-output", daemon=True)
        self.reader.start()
        self.ready = False
        self.stopped: str | None = None  # why dvml stopped the trainer, if it did

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            if line.startswith(PROTOCOL_PREFIX):
                self.lines.put(json.loads(line[len(PROTOCOL_PREFIX) :]))
            else:
                self.tail.append(line.rstrip())
        self.lines.put(None)  # the process ended

    def answer(self, timeout: float) -> dict[str, Any]:
        """The trainer's next protocol line; raise when it died or ran past ``timeout``."""
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stopped = f"it did not answer within {timeout:.0f}s and was stopped by dvml"
            self.stop()
            raise TrainerFailedError(
                f"The hop trainer on worker {self.job['worker_name']} did not answer within "
                f"{timeout:.0f}s (config dvml.train.trainer-timeout); it was stopped. Check "
                "the worker's load, or raise the timeout."
            ) from None
        if message is None or message.get("kind") == "error":
            if message is None:  # its output ended: the process is gone, say how
                self.lines.put(None)  # and again to every later call of this session
                try:
                    code = self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    code = None
                said = self.stopped or describe_exit(code, {}, list(self.tail))
            else:
                said = f"{message.get('type', 'error')}: {message.get('message')}"
            raise TrainerFailedError(
                f"The hop trainer on worker {self.job['worker_name']} (pid {self.proc.pid}) "
                f"failed: {said}\nRun fit_multiple again: it resumes every model from the last "
                "iteration all of them completed."
            )
        return message

    def call(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self.ready:
            self.answer(timeout)  # "ready": TensorFlow imported, partitions open
            self.ready = True
        if self.proc.stdin is None or self.proc.poll() is not None:
            return self.answer(timeout)  # raises with the trainer's last words
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it died (or was stopped): answer() reports how
        return self.answer(timeout)

    def stop(self) -> None:
        import signal

        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _session(job: dict[str, Any]) -> _Session:
    from distributed import get_worker

    worker = get_worker()
    with _LOCK:
        if job["job_id"] in _STOPPED:
            raise TrainerFailedError(
                f"fit_multiple job {job['job_id']} ({job.get('model_output')!r}) was stopped "
                f"before this task of it started on worker {worker.name}; no trainer was "
                "started for it. Run fit_multiple again: it resumes from its checkpoints."
            )
        session = _SESSIONS.get(job["job_id"])
        # A session whose trainer died is kept, not replaced: its next call raises, so a
        # killed trainer ends the job whether it was training or waiting for its next hop.
        if session is None:
            workdir = tempfile.mkdtemp(prefix="dvml-hop-", dir=worker.local_directory)
            index = job["workers"].index(str(worker.name))
            own = {
                **job,
                "worker_name": str(worker.name),
                "worker_index": index,
                "trainers_on_host": job["trainers_on_host"][index],
            }
            session = _SESSIONS[job["job_id"]] = _Session(own, workdir)
        return session


def _transfer_seconds(key: str | None) -> float:
    """Seconds this worker spent receiving the Dask key ``key`` (0 when it was local)."""
    if key is None:
        return 0.0
    from distributed import get_worker

    for entry in reversed(list(get_worker().transfer_incoming_log)):
        if key in entry.get("keys", {}):
            return float(entry.get("duration", 0.0))
    return 0.0


def _run(job: dict[str, Any], command: dict[str, Any], state: bytes) -> tuple[Any, str]:
    session = _session(job)
    with session.lock:
        fd, path_in = tempfile.mkstemp(suffix=".npz", dir=session.workdir)
        with os.fdopen(fd, "wb") as f:
            f.write(state)
        path_out = path_in[: -len(".npz")] + "-out.npz"
        try:
            answer = session.call(
                {**command, "state_in": path_in, "state_out": path_out}, job["timeout"]
            )
            if command["op"] != "train":
                return answer, ""
            with open(path_out, "rb") as f:
                return answer, f.read()  # type: ignore[return-value]
        finally:
            for path in (path_in, path_out):
                if os.path.exists(path):
                    os.remove(path)


def train_hop(
    job: dict[str, Any], mst_key: int, iteration: int, previous: dict[str, Any], previous_key: Any
) -> dict[str, Any]:
    """Train one sub-epoch of model ``mst_key`` on this worker's partition.

    ``previous`` is the result of the model's previous hop (or of its start), moved here by
    Dask; ``previous_key`` its Dask key, to time that move. Returns the new ``state`` and a
    ``record`` (loss, seconds) for the info table.
    """
    from distributed import get_worker

    started = time.perf_counter()
    moved = _transfer_seconds(previous_key)
    command = {"op": "train", "mst_key": mst_key, "iteration": iteration}
    answer, state = _run(job, command, previous["state"])
    record = {
        "mst_key": mst_key,
        "iteration": iteration,
        "worker": str(get_worker().name),
        "fit_loss": answer["fit_loss"],
        "train_s": answer["train_s"],
        # moving the model: the Dask transfer here plus loading and saving its state
        "moving_s": moved + answer["load_s"] + answer["save_s"],
        "transfer_s": moved,
        "bytes": len(state),
        "task_s": time.perf_counter() - started,
        # wall clock, from the client's start of this run (an earlier run's, once resumed)
        "elapsed": time.time() - float(job["started_at"]),
    }
    return {"state": state, "record": record}


def hop_record(result: dict[str, Any]) -> dict[str, Any]:
    """The small part of a hop's result (runs where the result is, so no state moves)."""
    return dict(result["record"])


def evaluate_state(job: dict[str, Any], mst_key: int, result: dict[str, Any]) -> dict[str, Any]:
    """Loss and metrics of a model's state on this worker's training and validation rows."""
    answer, _ = _run(job, {"op": "eval", "mst_key": mst_key}, result["state"])
    return {k: answer[k] for k in ("training", "validation") if k in answer}


def checkpoint(
    directory: str,
    job_key: str,
    mst_key: int,
    iteration: int,
    result: dict[str, Any],
    records: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    after: Any = None,
) -> None:
    """Write a model's state after ``iteration`` (atomically) with that iteration's records.

    The state of the iteration before the last is removed (each state is the size of the
    model and its optimizer); the small records of every iteration stay, for the history.
    ``after`` is the result of the model's previous checkpoint task (None): passing it makes
    Dask write the checkpoints of one model in iteration order, so that the records of every
    iteration up to a checkpointed state exist when a rerun resumes from it.
    """
    private_dir(directory, root=os.path.dirname(os.path.dirname(directory)))
    path = os.path.join(directory, f"{mst_key}-{iteration}.npz")
    with open(path + ".tmp", "wb") as f:
        f.write(result["state"])
    os.replace(path + ".tmp", path)
    meta = {"job_key": job_key, "mst_key": mst_key, "iteration": iteration}
    with open(path + ".json.tmp", "w") as f:
        json.dump({**meta, "records": records, "evals": evals}, f)
    os.replace(path + ".json.tmp", path + ".json")
    stale = os.path.join(directory, f"{mst_key}-{iteration - 2}.npz")
    if os.path.exists(stale):
        os.remove(stale)


def list_checkpoints(directory: str, job_key: str) -> list[dict[str, Any]]:
    """Every checkpoint record of ``job_key`` on this worker (``has_state``: its npz is here)."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not name.endswith(".npz.json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if meta.get("job_key") == job_key:
            meta["has_state"] = os.path.exists(os.path.join(directory, name[: -len(".json")]))
            found.append(meta)
    return sorted(found, key=lambda m: (m["mst_key"], m["iteration"]))


def load_checkpoint(directory: str, mst_key: int, iteration: int) -> dict[str, Any]:
    """A checkpointed state, as a hop result (it stays on this worker until a hop needs it)."""
    with open(os.path.join(directory, f"{mst_key}-{iteration}.npz"), "rb") as f:
        return {"state": f.read(), "record": None}


def stop_session(job_id: str, dask_worker: Any = None) -> bool:
    """Stop this worker's hop trainer of ``job_id`` (``client.run``; idempotent)."""
    with _LOCK:
        _STOPPED.append(job_id)
        session = _SESSIONS.pop(job_id, None)
    if session is None:
        return False
    session.stop()
    return True


def weights_of(result: dict[str, Any]) -> bytes:
    """The weights alone of a hop result, as registry bytes (the optimizer state stays here)."""
    from dvml.registry.weights import weights_to_bytes
    from dvml.train.hop_trainer import read_state

    weights, _ = read_state(result["state"])
    return weights_to_bytes(weights)
