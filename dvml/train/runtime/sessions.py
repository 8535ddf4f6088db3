"""Worker side of serving trainers: one long-lived trainer per worker and job, driven by tasks.

A *serving* trainer (``program: "serve"``, :mod:`dvml.train.runtime.serve_program`) imports
TensorFlow once, opens the worker's LOCAL partitions once, and then trains or evaluates any
model it is sent, one command at a time: this is how the model hopper (``fit_multiple``) and
model search train many models on pinned data without restarting a process. Each worker keeps
ONE such trainer per job (its :class:`_Session`, started by the job's first task on the worker
through the runtime's supervisor). A model's state (weights AND optimizer variables, ``.npz``
bytes) is the result of the task that last trained it, so Dask moves it directly from the
worker that trained it to the next one (the client holds only futures). A model that no task
trains is *parked*: its state stays where its last task left it, and a later task resumes it.
Models can join a running job: a task brings its model's configuration the first time that
model reaches a trainer.

Tasks of one job on one worker are serialised by the session's lock. A trainer that dies is not
replaced: every later task of the job on that worker raises
:class:`~dvml.exceptions.TrainerFailedError` saying how it ended, and the job stops (a rerun
resumes from the checkpoints). A session whose client is gone (:class:`ClientLease`) stops its
trainer by itself, also between tasks.

*Inference sessions* serve ``dvml.evaluate`` and ``dvml.predict`` (:func:`infer`), so that no
Dask worker process imports TensorFlow: one serving trainer per worker and CLIENT (no training
set), kept between calls while that client lives (its lease) and stopped after
``dvml.train.inference-idle-timeout`` seconds unused. It starts as the worker's warm standby
(or fresh), or it is the trainer of the client's fit that just ended on this worker
(:func:`adopt`), so an evaluate right after a fit pays no TensorFlow import. A trainer that died
between calls is replaced at the next call (nothing of a call's state lives in it but cached
models).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from dvml import config
from dvml.cluster.standby import add_busy_probe, start_standby_when_idle
from dvml.exceptions import TrainerFailedError, TrainingError
from dvml.train.runtime.checkpoints import CheckpointStore
from dvml.train.runtime.model_state import read_state
from dvml.train.runtime.plan import runtime_settings
from dvml.train.runtime.protocol import Evaluate, Evaluated, Failed, Line, Ready, Train, Trained
from dvml.train.runtime.served import write_spec
from dvml.train.runtime.supervisor import ClientLease, TrainerProcess, private_workdir

__all__ = [
    "INFERENCE",
    "adopt",
    "checkpoint",
    "evaluate_state",
    "infer",
    "inference_pid",
    "inference_settings",
    "list_checkpoints",
    "load_checkpoint",
    "release_inference_trainers",
    "state_digest",
    "stop_all_sessions",
    "stop_orphaned_sessions",
    "stop_session",
    "train_hop",
    "trainer_alive",
    "weights_of",
]

_LOCK = threading.Lock()
_SESSIONS: dict[str, _Session] = {}
# Jobs whose sessions were stopped: a task of such a job that starts late (it was already on
# its way when the job was cancelled) must not start a new trainer nobody would stop.
_STOPPED: deque[str] = deque(maxlen=1000)

_RERUN = "\nRun the job again: it resumes every model from the last iteration all completed."
_AGAIN = "\nCall it again: the next evaluate or predict starts a new inference session."
# Job ids of inference sessions: this prefix and the client's id.
INFERENCE = "inference-"
RELEASE_TIMEOUT_S = 3.0  # release_inference_trainers: their leases stop them anyway


class _Session:
    """One serving trainer of one job on this worker, and the lease that bounds its life.

    ``trainer``: a running trainer to serve with (an adopted fit trainer); else one starts.
    """

    def __init__(
        self, job: dict[str, Any], worker: Any, trainer: TrainerProcess | None = None
    ) -> None:
        self.job, self.worker = job, worker
        self.lock = threading.Lock()
        self.known: set[int] = set()  # models whose configuration the trainer has
        self.ready = False
        self.inference = str(job["job_id"]).startswith(INFERENCE)
        self.rerun = _AGAIN if self.inference else _RERUN
        self.idle_timeout = job.get("idle_timeout")  # inference sessions only
        self.last_used = time.monotonic()
        self.specs: dict[str, str] = {}  # model key -> its spec file (inference sessions)
        standby = bool(job.get("standby", True)) and not job["use_gpus"]
        if trainer is None:
            prefix = "dvml-inference-" if self.inference else "dvml-hop-"
            trainer = TrainerProcess.start(
                {**job, "program": "serve"},
                private_workdir(worker, prefix),
                use_gpus=bool(job["use_gpus"]),
                trainers_on_host=int(job.get("trainers_on_host") or 1),
                standby=standby,
            )
        self.trainer = trainer
        kind = "inference trainer" if self.inference else "hop trainer"
        self.trainer.name = f"{kind} on worker {job['worker_name']}"
        self.standby_worker = worker if standby else None
        self.lease = ClientLease(worker, job["client_id"], job.get("client_timeout"))
        threading.Thread(target=self._watch, name="dvml-session-lease", daemon=True).start()
        _register_teardown(worker)

    def _idle(self) -> str | None:
        """Why an inference session stops although its client lives: unused too long."""
        unused = time.monotonic() - self.last_used
        if self.idle_timeout is None or self.lock.locked() or unused < float(self.idle_timeout):
            return None
        return (
            f"stopped after {unused:.0f}s unused (train.inference-idle-timeout: "
            f"{float(self.idle_timeout):g}s); the next evaluate or predict starts another"
        )

    def _watch(self) -> None:
        """Stop the session when its client is gone (or it idles), also while no task runs."""
        while self.trainer.proc.poll() is None:
            time.sleep(self.lease.interval)
            reason = self.lease.lost()
            if reason is None and self.idle_timeout is not None:
                # Under the sessions' lock: a call that takes this session meanwhile marks it
                # used (_inference_session), so it is never stopped under a call.
                with _LOCK:
                    reason = self._idle()
                    if reason is not None and _SESSIONS.get(self.job["job_id"]) is self:
                        del _SESSIONS[self.job["job_id"]]
            if reason is not None:
                self.trainer.stopped = reason
                stop_session(self.job["job_id"], session=self)
                return

    def call(self, command: Line, timeout: float) -> Line:
        """Send ``command`` and return the trainer's answer (raises when it failed)."""
        self.last_used = time.monotonic()
        try:
            if not self.ready:
                ready = self.trainer.next(timeout, self.lease.lost)
                if not isinstance(ready, Ready):
                    raise self._failed(ready)
                self.ready = True
            self.trainer.send(command)
            answer = self.trainer.next(timeout, self.lease.lost)
        finally:
            self.last_used = time.monotonic()
        if isinstance(answer, Failed):
            raise self._failed(answer)
        return answer

    def _failed(self, answer: Line) -> TrainingError:
        if isinstance(answer, Failed) and not answer.fatal:
            if self.inference:  # the model or the rows, not the trainer: it keeps serving
                return TrainingError(
                    f"The {self.trainer.name} (pid {self.trainer.proc.pid}) could not run the "
                    f"model: {answer.type}: {answer.message}\nCheck that the data has the "
                    "columns and shapes the model was trained on."
                )
            return TrainerFailedError(
                f"The {self.trainer.name} (pid {self.trainer.proc.pid}) failed: "
                f"{answer.type}: {answer.message}{self.rerun}"
            )
        return self.trainer.failure(self.rerun)

    def close(self) -> None:
        self.trainer.close(self.standby_worker)


