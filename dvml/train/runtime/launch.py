"""Worker side of a synchronous fit: one pinned Dask task per trainer, for the whole job.

:func:`run_trainer` starts the job's trainer on its worker through the runtime's supervisor
(:class:`~dvml.train.runtime.supervisor.TrainerProcess`), forwards its progress messages to
the client (``worker.log_event``), and stops it when the job's abort event is set (another
trainer failed), when it runs past the job's timeout, or when its client is gone. The trainer
is a child process, not a thread, so TensorFlow and its GPU memory go away with it.

Standby trainers (:mod:`dvml.cluster.standby`): the next CPU job is handed to the worker's
standby trainer, a process that imported TensorFlow and tf-keras while it waited (its
``TF_CONFIG`` and thread budget are set then, before TensorFlow's runtime starts); it still runs
one job and exits. When a job ends, the next standby starts once the worker is idle, so that it
does not compete with what follows the fit (an ``evaluate``). GPU jobs (``use_gpus=True``)
always get a fresh process: a standby is started with every GPU hidden
(``CUDA_VISIBLE_DEVICES=-1``, read when CUDA initialises, which may already happen while
TensorFlow loads), so it could not use one, and a fresh process per GPU job keeps the rule that
its GPU memory goes with it. ``dvml.train.standby-trainer: false`` turns standbys off.

Control path: a launcher gives its worker thread back as soon as it starts
(``distributed.secede``), so a fit never holds a worker's task slots: other dvml calls run on
the workers while trainers train, and two fits on single-thread workers cannot deadlock each
other.

Client lease (:class:`~dvml.train.runtime.supervisor.ClientLease`): a launcher stops its
trainer (the checkpoint stays, so a rerun resumes) when nobody waits for the result any more:
its task was released (the fit's client disconnected or cancelled it), or the scheduler has
not heard from the fit's client for ``dvml.train.client-timeout`` seconds.

Thread budget: each trainer gets the cores of its host divided by the trainers of the fit
placed on that host (``job["trainers_on_host"]``), unless the user set
``dvml.train.intra-op-threads`` / ``inter-op-threads`` (see :func:`dvml.tf_runtime.thread_budget`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from dvml.cluster.processes import server_port
from dvml.cluster.standby import start_standby_when_idle
from dvml.train.runtime.checkpoints import CheckpointStore
from dvml.train.runtime.protocol import (
    Finished,
    Iteration,
    Report,
    Resolved,
    Returned,
    SavedModel,
    Startup,
)
from dvml.train.runtime.sessions import adopt
from dvml.train.runtime.supervisor import ClientLease, TrainerProcess, private_workdir

__all__ = ["checkpoint_state", "clear_checkpoint", "reserve_port", "run_trainer"]


def reserve_port() -> tuple[str, int]:
    """A free TCP port on this worker's host and the address other trainers reach it at."""
    from distributed import get_worker

    host = get_worker().address.split("://")[-1].rsplit(":", 1)[0]
    return host, server_port(host)


def checkpoint_state(directory: str, worker_name: str) -> dict[str, Any] | None:
    """This worker's last checkpoint (``iteration``, ``history``, ``job_key``, ``weights``)."""
    found = CheckpointStore(directory).load(worker_name)
    if found is None:
        return None
    meta, state = found
    return {**meta, "weights": state}


def clear_checkpoint(directory: str) -> None:
    """Remove a finished job's checkpoints on this worker."""
    CheckpointStore(directory).clear()


