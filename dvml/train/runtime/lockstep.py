"""Client side of a lock-step job: one trainer per worker, all running the whole job together.

Used by every scheduler whose trainers run in lock-step through ``TF_CONFIG`` and a
MultiWorkerMirroredStrategy (``fit``; ``dvml.run``'s training loops): reserve each trainer's
collective port on its own worker, launch one pinned task per trainer
(:func:`dvml.train.runtime.launch.run_trainer`), forward their messages, and wait with the
runtime's watcher. On the first failure, a departed worker or an interrupt, every trainer is
stopped (the job's abort event) and the error names the trainer that died first or the host
that went away, not a survivor whose collective op was aborted. :func:`find_checkpoint` is
where a rerun of the same job resumes
(:func:`resume_from`, the pure rule it applies to the trainers' checkpoints).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import DvmlError, TrainerFailedError, WorkerDepartedError
from dvml.resolve.batches import row_weights
from dvml.train.runtime import launch
from dvml.train.runtime.checkpoints import resume_iteration
from dvml.train.runtime.exits import KILLED_BY
from dvml.train.runtime.plan import machine
from dvml.train.runtime.sessions import inference_settings
from dvml.train.runtime.watcher import (
    departed_workers,
    describe_departure,
    looks_like_peer_failure,
    watch,
)

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "BoundaryReached",
    "clear_checkpoints",
    "find_checkpoint",
    "reserve_ports",
    "resume_from",
    "run_lockstep",
]


class BoundaryReached(DvmlError):
    """The caller's ``until`` asked a lock-step run to stop at an iteration boundary: its
    trainers were stopped and the caller restarts them from their last checkpoint (an
    elastic fit changing its row map, :mod:`dvml.train.row_map_change`)."""


def reserve_ports(client: Client, workers: list[WorkerInfo]) -> list[str]:
    """One free ``host:port`` per trainer, reserved on its own worker (the TF_CONFIG peers).

    Trainers on one host pick their ports at random, each free when picked but not held: a
    port picked twice is asked for again.
    """
    endpoints: list[str | None] = [None] * len(workers)
    for _ in range(10):
        asked = [i for i, e in enumerate(endpoints) if e is None]
        if not asked:
            break
        found = client.gather([
            client.submit(
                launch.reserve_port, workers=[workers[i].address], allow_other_workers=False,
                pure=False,
            )
            for i in asked
        ])  # fmt: skip
        for i, (host, port) in zip(asked, found, strict=True):
            endpoints[i] = None if f"{host}:{port}" in endpoints else f"{host}:{port}"
    if any(e is None for e in endpoints):
        raise TrainerFailedError(
            f"Could not pick distinct trainer ports for {len(workers)} trainers after 10 "
            f"tries (picked: {endpoints}); free ports on the workers' hosts and run again."
        )
    return [e for e in endpoints if e is not None]


def run_lockstep(
    client: Client,
    workers: list[WorkerInfo],
    base_job: dict[str, Any],
    per_worker_batch: list[int],
    weights_blob: bytes | None,
    on_event: Callable[[Any], None],
    timeout: float,
    what: str = "fit",
    payload: bytes | None = None,
    until: Callable[[], bool] | None = None,
    per_worker_steps: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Launch one trainer per worker and wait for all; their messages go to ``on_event``.

    ``what`` names the call in errors (``"run fit again"``); ``payload`` goes to every
    trainer (:func:`~dvml.train.runtime.launch.run_trainer`). ``until`` (asked in this
    thread while the trainers run) stops every trainer when it returns True, and
    :class:`BoundaryReached` is raised. ``per_worker_steps``: each trainer's own steps per
    epoch, replacing the job's (``sync="iteration"`` only: its trainers meet once per
    iteration, not per step).
    """
    from distributed import Event

    started = time.time()
    endpoints = reserve_ports(client, workers)
    job_id = uuid.uuid4().hex[:12]
    topic, abort_name = f"dvml-fit-{job_id}", f"dvml-fit-abort-{job_id}"
    client.subscribe_topic(topic, on_event)
    abort = Event(abort_name, client=client)
    futures = []
    for i, w in enumerate(workers):
        job = _trainer_job(client, base_job, workers, i, endpoints, per_worker_batch)
        if per_worker_steps is not None:
            job["steps_per_epoch"] = per_worker_steps[i]
        futures.append(
            client.submit(
                launch.run_trainer,
                job,
                weights_blob,
                topic,
                abort_name,
                timeout,
                payload,
                workers=[w.address],
                allow_other_workers=False,
                pure=False,
                retries=0,
                key=f"dvml-trainer-{job_id}-{w.name}",
            )
        )
    names = [w.name for w in workers]
    _log_job(client, topic, {"kind": "job", "started": started, "workers": names,
                             **{k: base_job.get(k) for k in _JOB_FIELDS}})  # fmt: skip
    ended: dict[str, Any] = {"kind": "ended", "outcome": "failed"}
    try:
        results = _wait_trainers(client, futures, workers, abort, what, until)
        ended["outcome"] = "done"
        return results
    except BoundaryReached:  # the caller restarts them on a new row map
        ended["outcome"] = "restarted"
        raise
    except BaseException as exc:  # the page names what stopped the job
        ended["error"] = f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        _log_job(client, topic, {**ended, "at": time.time()})
        client.unsubscribe_topic(topic)