class _SessionsPlugin:
    """Stops this worker's serving trainers when the worker closes (a distributed
    WorkerPlugin), before its connections close: a closing worker does not wait on them."""

    name = "dvml-serving-trainers"

    def setup(self, worker: Any) -> None:
        pass

    def teardown(self, worker: Any) -> None:
        stop_all_sessions()

    def transition(self, *args: Any, **kwargs: Any) -> None:
        pass


_REGISTERED: set[int] = set()  # ids of the workers whose teardown is in place


def _serving() -> bool:
    """Whether an inference session of this worker runs a call now: the worker is busy then
    (a deferred standby's import must not compete with an evaluate or predict)."""
    with _LOCK:
        sessions = list(_SESSIONS.values())
    return any(s.inference and s.lock.locked() for s in sessions)


def _register_teardown(worker: Any) -> None:
    if id(worker) in _REGISTERED:
        return
    _REGISTERED.add(id(worker))
    add_busy_probe(_serving)
    from distributed.diagnostics.plugin import WorkerPlugin

    plugin = type("ServingTrainersPlugin", (_SessionsPlugin, WorkerPlugin), {})()
    worker.loop.add_callback(worker.plugin_add, plugin=plugin, name=_SessionsPlugin.name)


def stop_all_sessions(dask_worker: Any = None) -> int:
    """Stop every serving trainer of this worker (its close; ``client.run``): returns how many.
    Jobs among them cannot restart here (a late task of theirs raises)."""
    with _LOCK:
        found = list(_SESSIONS.items())
        _SESSIONS.clear()
        _STOPPED.extend(job_id for job_id, _ in found if not job_id.startswith(INFERENCE))
    for _, session in found:
        if session.trainer.stopped is None:
            session.trainer.stopped = "stopped because its worker closed"
        session.trainer.close()  # no next standby: the worker is going away
    return len(found)


