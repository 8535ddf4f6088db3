"""``dvml.automl(method="asha")``: the ASHA state machine driven on ONE job of serving trainers.

:class:`dvml.search.asha.Asha` decides; this module carries its decisions out on the trainer
runtime's :class:`~dvml.train.runtime.hopper.ModelHopper` (one serving trainer per worker that
holds the training set, started once and restarted only when a worker leaves: each opens its
local partitions once):

- ``Start``: the configuration's model joins the running job (:meth:`ModelHopper.add`) on the
  worker that asked, and trains up to the first rung;
- ``Promote``: a parked model resumes from its state (weights AND optimizer variables, kept in
  the cluster where its last task left it) on the worker that asked, up to the next rung; Dask
  moves the state when that is another worker. Nothing is retrained from scratch;
- ``Park`` / ``Finish`` / ``Fail``: the model's state stays (parked) until a promotion;
- ``Wait``: the worker stays idle until the next result; ``Stop``: no more work is given out.

Each worker takes two jobs at once (:data:`JOBS_PER_WORKER`): its one trainer trains one model
at a time, and the other job's state moves, loads and saves while it does, so the trainer does
not wait for the client's decisions or for Dask between the tasks of one model.

One **iteration** of a model is as many rows as the training set has: ``W`` sub-epochs (its
``epochs`` each) on the local rows of the worker it runs on, for ``W`` workers; so an ASHA
iteration costs what a ``fit_multiple`` iteration costs (which visits the ``W`` partitions once
each). After each iteration the model's state is checkpointed on its worker
(:meth:`ModelHopper.checkpoint`, owner-only), with that iteration's records and evaluations.
At each rung (and every ``metrics_compute_frequency`` iterations) the model is evaluated on
every worker's rows (:meth:`ModelHopper.evaluate`); it is ranked by the validation loss, else
the training loss.

A configuration whose loss is not a finite number (NaN, inf), or whose task fails (an error, out
of memory), is failed and ranked last; the search goes on. A worker whose trainer died is left
out of the rest of the search, and so is one that leaves the cluster; either way its rows are
re-pinned first (:func:`dvml.train.hop_repin.go_on_without`, the trainers restarted): an
iteration is then one sub-epoch per remaining worker, still the training set's rows.

Every decision goes to the search's journal, saved in the registry (the summary of the run
``model_output``, ``status="running"``) before it is carried out and after every result.
``resume=True`` replays the journal (:meth:`Asha.from_journal`), queues the jobs that were in
flight and starts every model from its last checkpoint: each active model loses at most the
iteration it was training.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from distributed.client import FutureCancelledError

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import TrainerFailedError
from dvml.registry.database import Registry
from dvml.search import journal as j
from dvml.search.asha import Asha
from dvml.search.hyperband import rank_key
from dvml.search.outcome import Configuration, SearchOutcome, build_outcome
from dvml.train.departures import departure_fields
from dvml.train.hop_job import HopJob
from dvml.train.hop_repin import dead_trainers, go_on_without, trainers_gone
from dvml.train.hop_tables import build_tables
from dvml.train.runtime.model_state import state_bytes
from dvml.train.runtime.plan import Job, job_key, model_spec, now
from dvml.train.runtime.watcher import departed_workers, describe_departure
from dvml.train.summary import aggregate

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["AshaDriver", "data_identity", "data_key"]

logger = logging.getLogger("dvml.search")

JOBS_PER_WORKER = 2
"""Jobs a worker runs at once (its trainer trains one at a time; the other job's state moves,
loads and saves meanwhile)."""


_PACKING_ONLY = ("dataset_id", "created_at", "dvml_version", "training_dataset")
"""Summary fields that change at every preprocessing of the same data."""


def data_identity(dataset: Any) -> dict[str, Any]:
    """What a dataset holds, as its summary and layout say: the same for the same source
    preprocessed again the same way (same rows, classes, normalization, seed, buffers on the
    same workers by name), unlike its ``dataset_id``, new at every preprocessing.

    Worker addresses and vineyard instance ids are left out (a new LocalCluster has new ones);
    the bytes themselves are not read (a source changed in place with the same rows, classes
    and layout gives the same identity). JSON-able.
    """
    identity = {k: v for k, v in dataset.summary.items() if k not in _PACKING_ONLY}
    rules = identity.get("distribution_rules")
    if isinstance(rules, dict):
        identity["distribution_rules"] = {
            **rules, "resolved": [r.get("name") for r in rules.get("resolved", [])]
        }  # fmt: skip
    identity["buffers"] = [
        [b["index"], b["worker_name"], b["rows"]] for b in dataset.layout["buffers"]
    ]
    return identity


def data_key(dataset: Any) -> str:
    """A short key of :func:`data_identity`."""
    return job_key(data_identity(dataset))


def _broken(future: Future) -> bool:
    """Whether a task failed or was cancelled (its input was lost with a worker)."""
    return future.status in ("error", "cancelled")


@dataclasses.dataclass
class Running:
    """One trial's job in flight: iterations ``first..last`` on ``worker``."""

    trial_id: int
    worker: WorkerInfo
    first: int
    last: int
    began: float
    records: dict[int, list[Future]]
    evals: dict[int, list[Future]]
    terminal: list[Future]
    previous: Any  # the state before this job (kept when the job fails)
    evaluated_on: list[WorkerInfo]  # its evaluations run on every worker of the job