def _trainer_job(
    client: Client,
    base_job: dict[str, Any],
    workers: list[WorkerInfo],
    i: int,
    endpoints: list[str],
    batches: list[int],
) -> dict[str, Any]:
    """What trainer ``i`` (on ``workers[i]``) is told: the job, plus its own place in it."""
    w, batch = workers[i], batches[i]
    job = {
        **base_job,
        "client_id": client.id,
        "host": w.host,
        "gpus": list(w.gpus),
        # Each trainer's own share of the global batch (even, or by rows: dvml.train.elastic).
        "per_worker_batch": batch,
        "tf_config": {"cluster": {"worker": endpoints}, "task": {"type": "worker", "index": i}},
        # Trainers that share this machine's cores: its network address, not DVML_HOST
        # (a LocalCluster's simulated hosts are one machine).
        "trainers_on_host": sum(1 for o in workers if machine(o) == machine(w)),
    }
    fit = base_job.get("program", "fit") == "fit"
    if fit and base_job.get("sync", "step") == "step" and len(set(batches)) > 1:
        # unequal local batches: each row weighs n*b/B, so that the step's gradient stays the
        # mean over the global batch (dvml.resolve.batches)
        job["row_weight"] = row_weights(batches)[i]
    if fit and not base_job.get("use_gpus"):
        # A CPU fit's trainers go on as this client's inference sessions once the fit is
        # done (sessions.adopt): an evaluate right after it pays no TensorFlow import.
        job["serve_after"] = inference_settings(client.id)
    return job


_JOB_FIELDS = ("program", "model", "training", "sync", "num_iterations", "start_iteration")
"""What the job's first event on its topic tells dvml's dashboard page (dvml.dashboard)."""


def _log_job(client: Client, topic: str, message: dict[str, Any]) -> None:
    """Best effort: a scheduler that misses the event only leaves the page short of it."""
    try:
        client.log_event(topic, message)
    except Exception:
        pass


def find_checkpoint(
    client: Client, workers: list[WorkerInfo], directory: str, key: str
) -> tuple[int, bytes, list[dict[str, Any]]] | None:
    """The last iteration every trainer checkpointed for job ``key``: the iteration to start
    from, its weights and the history up to it; None when there is none."""
    states = client.gather(
        [
            client.submit(
                launch.checkpoint_state,
                directory,
                w.name,
                workers=[w.address],
                allow_other_workers=False,
                pure=False,
            )
            for w in workers
        ]
    )
    return resume_from(states, key)


def resume_from(
    states: list[dict[str, Any] | None], key: str
) -> tuple[int, bytes, list[dict[str, Any]]] | None:
    """Where a rerun of job ``key`` starts, from each trainer's last checkpoint (``states``,
    one per trainer, as :func:`dvml.train.runtime.launch.checkpoint_state` reads it): the
    iteration to start from, its weights and the history up to it; None when any trainer has
    no checkpoint of this job or no iteration is common to all (start afresh). Pure.
    """
    found = [s for s in states if s is not None and s.get("job_key") == key]
    if not found or len(found) < len(states):
        return None
    # Every trainer's weights are the same after an iteration: any state of it will do.
    held = {s["iteration"]: s for s in found}
    done = resume_iteration(
        {i: [r["iteration"] for r in s["history"]] for i, s in enumerate(found)},
        lambda iteration: iteration in held,
    )
    if done == 0:
        return None
    history = [r for r in held[done]["history"] if r["iteration"] <= done]
    return done + 1, held[done]["weights"], history


def clear_checkpoints(client: Client, workers: list[WorkerInfo], directory: str) -> None:
    """The job's result is saved: its checkpoints on every trainer's worker are not needed."""
    client.gather(
        [
            client.submit(launch.clear_checkpoint, directory, workers=[w.address], pure=False)
            for w in workers
        ]
    )