def _session(job: dict[str, Any]) -> _Session:
    from distributed import get_worker

    worker = get_worker()
    with _LOCK:
        if job["job_id"] in _STOPPED:
            raise TrainerFailedError(
                f"Job {job['job_id']} ({job.get('name')!r}) was stopped before this task of it "
                f"started on worker {worker.name}; no trainer was started for it.{_RERUN}"
            )
        session = _SESSIONS.get(job["job_id"])
        # A session whose trainer died is kept, not replaced: its next call raises, so a
        # killed trainer ends the job whether it was training or waiting for its next task.
        if session is None:
            index = job["workers"].index(str(worker.name))
            own = {
                **job,
                "worker_name": str(worker.name),
                "worker_index": index,
                "trainers_on_host": job["trainers_on_host"][index],
                "configs": {},  # they come with the tasks (models join a running job)
            }
            session = _SESSIONS[job["job_id"]] = _Session(own, worker)
        return session


def _inference_job(settings: dict[str, Any], worker: Any) -> dict[str, Any]:
    """The job file of an inference session (no training set: it opens partitions per call)."""
    from dvml import tf_runtime

    client_id = str(settings["client_id"])
    try:
        on_host = max(1, int(os.environ.get(tf_runtime.WORKERS_ON_HOST_ENV, "1")))
    except ValueError:
        on_host = 1
    return {
        "job_id": INFERENCE + client_id,
        "name": "evaluate/predict",
        "model_output": f"inference for client {client_id}",
        "inference": client_id,  # what finds this trainer (tests, operators reading job.json)
        "training": None,
        "validation": None,
        "configs": {},
        "seed": 0,
        "use_gpus": False,  # evaluate and predict run on the CPU, as they always did
        "timeout": float(settings["timeout"]),
        "worker_name": str(worker.name),
        "worker_index": 0,
        "trainers_on_host": on_host,  # the thread budget of a worker's own TensorFlow
        "threads": settings.get("threads") or [None, None],
        "standby": bool(settings.get("standby", True)),
        "client_id": client_id,
        "client_timeout": settings.get("client_timeout"),
        "idle_timeout": settings.get("idle_timeout"),
        "started_at": time.time(),
    }


def inference_settings(client_id: str) -> dict[str, Any]:
    """(Client side.) What a worker needs to find or start the inference session of the
    client ``client_id``: the configured timeouts, threads and standby use."""
    return {
        "client_id": client_id,
        "timeout": config.get("train.trainer-timeout"),
        "idle_timeout": config.get("train.inference-idle-timeout"),
        **runtime_settings(),
    }


def release_inference_trainers(client: Any) -> int:
    """(Client side.) Stop the serving trainers of ``client``'s evaluate and predict calls
    (and a fit's trainer kept as one, :func:`adopt`) on every worker now; return how many.

    They would stop by themselves once the client is gone (its lease, within seconds) or
    unused for ``train.inference-idle-timeout``; a script that is about to end calls this so
    that the next job does not find them still running (or share the cores with them).
    Bounded (:func:`dvml.cluster.health.bounded_run`, at most ``RELEASE_TIMEOUT_S``): a
    frozen worker must not hold up the end of a job.
    """
    from dvml.cluster.health import bounded_run, daemon_timeout

    timeout = min(daemon_timeout(), RELEASE_TIMEOUT_S)
    found = bounded_run(client, stop_session, INFERENCE + str(client.id), timeout=timeout)
    return sum(1 for stopped in found.values() if stopped is True)