class AshaDriver:
    """Carry an :class:`Asha` search out on one :class:`~dvml.train.hop_job.HopJob` (see the
    module).

    Parameters
    ----------
    client, reg
        The Dask client and the registry.
    job : Job
        The placed job the search's :class:`~dvml.train.hop_job.HopJob` runs.
    search : Asha
        A fresh search, or one rebuilt from its journal (``resumed``).
    model_output : str
        The search's name (its models are ``f"{model_output}_{trial_id}"``).
    save_journal : callable
        ``save_journal(text)`` stores the journal in the registry.
    memory_configs : list of dict, optional
        The trainer configurations the job is admitted by (its memory plan, before any trainer
        starts: :func:`dvml.search.search_memory.bounding_configs`); None: not planned.
    check : callable, optional
        Called after each hop; raises to stop the search (``Lease.check``: a dataset dropped
        with ``force=True`` under it).
    """

    def __init__(
        self,
        client: Client,
        reg: Registry,
        job: Job,
        search: Asha,
        model_output: str,
        save_journal: Any,
        *,
        progress: bool = True,
        resumed: bool = False,
        name: str | None = None,
        description: str | None = None,
        check: Callable[[], None] = lambda: None,
        memory_configs: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.client, self.reg, self.job, self.search = client, reg, job, search
        # raises when the search must stop (its dataset lease broken by a forced drop): asked
        # after each hop, so a search on freed memory stops at once rather than at its end
        self.check = check
        self.model_output, self.save_journal, self.progress = model_output, save_journal, progress
        self.resumed, self.name, self.description = resumed, name, description
        self.workers = list(job.workers)
        self.width = len(self.workers)  # hops are numbered by it (a seed each)
        self.sub_epochs = self.width  # per iteration: one per worker holding rows
        self.departures: list[dict[str, Any]] = []  # the re-pins (hop_repin.go_on_without)
        self.loss_part = "validation" if job.valid is not None else "training"
        # keyed by what the datasets hold, not by their dataset_id: a `cluster: local` job
        # resumed after its cluster died with it preprocesses the same source again (a new
        # dataset_id) and must find its checkpoints (issue 42)
        self.key = job_key(
            "automl-asha", model_output, data_key(job.train),
            data_key(job.valid) if job.valid else None, search.params.text(),
            search.seed, search.space.grids(), [w.name for w in self.workers], job.seed,
            *job.augment_key,
        )  # fmt: skip
        # time already spent by the runs this one resumes (the time budget counts them)
        self.offset = max((float(r["event"].get("now", 0.0)) for r in search.journal.records),
                          default=0.0)  # fmt: skip
        self.started = time.time()
        self.start_text = now()
        self.specs: dict[int, dict[str, Any]] = {}
        self.history: dict[int, dict[int, dict[str, Any]]] = {}
        self.departed: list[str] = []  # workers that left the cluster during the search
        self.idle: list[WorkerInfo] = []
        self.running: dict[int, Running] = {}
        self.resumed_from: dict[int, int] = {}  # trial -> the checkpointed iteration restored
        self.trained = 0  # model-iterations this run trained
        self.stopping = False
        # admitted by the plan of max_configs of the space's largest configurations
        self.hop = HopJob(client, job, model_output, kind="asha", key=self.key,
                          started_at=self.started - self.offset,
                          configs=memory_configs)  # fmt: skip
        self.hopper = self.hop.hopper
        self.checkpoint_dir = self.hop.checkpoint_dir

    # ------------------------------------------------------------------ the loop

    def now(self) -> float:
        return self.offset + time.time() - self.started

    def run(self) -> SearchOutcome:
        """Run the search to its end; stop the trainers; return what to register."""
        try:
            kept = self._restore() if self.resumed else {}
            # each worker takes JOBS_PER_WORKER jobs: one trains while the other's state is
            # moved, loaded and saved and the client decides (tasks of one model follow each
            # other, so one job alone would leave its trainer idle between its tasks)
            self.idle = [w for _ in range(JOBS_PER_WORKER) for w in self.workers]
            while True:
                try:
                    self._ask(self.idle, kept)
                    if not self.running:
                        break
                    for done in self._next_done(kept):
                        gone, died = self._finish(done)
                        if gone:  # this job and the rest of the batch were interrupted too
                            self._departed(gone, kept, died)
                            break
                        if done.trial_id not in self.running:  # not sent again
                            self.idle.append(done.worker)
                except (FutureCancelledError, OSError):
                    # A worker that departs can fail a scatter or cancel a fetched future
                    # before the watcher names it: ask the watcher; a departure is handled,
                    # anything else raised.
                    gone = departed_workers(self.client, self.workers)
                    if not gone:
                        raise
                    self._departed(gone, kept)
                # not those whose trainer died or that left the cluster
                self.idle[:] = [w for w in self.idle if w in self.workers]
            # every model's weights (those whose state is lost are left out); a worker that
            # departs now is left out too, its models' states reloaded from checkpoints
            weights = self.hop.final_weights(lambda gone: self._departed(gone, {}))
        except BaseException:
            self.hopper.cancel()
            raise
        finally:
            self.hopper.stop()
        outcome = self._outcome(weights)
        self.hopper.clear_checkpoints()
        return outcome

    def _ask(self, idle: list[WorkerInfo], kept: dict[int, tuple[int, WorkerInfo]]) -> None:
        """Give every idle worker work while the scheduler has some."""
        for worker in list(idle):
            if self.stopping:
                return
            decision = self.search.apply(j.Ask(worker.name, self.now()))
            self.save_journal(self.search.journal.dumps())  # before it is carried out
            if isinstance(decision, j.Start | j.Promote):
                idle.remove(worker)
                self._launch(decision, worker, kept)
            elif isinstance(decision, j.Stop):
                self.stopping = True
                self._line(f"stop: {decision.reason}")
            else:  # Wait: a running model may still make a promotion possible
                return

    def _launch(
        self, decision: Any, worker: WorkerInfo, kept: dict[int, tuple[int, WorkerInfo]]
    ) -> None:
        trial = self.search.trials[decision.trial_id]
        key = trial.trial_id
        last = self.search.levels[trial.target]
        first = trial.iterations
        if key not in self.hopper.states:
            spec = model_spec(
                self.reg, trial.model_id, trial.compile_params, trial.fit_params,
                self.job.train, list(self.job.custom_sources),
            )  # fmt: skip
            self.specs[key] = spec.config()
            state: Any = state_bytes(list(spec.weights) if spec.weights is not None else [])
            if key in kept:  # resumed: from its last checkpoint
                first, holder = kept.pop(key)
                state = self.hopper.load(key, first, holder)
                self.resumed_from[key] = first
            elif first > 0:
                # resumed, and no checkpoint of its iterations is left: it trains them again
                # from scratch (never counted as trained from its initial weights)
                self._line(f"trial {key}: no checkpoint of its {first} iteration(s) is left; "
                           "it trains them again from scratch")  # fmt: skip
                first = 0
            self.hopper.add(key, self.specs[key], state, worker)
        elif key in kept:
            first = self.resumed_from[key] = kept.pop(key)[0]
        self._submit(key, worker, first, last)
        verb = "start" if isinstance(decision, j.Start) else f"promote to rung {trial.target}"
        span = f"iterations {first + 1}..{last}" if first < last else f"evaluated at {last}"
        self._line(f"trial {key} {verb} on {worker.name}: {span}")

    def _submit(self, key: int, worker: WorkerInfo, first: int, last: int) -> None:
        previous = self.hopper.states[key]
        self.hopper.resume(key)
        records: dict[int, list[Future]] = {}
        evals: dict[int, list[Future]] = {}
        terminal: list[Future] = []
        for t in range(first + 1, last + 1):
            records[t] = [
                self.hopper.train(key, worker, (t - 1) * self.width + s + 1)[1]
                for s in range(self.sub_epochs)
            ]
            due = t == last or t % self.job.frequency == 0
            evals[t] = self.hopper.evaluate(key, self.workers) if due else []
            terminal = [self.hopper.checkpoint(key, t, records[t], evals[t], worker)]
        if first == last:  # resumed after its last iteration was checkpointed
            evals[last] = self.hopper.evaluate(key, self.workers)
        terminal += evals[last]
        self.running[key] = Running(
            key, worker, first, last, time.time(), records, evals, terminal, previous,
            list(self.workers),
        )  # fmt: skip

    def _next_done(self, kept: dict[int, tuple[int, WorkerInfo]]) -> list[Running]:
        """Wait for at least one job to end (all of its last tasks done, or one failed), with
        the runtime's watcher: a departed worker is named within its bound, and the search
        goes on without it (:meth:`_departed`; then no job is returned)."""
        while True:
            done = [
                r
                for r in self.running.values()
                if all(f.done() for f in r.terminal) or any(_broken(f) for f in r.terminal)
            ]
            if done and any(_broken(f) for r in done for f in r.terminal):
                # a departed worker fails tasks too (its scattered states are lost): then
                # every job in flight goes again, none is failed for it
                gone = departed_workers(self.client, self.workers, wait=0.0)
                if gone:
                    self._departed(gone, kept)
                    return []
            if done:
                for r in done:
                    del self.running[r.trial_id]
                return done
            pending = [f for r in self.running.values() for f in r.terminal if not f.done()]
            outcome = self.hopper.watch(pending, first=True)
            if outcome.gone:
                self._departed(outcome.gone, kept)
                return []

    def _finish(self, done: Running) -> tuple[list[WorkerInfo], str]:
        """Report a job's result (or failure) to the scheduler; journal it; a progress line.
        Returns the workers the search must go on without, and why ("": they departed, then
        nothing is reported: the job was interrupted; else how a trainer of theirs died, the
        failure of the trials it was training, :meth:`_departed`)."""
        key, worker = done.trial_id, done.worker
        failed = [f for f in [*done.terminal, *(x for v in done.records.values() for x in v)]
                  if _broken(f)]  # fmt: skip
        decision: Any
        if failed:
            self.hopper.rewind(key, done.previous)
            exc = failed[0].exception() if failed[0].status == "error" else None
            reason = f"{type(exc).__name__}: {exc}"[:500] if exc else "its task was cancelled"
            dead = self._dead()
            if dead:  # its own trainer, or one that ran an evaluation of it (on every worker)
                return dead, reason
            self.hopper.park(key)
            decision = self.search.apply(j.Failure(key, reason, worker.name, self.now()))
        else:
            loss, gone = self._collect(done)
            if gone:
                return gone, ""
            decision = self.search.apply(
                j.Result(key, done.last, loss, worker.name, self.now(), time.time() - done.began,
                         checkpoint=f"{worker.name}:{key}-{done.last}")
            )  # fmt: skip
            self.hopper.park(key)
        self.save_journal(self.search.journal.dumps())
        self._line(f"trial {key} {self._said(decision)}; {self._best_line()}")
        self.check()
        return [], ""

    def _collect(self, done: Running) -> tuple[float | None, list[WorkerInfo]]:
        """Gather a job's records and evaluations into the history: the ranking loss (or the
        workers that departed meanwhile)."""
        flat = [f for part in (done.records, done.evals) for t in part for f in part[t]]
        values, gone = self.hopper.fetch(flat)
        if gone:
            return None, gone
        records: dict[int, list[Any]] = {}
        evals: dict[int, list[Any]] = {}
        for part, out in ((done.records, records), (done.evals, evals)):
            for t in part:
                out[t], values = values[: len(part[t])], values[len(part[t]) :]
        self.trained += done.last - done.first
        history = self.history.setdefault(done.trial_id, {})
        for t in sorted(set(records) | set(evals)):
            history[t] = {"records": records.get(t, []), "evals": evals.get(t, [])}
        found = [e[self.loss_part] for e in evals[done.last] if self.loss_part in e]
        return (aggregate(found).get("loss") if found else None), []

    def _departed(
        self, gone: list[WorkerInfo], kept: dict[int, tuple[int, WorkerInfo]], died: str = ""
    ) -> None:
        """Workers left the cluster: every job in flight is interrupted; each of its models
        is queued again from its last checkpoint on the remaining workers (or from scratch
        when it had trained nothing), else failed; a parked or finished model whose state
        went with them is added again from its rung's checkpoint, else failed. Their rows
        are copied onto the others first. ``died``: how their trainers died (they stay)."""
        names = [w.name for w in gone]
        why = trainers_gone(gone) if died else describe_departure(gone)
        self._line(f"{why}: the search goes on without it")
        self.departed.extend(names)
        for trial in [self.search.trials[k] for k in self.search.running if died]:
            if trial.worker in names:  # the trial its trainer was training fails with it
                decision = self.search.apply(j.Failure(trial.trial_id, died, trial.worker,
                                                       self.now()))  # fmt: skip
                self._line(f"trial {trial.trial_id} {self._said(decision)}")
        # the search's own view: every model given out and not reported yet (in flight, in
        # the batch being reported, or given out while the job was being sent); a model
        # already reported (parked, finished, failed) is not interrupted
        interrupted = set(self.search.running)
        self.running.clear()
        self.workers = [w for w in self.workers if w not in gone]
        rerun = ("Bring the workers back and run dvml.automl(..., resume=True): it resumes "
                 "from the journal's last decision.")  # fmt: skip
        lost = set(self.hop.lose(gone, self.workers, rerun))
        # the state of an interrupted job is some hop of it: start again from a checkpoint
        self.hopper.forget(sorted(interrupted - lost))
        # every row re-pinned, new trainers, before any state loads (a restart cancels tasks)
        departure = go_on_without(self.hop, gone, list(self.workers), rerun)
        self.sub_epochs = len(self.workers)
        latest = self._checkpoints()
        requeue, failed = [], []
        for trial in self.search.trials.values():
            k = trial.trial_id
            found = latest.get(k, {})
            if k in interrupted:
                usable = [t for t in found if t >= trial.iterations]
                if usable:
                    kept[k] = (max(usable), found[max(usable)])
                if usable or trial.iterations == 0:
                    requeue.append(k)
                else:
                    failed.append(k)
            elif k in lost and trial.status in ("parked", "finished"):
                if trial.iterations not in found:
                    failed.append(k)
                    continue
                holder = found[trial.iterations]
                self.hopper.add(k, self._spec(trial), self.hopper.load(k, trial.iterations, holder),
                                holder)  # fmt: skip
                self.hopper.park(k)
        # the first iteration trained without them: the earliest a requeued model goes on at
        reached = max((t.iterations for t in self.search.trials.values()), default=0)
        at = min((kept[k][0] if k in kept else 0 for k in requeue), default=reached) + 1
        self.departures.append({**departure, "at_iteration": at})
        self.search.apply(j.Departed(names, requeue, failed, self.now()))
        self.save_journal(self.search.journal.dumps())
        self.idle = [w for _ in range(JOBS_PER_WORKER) for w in self.workers]
        self._line(f"queued again: {requeue}; failed with the departed worker(s): {failed}")

    def _dead(self) -> list[WorkerInfo]:
        """The workers whose trainer died (a failed task may have run on another worker than
        its model's: its evaluation runs on every worker); the search leaves them out
        (:meth:`_departed`), their rows copied onto the others."""
        dead = dead_trainers(self.hop, self.workers)
        if dead and len(dead) == len(self.workers):
            raise TrainerFailedError(
                f"Every trainer of search {self.model_output!r} is gone. Received: workers "
                f"{[w.name for w in self.job.workers]}. Run dvml.automl(..., resume=True) "
                "again: it resumes from the journal's last decision."
            )
        return dead

    def _restore(self) -> dict[int, tuple[int, WorkerInfo]]:
        """Queue the jobs in flight; add every parked or finished model from its checkpoint.

        Returns the trials in flight: their last checkpointed iteration and its holder.
        """
        queued = self.search.apply(j.Resume(self.now()))
        self.save_journal(self.search.journal.dumps())
        latest = self._checkpoints()
        kept: dict[int, tuple[int, WorkerInfo]] = {}
        gone: list[int] = []  # parked or finished, and its rung's checkpoint is gone
        for trial in self.search.trials.values():
            found = latest.get(trial.trial_id, {})
            limit = self.search.levels[trial.target] if trial.status == "running" else \
                trial.iterations  # fmt: skip
            usable = [t for t in found if trial.iterations <= t <= limit]
            if not usable:
                # a running one trains again from scratch (_launch); a parked one has no
                # weights to register or promote: failed, said in the journal
                if trial.status in ("parked", "finished"):
                    gone.append(trial.trial_id)
                continue
            t = max(usable)
            if trial.status == "running":
                kept[trial.trial_id] = (t, found[t])
            elif trial.status in ("parked", "finished"):
                spec = model_spec(
                    self.reg, trial.model_id, trial.compile_params, trial.fit_params,
                    self.job.train, list(self.job.custom_sources),
                )  # fmt: skip
                self.specs[trial.trial_id] = spec.config()
                state = self.hopper.load(trial.trial_id, t, found[t])
                self.hopper.add(trial.trial_id, self.specs[trial.trial_id], state, found[t])
                self.hopper.park(trial.trial_id)
                self.resumed_from[trial.trial_id] = t
        if gone:
            self.search.apply(j.Departed([], [], gone, self.now()))
            self.save_journal(self.search.journal.dumps())
            self._line(f"failed: trials {gone}, their checkpoints in {self.checkpoint_dir} "
                       "are gone")  # fmt: skip
        self._line(f"resumed: {len(self.search.trials)} trials, in flight again: "
                   f"{queued.trial_ids}")  # fmt: skip
        return kept

    def _checkpoints(self) -> dict[int, dict[int, WorkerInfo]]:
        """Every checkpointed state of this search, by trial and iteration, and its holder;
        the history of every checkpointed iteration is read back too."""
        found = self.hop.checkpoints()
        for (k, t), meta in found.records.items():
            self.history.setdefault(k, {})[t] = {"records": meta["records"],
                                                  "evals": meta["evals"]}  # fmt: skip
        return found.holders

    def _outcome(self, weights: dict[int, bytes]) -> SearchOutcome:
        """MADlib's info rows and every model to register (one per configuration)."""
        configurations = [
            Configuration(
                t.trial_id,
                t.model_id,
                self._spec(t),
                t.iterations,
                summary={"asha_status": t.status},
                info={"status": t.status, "rung": t.rung, "iterations": t.iterations},
            )
            for t in self.search.trials.values()
        ]
        times = {"start": self.start_text, "end": now(), "name": self.name,
                 "description": self.description, "wall_seconds": self.now()}  # fmt: skip
        tables = build_tables(self.job, self.model_output, configurations, self.history,
                              weights, times)  # fmt: skip
        journal = self.search.journal.dumps()
        outcome = build_outcome(tables, self.job, self.history, times=times, journal=journal,
                                best=self.search.best())  # fmt: skip
        outcome.summary.update(
            rungs=list(self.search.levels),
            rung_sizes=self.search.rung_sizes(),
            stopped=self.search.stopped,
            trained_iterations=self.trained,
            resumed_from={str(k): t for k, t in sorted(self.resumed_from.items())},
        )
        repins = departure_fields(self.departures)  # "departed": ours, in order
        outcome.summary.update({k: v for k, v in repins.items() if k != "departed"})
        outcome.summary["departed"] = self.departed
        return outcome

    def _spec(self, trial: Any) -> dict[str, Any]:
        return self.specs.get(trial.trial_id) or model_spec(
            self.reg, trial.model_id, trial.compile_params, trial.fit_params, self.job.train,
            list(self.job.custom_sources),
        ).config()  # fmt: skip

    def _said(self, decision: Any) -> str:
        if isinstance(decision, j.Park):
            return f"parked at rung {decision.rung} ({self._loss_text(decision.loss)})"
        if isinstance(decision, j.Finish):
            return f"finished ({self._loss_text(decision.loss)})"
        if isinstance(decision, j.Fail):
            return f"failed: {decision.reason.splitlines()[0][:160]}"
        return type(decision).__name__.lower()

    def _loss_text(self, loss: float | None) -> str:
        return f"{self.loss_part}_loss={loss:.4g}" if loss is not None else "no loss"

    def _best_line(self) -> str:
        ranked = [
            (len(self.search.levels) - t.rung, rank_key(t.losses.get(t.rung)), t.trial_id)
            for t in self.search.trials.values()
            if t.rung >= 0 and t.losses.get(t.rung) is not None
        ]
        if not ranked:
            return "no best yet"
        t = self.search.trials[min(ranked)[2]]
        return (
            f"best so far: trial {t.trial_id} at rung {t.rung} "
            f"({self._loss_text(t.losses[t.rung])}) {t.compile_params} {t.fit_params}"
        )

    def _line(self, text: str) -> None:
        if self.progress:
            line = f"[dvml.automl asha {self.model_output}] {self.now():.1f}s {text}"
            logger.info(line)
            print(line, flush=True)