def run_trainer(
    job: dict[str, Any],
    weights: bytes | None,
    topic: str,
    abort_event: str,
    timeout: float,
    payload: bytes | None = None,
) -> dict[str, Any]:
    """Run one trainer process to completion and return its result.

    ``weights`` (registry bytes) start the model; ``payload`` (a user program's cloudpickled
    ``train_fn``) is written beside the job file for the trainer (``job["fn_path"]``).

    Returns
    -------
    dict
        ``worker``, ``weights_sha256``, ``iterations`` (this trainer's progress records),
        ``local_rows``, ``resolved``, ``startup``, and ``weights`` (bytes) from the chief
        (task index 0) only.

    Raises
    ------
    TrainerFailedError
        Naming the worker, the exit code and the trainer's last words.
    TrainerStoppedError
        dvml stopped the trainer: another one failed, the timeout, or the client went away.
    """
    from distributed import Event, get_worker, secede

    worker = get_worker()
    task_key = worker.get_current_task()
    # From here on this task runs outside the worker's thread pool: the slot is free for other
    # tasks (datasets.list, another fit's launcher) while the trainer runs.
    secede()
    workdir = private_workdir(worker, "dvml-trainer-")
    job = {
        **job,
        "worker_name": str(worker.name),
        "output_weights_path": os.path.join(workdir, "weights.npz"),
    }
    for key, name, data in (("weights_path", "initial.npz", weights),
                            ("fn_path", "train_fn.pkl", payload)):  # fmt: skip
        if data is not None:
            job[key] = os.path.join(workdir, name)
            with open(job[key], "wb", opener=lambda p, f: os.open(p, f, 0o600)) as out:
                out.write(data)
    standby = bool(job.get("standby", True)) and not job["use_gpus"]
    trainer = TrainerProcess.start(
        job,
        workdir,
        use_gpus=job["use_gpus"],
        trainers_on_host=int(job.get("trainers_on_host") or 1),
        standby=standby,
        extra_env={"TF_CONFIG": json.dumps(job["tf_config"])},
    )
    abort = Event(abort_event)
    lease = ClientLease(worker, job["client_id"], job.get("client_timeout"), task_key)

    def stop() -> str | None:
        if abort.is_set():
            return "stopped because another trainer failed"
        return lease.lost()

    adopted = False
    try:
        result = _follow(trainer, job, worker, topic, timeout, stop)
        # A CPU fit's trainer serves its client's evaluate and predict next (sessions.adopt).
        adopted = bool(job.get("serve_after")) and adopt(trainer, job, worker)
        return result
    finally:
        # for the next job, once this worker is idle (dvml.cluster.standby)
        if not adopted:
            trainer.close(worker if standby else None)
        elif standby:
            start_standby_when_idle(worker)


def _follow(
    trainer: TrainerProcess,
    job: dict[str, Any],
    worker: Any,
    topic: str,
    timeout: float,
    stop: Any,
) -> dict[str, Any]:
    """Read the trainer's messages until it finishes; forward each to the client's topic."""
    name = job["worker_name"]
    records: list[dict[str, Any]] = []
    resolved: dict[str, Any] = {}
    startup: dict[str, Any] = {"threads": trainer.threads}
    saved: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        line = trainer.next(max(0.0, deadline - time.monotonic()), stop)
        message = {**line.to_dict(), "worker": name}
        worker.log_event(topic, {"kind": line.kind, **message})
        if isinstance(line, Iteration | Report):
            records.append(message)
        elif isinstance(line, Resolved):
            resolved.update(message)
        elif isinstance(line, Startup):
            startup.update(message)
        elif isinstance(line, SavedModel):
            saved.append(_saved_model(line))
        elif isinstance(line, Finished | Returned):
            break
    done_at = time.monotonic()
    try:  # how long the trainer takes to exit after its "done" (it skips the teardown)
        if not job.get("serve_after"):  # else it goes on serving (sessions.adopt)
            trainer.proc.wait(30)
        startup["exit_seconds"] = round(time.monotonic() - done_at, 4)
    except Exception:
        pass
    result: dict[str, Any] = {
        "worker": name,
        "local_rows": line.local_rows,
        "iterations": records,
        "resolved": resolved,
        "startup": startup,
        "weights": None,
        "models": saved,
        "value": None,
    }
    if isinstance(line, Finished):
        result["weights_sha256"] = line.weights_sha256
        if job["tf_config"]["task"]["index"] == 0:
            with open(line.weights_path, "rb") as final:
                result["weights"] = final.read()
    elif line.result_path is not None:
        with open(line.result_path, "rb") as value:
            result["value"] = value.read()  # cloudpickle bytes, loaded by the client
    return result


def _saved_model(line: SavedModel) -> dict[str, Any]:
    with open(line.json_path) as f, open(line.weights_path, "rb") as w:
        return {
            "name": line.name,
            "model_json": f.read(),
            "weights": w.read(),
            "compile_params": line.compile_params,
            "description": line.description,
        }