def _inference_session(settings: dict[str, Any]) -> _Session:
    """This worker's inference session of the settings' client: the live one, else a new one
    (from the worker's standby when there is one)."""
    from distributed import get_worker

    worker = get_worker()
    job_id = INFERENCE + str(settings["client_id"])
    with _LOCK:
        session = _SESSIONS.get(job_id)
        if session is not None and session.trainer.proc.poll() is None:
            session.last_used = time.monotonic()  # in use again: not idle
            return session
        dead = _SESSIONS.pop(job_id, None)
        session = _SESSIONS[job_id] = _Session(_inference_job(settings, worker), worker)
    if dead is not None:  # it ended between calls (killed, out of memory): replaced
        dead.close()
    if session.standby_worker is not None:
        # The session took the standby: the next one starts once this worker is idle, so the
        # next fit is warm too (dvml.cluster.standby).
        start_standby_when_idle(worker)
    return session


def adopt(trainer: TrainerProcess, job: dict[str, Any], worker: Any) -> bool:
    """Keep the trainer of a CPU fit that just ended on this worker as the inference session of
    the fit's client, so that an evaluate or predict right after the fit pays no TensorFlow
    import. The trainer serves once its fit is done when its job has ``serve_after`` (the
    client's :func:`inference_settings`).

    Returns False (the caller stops the trainer) when the trainer ended, or when the client
    has a live inference session on this worker already.
    """
    settings = job.get("serve_after")
    if not settings or trainer.proc.poll() is not None:
        return False
    job_id = INFERENCE + str(settings["client_id"])
    with _LOCK:
        current = _SESSIONS.get(job_id)
        if current is not None and current.trainer.proc.poll() is None:
            return False
        own = _inference_job(settings, worker)
        _mark(trainer.workdir, own)
        _SESSIONS[job_id] = _Session(own, worker, trainer=trainer)
    if current is not None:
        current.close()
    return True


def _mark(workdir: str, job: dict[str, Any]) -> None:
    """Rewrite the trainer's job file: it serves inference now, the fit is over (who runs what:
    operators and tests find a job's trainers by their job file)."""
    path = os.path.join(workdir, "job.json")
    try:
        with open(path) as f:
            fit_job = json.load(f)
        adopted = {**job, "program": "serve", "adopted_from": fit_job.get("job_key")}
        with open(path, "w", opener=lambda p, f: os.open(p, f, 0o600)) as f:
            json.dump(adopted, f)
    except (OSError, ValueError):
        pass


# Spec files an inference session keeps (each holds a model's weights); one dropped is written
# again when its model comes back. Its trainer keeps fewer models compiled (served.CACHED).
_SPECS_KEPT = 8


def infer(
    settings: dict[str, Any], spec: dict[str, Any], command: Callable[[str, str], Line]
) -> Line:
    """Run one evaluate or predict command on this worker's inference session of the client.

    ``spec`` is the model spec (written into the session's directory once per session);
    ``command(spec_path, directory)`` builds the command, writing any input files it names
    into ``directory`` (the session's owner-only directory). Returns the trainer's answer.

    Raises
    ------
    TrainingError
        The trainer could not run the model on the rows (it keeps serving).
    TrainerFailedError
        The trainer ended (how is said); the next call starts another.
    """
    session = _inference_session(settings)
    with session.lock:
        path = session.specs.get(spec["key"])
        if path is None:
            path = write_spec(session.trainer.workdir, f"model-{uuid.uuid4().hex[:8]}", spec)
            session.specs[spec["key"]] = path
            while len(session.specs) > _SPECS_KEPT:
                old = session.specs.pop(next(iter(session.specs)))
                for stale in (old, old[: -len(".json")] + ".npz"):
                    with contextlib.suppress(OSError):
                        os.remove(stale)
        return session.call(command(path, session.trainer.workdir), float(settings["timeout"]))