def _wait_trainers(
    client: Client,
    futures: list[Any],
    workers: list[WorkerInfo],
    abort: Any,
    what: str,
    until: Callable[[], bool] | None = None,
) -> list[dict[str, Any]]:
    """Wait for every trainer; on the first failure, a departed worker (the runtime's
    watcher) or an interrupt here, stop them all."""
    rerun = f"run {what} again: it resumes from the last completed iteration"
    try:
        outcome = watch(client, futures, workers, until=until)
        if outcome.stopped:
            raise BoundaryReached()
        if outcome.gone:
            # Their trainers' tasks would keep the clean-up waiting until the scheduler gives
            # up on the workers: stop waiting for them now.
            client.cancel([f for f, w in zip(futures, workers, strict=True) if w in outcome.gone])
            raise WorkerDepartedError(
                f"{describe_departure(outcome.gone)}. Bring the host back (or preprocess onto "
                f"the remaining workers) and {rerun} when the data is still in place.",
                outcome.gone,
            )
        if outcome.failed is not None:
            # The first error to arrive is often a survivor's "peer went away". A departed
            # worker is named at once (the scheduler drops a dead one within a second);
            # else blame the trainer that died first when it reports within a few seconds.
            first = outcome.failed.exception()
            if looks_like_peer_failure(f"{type(first).__name__}: {first}"):
                _raise_if_a_peer_left(client, futures, workers, first, rerun, peer_wait=1.0)
            future = _first_cause(futures, outcome.failed)
            worker = workers[futures.index(future)].name
            exc = future.exception()
            _raise_if_a_peer_left(client, futures, workers, exc, rerun)
            if isinstance(exc, TrainerFailedError):
                raise exc
            raise TrainerFailedError(
                f"The trainer on worker {worker} failed: {type(exc).__name__}: {exc}. If "
                f"the worker died, {rerun}."
            ) from exc
        return [f.result() for f in futures]
    except BaseException:
        # The others would block in collectives until the peer timeout: stop them now. Each
        # launcher polls the abort event and kills its trainer process within a second.
        abort.set()
        _settle(futures, timeout=120)
        raise


def _first_cause(futures: list[Any], failed: Any, wait: float = 5.0) -> Any:
    """The failed trainer to blame: ``failed``, unless its error is what a lost peer causes
    and another trainer fails within ``wait`` seconds for a reason of its own (killed by a
    signal, an error in the model): then that one."""

    def own_failure(future: Any) -> bool:
        text = f"{type(exc := future.exception()).__name__}: {exc}"
        # A killed trainer's last lines may mention connections: its signal decides.
        return KILLED_BY in text or not looks_like_peer_failure(text)

    if own_failure(failed):
        return failed
    deadline = time.monotonic() + wait
    while True:
        for future in futures:
            if future is not failed and future.status == "error" and own_failure(future):
                return future
        pending = [f for f in futures if f.status == "pending"]
        if not pending or time.monotonic() >= deadline:
            return failed
        time.sleep(0.25)


def _raise_if_a_peer_left(
    client: Client,
    futures: list[Any],
    workers: list[WorkerInfo],
    exc: Any,
    rerun: str,
    peer_wait: float = 5.0,
) -> None:
    """A surviving trainer's collective error hides the host that went away: name that host.

    Asked whatever the error says: what a survivor reports when its peer's host dies depends
    on where in a step it was (and on the load), and a departed worker is the cause in any
    case. Only an error that looks like a lost peer waits (``peer_wait`` seconds at most) for
    the scheduler to notice.
    """
    text = f"{type(exc).__name__}: {exc}"
    wait = peer_wait if looks_like_peer_failure(text) else 0.0
    gone = departed_workers(client, workers, wait=wait)
    if gone:
        # Their trainers' tasks would keep the clean-up waiting until the scheduler gives
        # up on the workers: stop waiting for them now.
        client.cancel([f for f, w in zip(futures, workers, strict=True) if w in gone])
        raise WorkerDepartedError(
            f"{describe_departure(gone)}. The other trainers then failed ({text[:300]}). Bring "
            f"the host back (or preprocess onto the remaining workers) and {rerun} when the "
            "data is still in place.",
            gone,
        ) from exc


def _settle(futures: list[Any], timeout: float) -> None:
    """Wait (bounded) until every future is done, ignoring its outcome."""
    for future in futures:
        try:
            future.result(timeout=timeout)
        except BaseException:
            pass
