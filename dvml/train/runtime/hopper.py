"""Client side of serving trainers: the interface through which schedulers move models.

A scheduler (``fit_multiple``'s model hopper, a model search) decides which model trains on
which worker and for how long; :class:`ModelHopper` does it. It keeps each model's *state*
(weights and optimizer variables) as the Dask future of the task that last trained it, so the
state stays on that worker until the next task needs it somewhere else (Dask moves it worker
to worker; the client holds only futures). The verbs:

- :meth:`~ModelHopper.add`: a model joins the running job (a configuration and a starting
  state);
- :meth:`~ModelHopper.train`: one step of its schedule (its ``epochs``) on one worker's local
  rows, continuing from its current state;
- :meth:`~ModelHopper.park` / :meth:`~ModelHopper.resume`: a parked model is not trained; its
  state stays on its worker (and in its last checkpoint) until it is resumed, by the same
  trainers, which are never restarted;
- :meth:`~ModelHopper.evaluate`, :meth:`~ModelHopper.checkpoint` (the runtime's checkpoint
  store, owner-only), :meth:`~ModelHopper.checkpoints` and :meth:`~ModelHopper.load` (what is
  kept, and a model's state from it), :meth:`~ModelHopper.weights`, :meth:`~ModelHopper.digest`;
- :meth:`~ModelHopper.wait`: wait for tasks with the runtime's failure watcher (a failed
  trainer or a departed worker or host is named in bounded time);
- :meth:`~ModelHopper.watch`: the same watcher, reporting instead of raising (a scheduler
  that goes on without a departed worker); :meth:`~ModelHopper.lose`: leave departed workers
  out of the job and forget the models whose state went with them;
  :meth:`~ModelHopper.forget`: drop a model, to add it again from another state;
  :meth:`~ModelHopper.renew`: restart the trainers on the remaining workers (they open the
  datasets' latest layout, after a re-pin);
- :meth:`~ModelHopper.alive`: whether a worker's trainer still runs (a search goes on without
  a worker whose trainer died);
- :meth:`~ModelHopper.stop`: stop the job's trainers (also done by their client lease when
  this client dies).

Nothing here decides a schedule: that is the scheduler's job.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import ArgumentError, TrainerFailedError
from dvml.train.runtime import launch, sessions
from dvml.train.runtime.plan import machine, runtime_settings
from dvml.train.runtime.watcher import Outcome, departed_workers, describe_departure, watch

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["ModelHopper"]


class ModelHopper:
    """The serving trainers of one job (one per worker) and the models they train.

    Parameters
    ----------
    client : distributed.Client
    name : str
        Names the job in messages and in its trainers' job files (``model_output``).
    training, validation : str
        The datasets every trainer opens locally (validation may be None).
    workers : list of WorkerInfo
        One trainer each (the workers that hold the training set).
    seed : int
        The job's seed (:func:`~dvml.train.runtime.plan.shuffle_seed`).
    job_key, checkpoint_dir : str
        The key a rerun resumes by, and where checkpoints go.
    custom_sources : dict, use_gpus : bool, timeout : float
        Custom objects' sources; GPUs; seconds one task may take.
    augment : dict, optional
        Per-epoch augmentation of the training batches, in its job-file form
        (:func:`dvml.train.runtime.augment.encode`).
    started_at : float, optional
        Wall clock the job's records are timed from (an earlier run's, once resumed).
    """

    def __init__(
        self,
        client: Client,
        *,
        name: str,
        training: str,
        validation: str | None,
        workers: list[WorkerInfo],
        seed: int,
        job_key: str,
        checkpoint_dir: str,
        custom_sources: dict[str, str],
        use_gpus: bool,
        timeout: float,
        augment: dict[str, Any] | None = None,
        started_at: float | None = None,
    ) -> None:
        self.client, self.workers, self.name = client, workers, name
        self.job_key, self.checkpoint_dir = job_key, checkpoint_dir
        self.job: dict[str, Any] = {
            "job_id": uuid.uuid4().hex[:12],
            "name": name,
            "model_output": name,  # names the job in its trainers' job files
            "configs": {},
            "training": training,
            "validation": validation,
            "seed": seed,
            "custom_objects": custom_sources,
            "use_gpus": use_gpus,
            "timeout": timeout,
            "augment": augment,
            "workers": [w.name for w in workers],
            "trainers_on_host": [
                sum(1 for o in workers if machine(o) == machine(w)) for w in workers
            ],
            **runtime_settings(),
            "client_id": client.id,
            "started_at": time.time() if started_at is None else started_at,
        }
        # dvml's dashboard page follows the job on its topic (the hops log there themselves)
        self.topic = f"dvml-hop-{self.job['job_id']}"
        self._log({"kind": "job", "program": "hop", "model": name, "training": training,
                   "workers": self.job["workers"], "started": self.job["started_at"]})  # fmt: skip
        self.states: dict[int, Future] = {}
        # called once when the job's trainers stop (a memory reservation given back)
        self.on_stop: list[Callable[[], object]] = []
        self.parked: set[int] = set()
        self.submitted: list[Future] = []
        self._last_checkpoint: dict[int, Future] = {}
        self._seq = itertools.count()

    @property
    def job_id(self) -> str:
        return str(self.job["job_id"])

    def _job(self) -> dict[str, Any]:
        # A copy per task: later add() calls must not change what an earlier task was sent.
        return copy.deepcopy(self.job)

    def _submit(self, fn: Any, *args: Any, worker: WorkerInfo | None, **kwargs: Any) -> Future:
        if worker is not None:
            kwargs.update(workers=[worker.address], allow_other_workers=False)
        future = self.client.submit(fn, *args, pure=False, **kwargs)
        self.submitted.append(future)
        return future

    def add(
        self, mst_key: int, model: dict[str, Any], state: bytes | Future, worker: WorkerInfo
    ) -> None:
        """Add model ``mst_key`` to the job: ``model`` has ``model_json`` and the parsed
        ``compile_params`` and ``fit_params``; ``state`` (:mod:`dvml.train.runtime.model_state`
        bytes, or the future of a task that returns ``{"state": ...}``) starts it, placed on
        ``worker``."""
        if mst_key in self.states:
            raise ArgumentError(
                f"Model {mst_key} is already in job {self.name!r}. Received: mst_key={mst_key}; "
                f"models in the job: {sorted(self.states)}."
            )
        self.job["configs"][str(mst_key)] = model
        if isinstance(state, bytes):
            state = self._place(state, worker)
        self.states[mst_key] = state

    def _place(self, state: bytes, worker: WorkerInfo) -> Future:
        """Scatter a starting state to ``worker``, else to another worker of the job.

        A worker that dies under the scatter fails it at once (CommClosedError, or the
        scheduler no longer knows it), but one that dies just before the scheduler connects
        to it can hold the scatter for the scheduler's connect timeout (30 s by default): the
        scatter is watched, and given up once the watcher names the worker gone. The watcher
        of the job's tasks reports the departure itself.
        """
        # A list of one: scattering a dict would scatter each of its values on its own.
        first = [{"state": state, "record": None}]
        others = [w for w in self.workers if w != worker]
        for targets in ([worker], others):
            if not targets:
                continue
            addresses = [w.address for w in targets]
            try:
                placed, gone = self._watched(
                    lambda a=addresses: self.client.scatter(first, workers=a, hash=False),
                    targets,
                )
            except (OSError, KeyError):
                continue
            if not gone:
                return placed[0]
        raise TrainerFailedError(
            f"The starting state of a model of job {self.name!r} could not be placed on any "
            f"of its workers: {[w.name for w in [worker, *others]]} are gone or unreachable. "
            "Check `dvml cluster status`, bring the workers back and run the job again."
        )

    def _watched(
        self, call: Any, workers: list[WorkerInfo], probe_every: float = 2.0
    ) -> tuple[Any, list[WorkerInfo]]:
        """``call()``'s value and no departed worker; or None and the departed ones, when one
        of ``workers`` leaves while the call waits (the call is left to end on its own: Dask
        can wait on a departed worker for a connect timeout, or for ever)."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="dvml-hopper-call", daemon=True)
        thread.start()
        thread.join(probe_every)
        while thread.is_alive():
            gone = departed_workers(self.client, workers, wait=0.0)
            if gone:
                return None, gone
            thread.join(probe_every)
        if "error" in box:
            raise box["error"]
        return box["value"], []

    def train(self, mst_key: int, worker: WorkerInfo, iteration: int) -> tuple[Future, Future]:
        """Train model ``mst_key`` once more (its ``epochs``) on ``worker``'s local rows, from
        its current state (a parked model is resumed). Returns the futures of its new state
        and of the step's small record (loss, seconds, trainer pid, digest of what it started
        from)."""
        self.resume(mst_key)
        previous = self._state(mst_key)
        hop = self._submit(
            sessions.train_hop, self._job(), mst_key, iteration, previous, previous.key,
            worker=worker, retries=0,
            key=f"dvml-hop-{self.job_id}-{iteration}-{next(self._seq)}-{mst_key}",
        )  # fmt: skip
        record = self._submit(sessions.hop_record, hop, worker=worker)
        self.states[mst_key] = hop
        return hop, record

    def park(self, mst_key: int) -> Future:
        """Stop training model ``mst_key`` for now; its state stays where it is (returned)."""
        state = self._state(mst_key)
        self.parked.add(mst_key)
        self._log({"kind": "park", "mst_key": mst_key})
        return state

    def resume(self, mst_key: int) -> None:
        """Make a parked model trainable again (a no-op for an active one)."""
        self._state(mst_key)
        self.parked.discard(mst_key)

    def rewind(self, mst_key: int, state: Future) -> None:
        """A job of model ``mst_key`` failed: it goes on from ``state`` (its last state that
        trained), and its next checkpoint waits only for one that was written (a checkpoint
        of the failed job failed with it, and would fail every later one)."""
        self._state(mst_key)
        self.states[mst_key] = state
        last = self._last_checkpoint.get(mst_key)
        if last is not None and last.status != "finished":
            del self._last_checkpoint[mst_key]

    def _state(self, mst_key: int) -> Future:
        if mst_key not in self.states:
            raise ArgumentError(
                f"No model {mst_key} in job {self.name!r}. Received: mst_key={mst_key}; models "
                f"in the job: {sorted(self.states)}. Add it with ModelHopper.add first."
            )
        return self.states[mst_key]

    def evaluate(self, mst_key: int, workers: list[WorkerInfo] | None = None) -> list[Future]:
        """Loss and metrics of model ``mst_key``'s current state on each worker's rows."""
        state = self._state(mst_key)
        return [
            self._submit(sessions.evaluate_state, self._job(), mst_key, state, worker=w)
            for w in (workers or self.workers)
        ]

    def checkpoint(
        self,
        mst_key: int,
        iteration: int,
        records: list[Future],
        evals: list[Future],
        worker: WorkerInfo,
    ) -> Future:
        """Checkpoint model ``mst_key``'s current state after ``iteration`` on ``worker`` (where
        the state is), after its previous checkpoint, with the iteration's records."""
        future = self._submit(
            sessions.checkpoint, self.checkpoint_dir, self.job_key, mst_key, iteration,
            self._state(mst_key), records, evals, self._last_checkpoint.get(mst_key),
            worker=worker,
        )  # fmt: skip
        self._last_checkpoint[mst_key] = future
        return future

    def checkpoints(self) -> list[tuple[WorkerInfo, dict[str, Any]]]:
        """Every checkpoint record of the job on each of its workers, with the worker: its
        ``mst_key``, ``iteration``, ``records``, ``evals`` and ``has_state`` (the state is
        kept there)."""
        listings = self.client.gather([
            self.client.submit(sessions.list_checkpoints, self.checkpoint_dir, self.job_key,
                               workers=[w.address], allow_other_workers=False, pure=False)
            for w in self.workers
        ])  # fmt: skip
        return [(w, m) for w, listing in zip(self.workers, listings, strict=True) for m in listing]

    def load(self, mst_key: int, iteration: int, holder: WorkerInfo) -> Future:
        """The state of model ``mst_key`` checkpointed after ``iteration`` on ``holder``, as a
        future that stays there (to :meth:`add` the model from it)."""
        return self.client.submit(
            sessions.load_checkpoint, self.checkpoint_dir, mst_key, iteration,
            workers=[holder.address], allow_other_workers=False, pure=False,
        )  # fmt: skip

    def digest(self, mst_key: int) -> Future:
        """The sha256 of model ``mst_key``'s current weights, computed where the state is."""
        return self._submit(sessions.state_digest, self._state(mst_key), worker=None)

    def weights(self, keys: list[int]) -> dict[int, bytes]:
        """The current weights of ``keys`` (registry bytes; optimizer states stay)."""
        futures = [self._submit(sessions.weights_of, self._state(k), worker=None) for k in keys]
        return dict(zip(keys, self.client.gather(futures), strict=True))

    def departure_error(self, gone: list[WorkerInfo]) -> TrainerFailedError:
        """The error that stops the job because workers ``gone`` left the cluster."""
        self._log({"kind": "departed", "workers": [w.name for w in gone], "at": time.time()})
        self._log({"kind": "ended", "outcome": "failed", "at": time.time()})
        return TrainerFailedError(
            f"{describe_departure(gone)}; job {self.name!r} was stopped. Bring the worker back "
            "(or preprocess onto the remaining workers) and run it again: it resumes from the "
            "models' checkpoints."
        )

    def fetch(
        self, futures: list[Future], probe_every: float = 2.0
    ) -> tuple[list[Any], list[WorkerInfo]]:
        """The results of ``futures`` (tasks that finished), and no departed worker; or none
        and the departed workers, when a worker that held a result leaves meanwhile (Dask would
        wait for ever to compute it again on a worker that is gone)."""
        values, gone = self._watched(lambda: self.client.gather(futures), self.workers,
                                     probe_every)  # fmt: skip
        if gone:
            self.client.cancel(futures)  # ends the gather
            return [], gone
        return list(values), []

    def all_weights(self) -> tuple[dict[int, bytes], list[WorkerInfo]]:
        """The weights of every model (those whose task fails are left out), watched: when
        workers depart meanwhile, no weights and the departed workers (:meth:`lose` them and
        ask again)."""
        futures = {
            k: self._submit(sessions.weights_of, state, worker=None)
            for k, state in sorted(self.states.items())
        }
        pending = list(futures.values())
        while pending:
            outcome = self.watch(pending)
            if outcome.gone:
                return {}, outcome.gone
            pending = [f for f in pending if not f.done()]
        finished = {k: f for k, f in futures.items() if f.status == "finished"}
        values, gone = self.fetch(list(finished.values()))
        return dict(zip(finished, values, strict=True)) if not gone else {}, gone

    def wait(self, futures: list[Future]) -> None:
        """Wait for ``futures``; on any failed task of the job or a departed worker, cancel
        everything and raise, naming the trainer or host (bounded time)."""
        outcome = watch(self.client, futures, self.workers, watched=self.submitted)
        gone = outcome.gone
        if outcome.failed is not None:
            # A departed worker fails or cancels the tasks that needed what it held (a
            # cancelled one: its scattered input is lost), possibly before the scheduler has
            # dropped it: name the worker, not the task.
            cancelled = outcome.failed.status == "cancelled"
            gone = departed_workers(self.client, self.workers, wait=5.0 if cancelled else 0.0)
        if gone:
            self.cancel()
            raise self.departure_error(gone)
        if outcome.failed is not None:
            self.cancel()
            if outcome.failed.status == "cancelled":
                raise TrainerFailedError(
                    f"A task of job {self.name!r} was cancelled: an input it needed was lost. "
                    "Run it again: it resumes from the models' checkpoints."
                )
            exc = outcome.failed.exception()
            if isinstance(exc, TrainerFailedError):
                raise exc
            raise TrainerFailedError(
                f"A task of job {self.name!r} failed: {type(exc).__name__}: {exc}. Run it "
                "again: it resumes from the models' checkpoints."
            ) from exc

    def watch(self, futures: list[Future], *, first: bool = False) -> Outcome:
        """Wait for ``futures`` (with ``first``: for any one of them) as :meth:`wait` does,
        but return the outcome (a failed task, or the departed workers) instead of raising:
        for a scheduler that goes on without them (:meth:`lose`)."""
        return watch(self.client, futures, self.workers, first=first)

    def lose(self, gone: list[WorkerInfo]) -> list[int]:
        """Leave the departed workers ``gone`` out of the job: cancel every task still in
        flight, and forget every model whose state is not held by a remaining worker (it was
        on a departed one, or its task was cancelled). Returns the forgotten models' keys: the
        scheduler adds them again from a checkpoint (:meth:`add`), or gives them up."""
        self.workers = [w for w in self.workers if w not in gone]
        self._log({"kind": "departed", "workers": [w.name for w in gone], "at": time.time()})
        self.cancel()
        kept = {w.address for w in self.workers}
        finished = [f for f in self.states.values() if f.status == "finished"]
        held = self.client.who_has(finished) if finished else {}
        lost = [
            k
            for k, f in self.states.items()
            if f.status != "finished" or not kept & set(held.get(f.key, ()))
        ]
        self.client.cancel([self.states[k] for k in lost])
        self.forget(lost)
        # a checkpoint chain goes on only after a checkpoint that was written
        self._last_checkpoint = {
            k: f for k, f in self._last_checkpoint.items() if f.status == "finished"
        }
        return lost

    def renew(self, workers: list[WorkerInfo]) -> None:
        """Stop the job's serving trainers and go on with new ones on ``workers``.

        A serving trainer opens its local rows once, when it starts: after a re-pin moved
        rows onto ``workers`` (a new dataset version), only a new trainer sees them. The job
        takes a new job id, so the next task on each worker starts a trainer (a standby one
        when ready) that opens the latest layout; the models, their states and checkpoints
        (same ``job_key`` and directory) stay. Forget the models' in-flight states first
        (:meth:`lose`, :meth:`forget`): a task of the old id would be refused.
        """
        self.cancel()
        old = self.job_id
        try:  # the old trainers: a late task of their job id is refused from now on
            self.client.run(sessions.stop_session, old, on_error="ignore")
        except OSError:  # a worker that went meanwhile: its trainer went with it
            pass
        new = uuid.uuid4().hex[:12]
        # the dashboard shows the old trainers' job ended and follows the new one's topic
        self._log({"kind": "ended", "outcome": f"renewed as {new}", "at": time.time()})
        self.workers = list(workers)
        self.job.update(
            job_id=new, workers=[w.name for w in workers],
            trainers_on_host=[sum(1 for o in workers if machine(o) == machine(w))
                              for w in workers],
        )  # fmt: skip
        self.topic = f"dvml-hop-{self.job['job_id']}"  # the trainers log their hops there
        self._log({"kind": "job", "program": "hop", "model": self.name,
                   "training": self.job["training"], "workers": self.job["workers"],
                   "started": self.job["started_at"]})  # fmt: skip

    def forget(self, keys: list[int]) -> None:
        """Drop models ``keys`` from the job (their configurations stay known to the
        trainers): the scheduler adds them again from another state (:meth:`add`)."""
        for k in keys:
            self._state(k)
            del self.states[k]
            self.parked.discard(k)
            self._last_checkpoint.pop(k, None)

    def cancel(self) -> None:
        """Cancel every task of the job still in flight (the states already computed stay:
        a scheduler may go on from them)."""
        self.client.cancel([f for f in self.submitted if not f.done()])
        self.submitted = [f for f in self.submitted if f.status == "finished"]

    def alive(self, worker: WorkerInfo) -> bool:
        """Whether the job's trainer on ``worker`` still runs (a task failed there: was it the
        model or the trainer?). False when the worker itself is gone."""
        try:
            found = self.client.run(
                sessions.trainer_alive, self.job_id, workers=[worker.address], on_error="ignore"
            )
        except OSError:
            return False
        return bool(found.get(worker.address, False))

    def clear_checkpoints(self) -> None:
        """Remove the job's checkpoints on every worker (its models are registered)."""
        self.client.gather(
            [
                self.client.submit(
                    launch.clear_checkpoint, self.checkpoint_dir, workers=[w.address], pure=False
                )
                for w in self.workers
            ]
        )

    def stop(self) -> None:
        """Stop the job's trainers on every worker (idempotent)."""
        try:
            self.client.run(sessions.stop_session, self.job_id, on_error="ignore")
            self._log({"kind": "ended", "outcome": "done", "at": time.time()})
        finally:
            callbacks, self.on_stop = self.on_stop, []
            for callback in callbacks:
                callback()

    def _log(self, message: dict[str, Any]) -> None:
        """Best effort: the dashboard page misses an event, the job goes on."""
        try:
            self.client.log_event(self.topic, message)
        except Exception:
            pass

    def __enter__(self) -> ModelHopper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