def inference_pid(client_id: str, dask_worker: Any = None) -> int | None:
    """The pid of this worker's live inference trainer of ``client_id`` (``client.run``)."""
    with _LOCK:
        session = _SESSIONS.get(INFERENCE + client_id)
    if session is None or session.trainer.proc.poll() is not None:
        return None
    return int(session.trainer.proc.pid)


def _transfer_seconds(key: str | None) -> float:
    """Seconds this worker spent receiving the Dask key ``key`` (0 when it was local)."""
    if key is None:
        return 0.0
    from distributed import get_worker

    for entry in reversed(list(get_worker().transfer_incoming_log)):
        if key in entry.get("keys", {}):
            return float(entry.get("duration", 0.0))
    return 0.0


def _run(
    job: dict[str, Any], mst_key: int, iteration: int | None, state: bytes
) -> tuple[Any, bytes]:
    """Run one command for model ``mst_key`` on this worker's trainer: train when
    ``iteration`` is given, else evaluate. Returns the answer and the new state (trained)."""
    session = _session(job)
    with session.lock:
        fd, path_in = tempfile.mkstemp(suffix=".npz", dir=session.trainer.workdir)
        with os.fdopen(fd, "wb") as f:
            f.write(state)
        path_out = path_in[: -len(".npz")] + "-out.npz"
        config = None if mst_key in session.known else job["configs"][str(mst_key)]
        command: Line
        if iteration is None:
            command = Evaluate(mst_key=mst_key, state_in=path_in, config=config)
        else:
            command = Train(mst_key, iteration, path_in, path_out, config=config)
        try:
            answer = session.call(command, float(job["timeout"]))
            session.known.add(mst_key)
            if iteration is None:
                return answer, b""
            with open(path_out, "rb") as f:
                return answer, f.read()
        finally:
            for path in (path_in, path_out):
                if os.path.exists(path):
                    os.remove(path)


def train_hop(
    job: dict[str, Any], mst_key: int, iteration: int, previous: dict[str, Any], previous_key: Any
) -> dict[str, Any]:
    """Train model ``mst_key`` for one step of its schedule on this worker's partition.

    ``previous`` is the result of the model's previous task (or of its start), moved here by
    Dask; ``previous_key`` its Dask key, to time that move. Returns the new ``state`` and a
    ``record`` (loss, seconds, the trainer's pid, the digest of the weights it started from).
    """
    from distributed import get_worker

    started = time.perf_counter()
    moved = _transfer_seconds(previous_key)
    answer, state = _run(job, mst_key, iteration, previous["state"])
    if not isinstance(answer, Trained):
        raise TrainerFailedError(f"A trainer answered {answer!r} to a train command.{_RERUN}")
    record = {
        "mst_key": mst_key, "iteration": iteration,
        "worker": str(get_worker().name),
        "pid": _SESSIONS[job["job_id"]].trainer.proc.pid,
        "fit_loss": answer.fit_loss,
        "train_s": answer.train_s,
        "steps": answer.steps, "rows": answer.rows,  # stragglers' unit; rows once per epoch
        # moving the model: the Dask transfer here plus loading and saving its state
        "moving_s": moved + answer.load_s + answer.save_s,
        "transfer_s": moved,
        "bytes": len(state),
        "loaded_sha256": answer.loaded_sha256,
        "resident_bytes": answer.resident_bytes,  # the trainer's, at the hop's end
        "zygote_bytes": answer.zygote_bytes,
        "task_s": time.perf_counter() - started,
        # wall clock, from the client's start of this run (an earlier run's, once resumed)
        "elapsed": time.time() - float(job["started_at"]),
    }  # fmt: skip
    try:  # dvml's dashboard page shows the hop (best effort: the hop is done either way)
        get_worker().log_event(f"dvml-hop-{job['job_id']}", {"kind": "hop", **record})
    except Exception:
        pass
    return {"state": state, "record": record}


def hop_record(result: dict[str, Any]) -> dict[str, Any]:
    """The small part of a hop's result (runs where the result is, so no state moves)."""
    return dict(result["record"])


def evaluate_state(job: dict[str, Any], mst_key: int, result: dict[str, Any]) -> dict[str, Any]:
    """Loss and metrics of a model's state on this worker's training and validation rows."""
    answer, _ = _run(job, mst_key, None, result["state"])
    if not isinstance(answer, Evaluated):
        raise TrainerFailedError(f"A trainer answered {answer!r} to an evaluate command.{_RERUN}")
    out = {"training": answer.training}
    if answer.validation is not None:
        out["validation"] = answer.validation
    return out


def _name(mst_key: int, iteration: int) -> str:
    return f"{mst_key}-{iteration}"


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
    """Write a model's state after ``iteration`` with that iteration's records.

    The state of the iteration before the last is removed (each state is the size of the
    model and its optimizer); the small records of every iteration stay, for the history.
    ``after`` is the result of the model's previous checkpoint task (None): passing it makes
    Dask write the checkpoints of one model in iteration order, so that the records of every
    iteration up to a checkpointed state exist when a rerun resumes from it.
    """
    store = CheckpointStore(directory)
    meta = {"job_key": job_key, "mst_key": mst_key, "iteration": iteration}
    store.save(_name(mst_key, iteration), result["state"], {**meta, "records": records,
                                                           "evals": evals})  # fmt: skip
    store.drop_state(_name(mst_key, iteration - 2))


def list_checkpoints(directory: str, job_key: str) -> list[dict[str, Any]]:
    """Every checkpoint record of ``job_key`` on this worker (``has_state``: its state is here)."""
    records = CheckpointStore(directory).records(job_key)
    return sorted(records, key=lambda m: (m["mst_key"], m["iteration"]))


def load_checkpoint(directory: str, mst_key: int, iteration: int) -> dict[str, Any]:
    """A checkpointed state, as a hop result (it stays on this worker until a hop needs it)."""
    found = CheckpointStore(directory).load(_name(mst_key, iteration))
    if found is None:
        raise TrainerFailedError(
            f"The checkpoint of model {mst_key} after iteration {iteration} in {directory} is "
            f"gone or torn. Run the job again with resume=False.{_RERUN}"
        )
    return {"state": found[1], "record": None}


def stop_session(job_id: str, dask_worker: Any = None, session: Any = None) -> bool:
    """Stop this worker's serving trainer of ``job_id`` (``client.run``; idempotent).

    ``session``: stop only that one (an inference session's watcher: a newer session of the
    same client may have replaced it meanwhile).
    """
    with _LOCK:
        if not job_id.startswith(INFERENCE):  # a late task of a job must not restart it
            _STOPPED.append(job_id)
        found = _SESSIONS.get(job_id)
        if found is None or (session is not None and found is not session):
            found = None
        else:
            del _SESSIONS[job_id]
    if found is None:
        if session is not None:
            session.close()
        return False
    found.close()
    return True


def trainer_alive(job_id: str, dask_worker: Any = None) -> bool:
    """Whether this worker's serving trainer of ``job_id`` runs (``client.run``); True when
    none was started yet (the next task starts it)."""
    with _LOCK:
        session = _SESSIONS.get(job_id)
    return session is None or session.trainer.proc.poll() is None


async def stop_orphaned_sessions(dask_worker: Any = None) -> list[str]:
    """Stop this worker's serving trainers whose client is gone now (``client.run``: on the
    worker's event loop, hence a coroutine); returns their job ids. Their leases would stop
    them within seconds anyway; this does it at once."""
    with _LOCK:
        sessions = list(_SESSIONS.items())
    stopped = []
    for job_id, session in sessions:
        reason = await session.lease.lost_now()
        if reason is not None:
            session.trainer.stopped = reason
            stop_session(job_id)
            stopped.append(job_id)
    return stopped


def weights_of(result: dict[str, Any]) -> bytes:
    """The weights alone of a model's state, as registry bytes (the optimizer state stays)."""
    from dvml.registry.weights import weights_to_bytes

    weights, _ = read_state(result["state"])
    return weights_to_bytes(weights)


def state_digest(result: dict[str, Any]) -> str:
    """The sha256 of a model state's weights (what :class:`Trained` reports as loaded)."""
    from dvml.train.runtime.model_state import weights_digest

    return weights_digest(read_state(result["state"])[0])
