"""Elastic fits: a lock-step job whose row map changes at iteration boundaries.

Three things change which rows each trainer owns, always between two iterations and in this
one loop (:func:`run_elastic`): a worker that leaves (below), a worker that joins and a
trainer that holds the others back (:mod:`dvml.train.row_map_change`: whole buffers move onto
the new worker, or off the straggler so that rows follow speed, and the trainers restart from
the boundary's checkpoint on the new row map with the same global batch).

``dvml.fit(..., elastic=True)`` runs its trainers through :func:`run_elastic` instead of one
:func:`~dvml.train.runtime.lockstep.run_lockstep`. When a worker leaves during iteration *i*
(the runtime's watcher names it: :class:`~dvml.exceptions.WorkerDepartedError`), the job is
not failed:

1. the rows it held are re-pinned (:func:`dvml.preprocess.repin.repin`): its whole buffers are
   copied from its vineyardd, which still runs when only the worker process died, onto the
   survivors, and the datasets' next versions are published; when its vineyardd is gone too,
   its rows are left out and the summary says how many, from which iteration;
2. the survivors go on from the last iteration every one of them checkpointed (their weights
   are identical after the averaging, so any of those checkpoints is the job's state), with
   the same global batch split over them, their checkpoints under the same job key, until
   ``num_iterations``.

The job key rule (:func:`elastic_key`): an elastic fit's key names its data by content (the
dataset's id and the digest of its buffers, which a re-pin or a rebalance keeps) rather than
by version, and leaves the worker set out, so the checkpoint directory is the job's whatever
workers it runs on: the job itself goes on under it, and a rerun of the same call on other
workers resumes from the last iteration every trainer that holds a checkpoint of it completed
(:func:`elastic_resume_from`; a worker that joined since has none and is not waited for).

Every sync mode goes on this way: ``"iteration"`` and ``k`` average the survivors' weights by
their rows, and ``"step"`` starts a new MultiWorkerMirroredStrategy on the survivors from the
checkpoint; what the schedule promises holds (every row once per epoch, the same global batch,
the same averaging rule).

A trainer that fails while every worker stays (killed by a signal, a collective broken under
it) is gone on from too, from the last checkpoint with the same workers and row map, up to
``dvml.train.elastic-max-failures`` times (``trainer_failures`` in the summary); an error the
trainer's own program raised fails the job at once, as it would come again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import TrainerFailedError, WorkerDepartedError
from dvml.preprocess.repin import repin
from dvml.resolve.batches import (
    batch_sizes_by_rows,
    per_worker_batch_sizes,
    steps_covering,
    steps_per_epoch,
)
from dvml.store.datasets import describe
from dvml.store.versions import buffer_digest, version_digest
from dvml.train.departures import departure_fields, describe_repin
from dvml.train.row_map_change import Boundary, RowMapState, apply, summary_fields
from dvml.train.runtime import launch
from dvml.train.runtime.exits import KILLED_BY
from dvml.train.runtime.lockstep import BoundaryReached, resume_from, run_lockstep
from dvml.train.runtime.plan import Job, dataset_key, job_key
from dvml.train.runtime.watcher import departed_workers, describe_departure, looks_like_peer_failure
from dvml.train.stand_ins import stand_ins
from dvml.train.stragglers import timings_of

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "ElasticJob",
    "ElasticRun",
    "elastic_key",
    "elastic_resume_from",
    "elastic_summary",
    "find_elastic_checkpoint",
    "fit_key",
    "rows_key",
    "run_elastic",
]

logger = logging.getLogger("dvml.train")


def rows_key(dataset: Any) -> list[Any] | None:
    """What an elastic job's key holds of a dataset: its ``dataset_id`` and the digest of its
    buffers' contents (:func:`dvml.store.versions.version_digest`), which a re-pin or a
    rebalance (same buffers, new placement) keeps and an append changes; its version when a
    buffer has no digest (:func:`dvml.train.runtime.plan.dataset_key`). None for no dataset."""
    if dataset is None:
        return None
    digest = version_digest({str(b["index"]): buffer_digest(b) for b in dataset.layout["buffers"]})
    if digest is None:
        return dataset_key(dataset)
    return [dataset.summary["dataset_id"], digest]


def elastic_key(parts: list[Any]) -> list[Any]:
    """The parts of an elastic job's key: ``parts`` (the job's own, worker count left out)
    marked elastic, so it never shares checkpoints with a fixed job."""
    return ["elastic", *parts]


def fit_key(job: Job, spec: Any, sync_mode: str | int, elastic: bool) -> str:
    """A fit's key: what a rerun resumes by. A fixed fit's key names its data by version and
    its number of trainers; an elastic fit's names its data by content (:func:`rows_key`) and
    leaves the workers out, so it keeps its key and its checkpoints when workers leave."""
    data = rows_key if elastic else dataset_key
    parts = [data(job.train), data(job.valid), spec.arch_id, spec.compile_params,
             spec.fit_params, job.args.num_iterations, job.frequency, job.seed,
             job.args.warm_start]  # fmt: skip
    if elastic:
        return job_key(*elastic_key([*parts, sync_mode, *job.augment_key]))
    return job_key(*parts, len(job.workers), sync_mode, *job.augment_key)


def elastic_resume_from(
    states: list[dict[str, Any] | None], key: str
) -> tuple[int, bytes, list[dict[str, Any]]] | None:
    """Where an elastic job ``key`` resumes: the last iteration every trainer that holds a
    checkpoint of it completed (:func:`~dvml.train.runtime.lockstep.resume_from` over those
    trainers only: one that joined since has none). Pure."""
    return resume_from([s for s in states if s is not None and s.get("job_key") == key], key)


def find_elastic_checkpoint(
    client: Client, workers: list[WorkerInfo], directory: str, key: str
) -> tuple[int, bytes, list[dict[str, Any]]] | None:
    """:func:`elastic_resume_from` over ``workers``' checkpoints of job ``key``."""
    return elastic_resume_from(_checkpoint_states(client, workers, directory), key)


def _checkpoint_states(
    client: Client, workers: list[WorkerInfo], directory: str
) -> list[dict[str, Any] | None]:
    """Each of ``workers``' last checkpoint (:func:`launch.checkpoint_state`), in order."""
    return client.gather([
        client.submit(launch.checkpoint_state, directory, w.name, workers=[w.address],
                      allow_other_workers=False, pure=False)
        for w in workers
    ])  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ElasticJob:
    """What :func:`run_elastic` needs of a planned fit."""

    workers: list[WorkerInfo]
    job: Callable[[int, list[dict[str, Any]]], dict[str, Any]]  # (start, history) -> base job
    per_worker_batch: list[int]
    steps_per_epoch: int
    trainer_steps: list[int] | None  # each trainer's own steps (sync="iteration"), else None
    global_batch: int
    timeout: float
    training: str
    validation: str | None
    checkpoint_dir: str
    key: str
    sync: str | int = "step"  # the fit's sync mode
    last_iteration: int = 0  # num_iterations: no row map changes after it
    balance: bool = True  # move rows off stragglers (dvml.train.elastic-balance)
    max_failures: int = 2  # trainer failures gone on from (dvml.train.elastic-max-failures)


@dataclasses.dataclass
class ElasticRun:
    """How an elastic job ran.

    Attributes
    ----------
    results : list of dict
        The last run's trainer results (:func:`run_lockstep`'s).
    history : list of dict
        The records of the iterations before the last run (what it resumed with).
    workers : list of WorkerInfo
        The last run's trainers.
    departures : list of dict
        One per departure: ``workers``, ``at_iteration`` (the first iteration run without
        them), ``training`` and ``validation`` (the re-pin of each dataset,
        :func:`dvml.preprocess.repin.repin`).
    rows_per_epoch : dict of int to int
        Iteration -> the rows its trainers trained on once per epoch, as they reported them
        (:class:`_Tally`), for every iteration this call trained.
    changes : list of dict
        One per row-map change for a worker that joined or a straggler
        (:func:`dvml.train.row_map_change.apply`'s records).
    failures : list of dict
        One per trainer failure the job went on from with the same workers (no worker
        left): ``at_iteration`` (where it went on from) and ``error``.
    """

    results: list[dict[str, Any]]
    history: list[dict[str, Any]]
    workers: list[WorkerInfo]
    departures: list[dict[str, Any]]
    rows_per_epoch: dict[int, int]
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class _Tally:
    """Forwards the trainers' events and counts the rows each iteration trained on.

    An iteration's rows are the sum of the rows its trainers report in their iteration
    records (:class:`~dvml.train.runtime.protocol.Iteration` ``rows``). A trainer killed just
    after an iteration it trained may never report it: the iterations every survivor
    checkpointed were trained by every trainer of that run (their averaging, or every step's
    all-reduce, needs all of them), so :meth:`settle` counts them with the rows each trainer
    reported for another iteration of the run, or else the rows it reported it resolved
    (:class:`~dvml.train.runtime.protocol.Resolved`), which a trainer whose steps cover its
    rows (``sync="iteration"``) trains."""

    def __init__(self, forward: Callable[[Any], None]) -> None:
        self.forward, self.lock = forward, threading.Lock()
        self.reported: dict[int, dict[str, int]] = {}
        self.messages: dict[int, list[dict[str, Any]]] = {}
        self.resolved: dict[str, int] = {}
        self.n = 0
        self.trained: dict[int, int] = {}
        self.first_done_at: float | None = None  # when this run's first iteration completed
        self.first_work_seconds = 0.0  # and how long its trainers trained and measured in it

    def begin(self, n: int) -> None:
        with self.lock:
            self.reported, self.resolved, self.n, self.messages = {}, {}, n, {}
            self.first_done_at, self.first_work_seconds = None, 0.0

    def completed(self) -> int | None:
        """This run's last iteration every trainer reported (and so checkpointed)."""
        with self.lock:
            done = [i for i, m in self.messages.items() if len(m) == self.n]
        return max(done) if done else None

    def timings(self) -> list[list[Any]]:
        """This run's completed iterations' trainer timings, in order (dvml.train.stragglers)."""
        with self.lock:
            done = sorted(i for i, m in self.messages.items() if len(m) == self.n)
            return [timings_of(self.messages[i]) for i in done]

    def rows_of(self) -> dict[str, int]:
        """The rows each trainer of this run holds, by the worker key its messages carry."""
        with self.lock:
            return {str(m["worker"]): int(m.get("rows") or 0)
                    for ms in self.messages.values() for m in ms}  # fmt: skip

    def replay(self, worker: str, history: list[dict[str, Any]], first: int, last: int) -> None:
        """Give the records of iterations ``first`` to ``last`` in ``worker``'s checkpointed
        ``history`` whose report did not come, as their events (:meth:`__call__`)."""
        for record in history:  # a report that came already is dropped by __call__
            if first <= int(record.get("iteration") or 0) <= last:
                self((time.time(), {**record, "kind": "iteration", "worker": worker}))

    def settle(self, first: int, last: int) -> None:
        """Iterations ``first`` to ``last`` of this run were trained by all its trainers."""
        with self.lock:
            # each trainer trains the same rows every iteration of a run: the rows it reported
            # for another one, else all it holds (a trainer whose steps cover its rows)
            per_trainer = {w: r for rows in self.reported.values() for w, r in rows.items()}
            for i in range(first, last + 1):
                if i not in self.trained and len(self.resolved) == self.n:
                    self.trained[i] = sum(per_trainer.get(w, r) for w, r in self.resolved.items())

    def __call__(self, event: Any) -> None:
        _, message = event
        kind, worker = message.get("kind"), str(message.get("worker"))
        with self.lock:
            if kind == "resolved":
                self.resolved[worker] = int(message["rows"])
            elif kind == "iteration" and message.get("rows") is not None:
                iteration = int(message["iteration"])
                rows = self.reported.setdefault(iteration, {})
                if worker in rows:  # came twice: read back from its checkpoint, then late
                    return
                rows[worker] = int(message["rows"])
                self.messages.setdefault(iteration, []).append(message)
                if len(rows) == self.n:
                    self.trained[iteration] = sum(rows.values())
                    if self.first_done_at is None:
                        self.first_done_at = time.monotonic()
                        self.first_work_seconds = max(
                            float(m.get("fit_seconds") or 0) + float(m.get("metrics_seconds") or 0)
                            for m in self.messages[iteration]
                        )
        self.forward(event)


def run_elastic(
    client: Client,
    job: ElasticJob,
    start_iteration: int,
    weights_blob: bytes | None,
    history: list[dict[str, Any]],
    on_event: Callable[[Any], None],
    regroup: Callable[[list[WorkerInfo], str], None],
) -> ElasticRun:
    """Run ``job``'s trainers to its last iteration, changing the row map at iteration
    boundaries: going on without workers that leave, taking in workers that join and moving
    rows off a straggler (:mod:`dvml.train.row_map_change`).

    ``regroup`` is told the trainers of each new run and why (the progress collector's).
    Raises what :func:`run_lockstep` raises, except a departure that leaves a worker to go
    on with, and up to ``job.max_failures`` trainer failures in which no worker left and the
    trainer was killed or a collective broke (gone on from with the same workers).
    """
    workers, batch, steps = list(job.workers), list(job.per_worker_batch), job.steps_per_epoch
    own_steps = job.trainer_steps  # each trainer's own steps (sync="iteration")
    initial = (start_iteration, weights_blob, list(history))
    start, blob, hist = initial
    tally = _Tally(on_event)
    departures: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []  # trainer failures gone on from (no worker left)
    state = RowMapState(known=_present(client, workers))
    while True:
        tally.begin(len(workers))
        base = {**job.job(start, hist), "steps_per_epoch": steps}
        boundary = Boundary(client, job, workers, tally, state)
        began = start
        try:
            results = _lockstep(client, workers, base, batch, blob, tally, job, boundary.due,
                                own_steps)  # fmt: skip
        except WorkerDepartedError as exc:
            workers = _go_on_without(client, job, exc, workers, state, departures)
            start, blob, hist = _resumed(client, job, workers, tally, began, initial)
            departures[-1]["at_iteration"] = start
            line = (f"{exc.args[0].split('. ')[0]}; going on with {[w.name for w in workers]}"
                    f" from iteration {start}: {describe_repin(departures[-1])}")  # fmt: skip
        except TrainerFailedError as exc:
            # no worker left: a trainer was killed or a collective broke (Ray Train's
            # max_failures); an error of the trainer's own (the model's) would come again
            if len(failures) >= job.max_failures or not _transient(exc):
                raise
            start, blob, hist = _resumed(client, job, workers, tally, began, initial)
            failures.append({"at_iteration": start, "error": str(exc)[:500]})
            line = (f"a trainer failed ({str(exc)[:200]}); going on with the same workers from "
                    f"iteration {start} (failure {len(failures)}, at most {job.max_failures}: "
                    "dvml.train.elastic-max-failures)")  # fmt: skip
        except BoundaryReached:
            start, blob, hist = _resumed(client, job, workers, tally, began, initial)
            change = boundary.decide()
            if change is not None:
                workers = apply(client, job, change, workers, start, state)
            why = change.why if change else "no worker that joined takes rows of the dataset"
            line = (f"row map changed after iteration {boundary.checked}: {why}; going on "
                    f"with {[w.name for w in workers]} from iteration {start}")  # fmt: skip
        else:
            trained = dict(tally.trained)
            for i, rows in _rows_of(results).items():
                trained[i] = rows
            return ElasticRun(results, hist, workers, departures, trained, state.changes,
                              failures)  # fmt: skip
        batch, steps, own_steps = _split(client, job, workers)
        logger.warning(line)
        regroup(workers, line)


def _lockstep(
    client: Client,
    workers: list[WorkerInfo],
    base: dict[str, Any],
    batch: list[int],
    blob: bytes | None,
    tally: _Tally,
    job: ElasticJob,
    until: Callable[[], bool],
    own_steps: list[int] | None,
) -> list[dict[str, Any]]:
    """One :func:`run_lockstep` run, whose trainer failure is a departure when a worker is
    gone by the time it is raised (a trainer's error can come before the scheduler drops
    the worker): going on with the same workers would wait on the departed one."""
    try:
        return run_lockstep(client, workers, base, batch, blob, tally, job.timeout,
                            until=until, per_worker_steps=own_steps)  # fmt: skip
    except WorkerDepartedError:
        raise
    except TrainerFailedError as exc:
        gone = departed_workers(client, workers, wait=0.0)
        if gone:
            raise WorkerDepartedError(f"{describe_departure(gone)}. {exc}", gone) from exc
        raise


def _transient(exc: TrainerFailedError) -> bool:
    """Whether a trainer failure may not come again: the trainer was killed by a signal, or
    a collective broke under it (not an error its own program raised)."""
    text = f"{type(exc).__name__}: {exc}"
    return KILLED_BY in text or looks_like_peer_failure(text)


def _go_on_without(
    client: Client,
    job: ElasticJob,
    exc: WorkerDepartedError,
    workers: list[WorkerInfo],
    state: RowMapState,
    departures: list[dict[str, Any]],
) -> list[WorkerInfo]:
    """Workers left: the survivors (a live worker of a departed trainer's vineyardd stands in
    for it and trains its rows in place), after the others' rows were re-pinned onto them
    (appended to ``departures``); re-raises ``exc`` when no one is left to go on with."""
    gone_at = {w.address for w in exc.workers}
    gone = [w for w in workers if w.address in gone_at]
    taken = stand_ins(client, gone, workers, state.left) if gone else {}
    survivors = [taken.get(w.address, w) for w in workers
                 if w.address not in gone_at or w.address in taken]  # fmt: skip
    if not gone or not survivors:
        raise exc
    departure = _repin(client, job, [w for w in gone if w.address not in taken], survivors)
    departure["workers"] = [w.name for w in gone]
    departure["stand_ins"] = {w.name: taken[w.address].name for w in gone
                              if w.address in taken}  # fmt: skip
    state.left |= {w.name for w in gone}
    departures.append(departure)
    return survivors


def _present(client: Client, workers: list[WorkerInfo]) -> set[str]:
    """The addresses of the workers present when the job starts (those that join later are
    the ones a boundary takes in): the scheduler's list, one cheap call."""
    present = {w.address for w in workers}
    try:
        identity = client.sync(client.scheduler.identity, n_workers=-1)  # type: ignore[union-attr]
        present |= set(identity["workers"])
    except Exception:  # the scheduler did not answer: the job's own are known
        pass
    return present


def _resumed(
    client: Client,
    job: ElasticJob,
    workers: list[WorkerInfo],
    tally: _Tally,
    began: int,
    initial: tuple[int, bytes | None, list[dict[str, Any]]],
) -> tuple[int, bytes | None, list[dict[str, Any]]]:
    """Where the next run starts: the last iteration every one of ``workers`` checkpointed
    (the iterations before it counted by ``tally``), else where this call began.

    The trainers of a stopped run can finish iterations whose reports never reach the client
    (their launcher stopped reading, or the topic was left first): those reports are read
    back from the trainers' checkpoints and given to ``tally`` as they would have come, so
    that the progress lines and ``on_iteration`` see every iteration trained.
    """
    states = _checkpoint_states(client, workers, job.checkpoint_dir)
    resumed = elastic_resume_from(states, job.key)
    start, blob, hist = resumed if resumed is not None else initial
    for w, state in zip(workers, states, strict=True):
        if state is not None and state.get("job_key") == job.key:
            tally.replay(w.address, state.get("history") or [], began, start - 1)
    tally.settle(began, start - 1)
    return start, blob, hist


def _repin(
    client: Client, job: ElasticJob, gone: list[WorkerInfo], survivors: list[WorkerInfo]
) -> dict[str, Any]:
    """Copy the departed workers' rows of the training and validation sets onto survivors."""
    departure: dict[str, Any] = {"workers": [w.name for w in gone]}
    for what, name in (("training", job.training), ("validation", job.validation)):
        if name is None:
            departure[what] = None
            continue
        try:
            departure[what] = repin(client, name, gone, survivors)
        except Exception as exc:  # the copy failed: fail the job saying so, not train on less
            raise TrainerFailedError(
                f"Workers {[w.name for w in gone]} left the elastic job and copying their rows "
                f"of {name!r} onto {[w.name for w in survivors]} failed: {type(exc).__name__}: "
                f"{exc}. Run the same call again: it resumes from the last iteration the "
                "trainers checkpointed."
            ) from exc
    return departure


def _split(
    client: Client, job: ElasticJob, workers: list[WorkerInfo]
) -> tuple[list[int], int, list[int] | None]:
    """The same global batch split over ``workers``, the steps per epoch and, where trainers
    run their own number of steps, each one's (rows on no trainer are not counted).

    ``sync="iteration"``: the batch split evenly (each trainer's local SGD keeps its batch)
    and each trainer runs the steps that cover its own rows (the last batch short), so a
    trainer given more rows for its speed runs more steps and one given fewer runs fewer
    (their weights are averaged by rows once per iteration, MADlib's rule). An int ``k``
    averages every k steps and ``"step"`` all-reduces every step, which need the same steps
    everywhere: the batch is split by rows (:func:`batch_sizes_by_rows`), so a trainer that
    gave rows away for its speed runs smaller steps (the rows past each trainer's last full
    batch wait for a later epoch); ``"step"``'s trainers weigh their rows so that a step's
    gradient stays the mean over the global batch (:func:`dvml.resolve.batches.row_weights`,
    applied by the lock-step launch).
    """
    layout = describe(job.training, client=client).layout
    rows = {w.vineyard_instance_id: 0 for w in workers}
    for b in layout["buffers"]:
        if b["instance_id"] in rows:
            rows[b["instance_id"]] += int(b["rows"])
    held = [rows[w.vineyard_instance_id] for w in workers]
    split = per_worker_batch_sizes if job.sync == "iteration" else batch_sizes_by_rows
    per_worker = split(job.global_batch, held)
    steps = steps_per_epoch(held, per_worker)
    if job.sync != "iteration":
        return per_worker, steps, None
    return per_worker, steps, [steps_covering(r, b) for r, b in zip(held, per_worker, strict=True)]


def _rows_of(results: list[dict[str, Any]]) -> dict[int, int]:
    """Iteration -> the rows its trainers reported they trained on (each once per epoch)."""
    rows: dict[int, int] = {}
    for r in results:
        for record in r["iterations"]:
            if record.get("rows") is not None:
                i = int(record["iteration"])
                rows[i] = rows.get(i, 0) + int(record["rows"])
    return rows


def elastic_summary(run: ElasticRun) -> dict[str, Any]:
    """The fields an elastic fit adds to its summary. Pure.

    ``trainers`` (the last run's: after departures and joins), ``departed`` (names),
    ``departed_at_iterations`` (name -> the first iteration run
    without it), ``repinned_rows`` and ``repin_seconds`` (the training set's rows copied onto
    the survivors, and the seconds the copies of both datasets and their publication took),
    ``rows_left_out`` (training rows that could not be copied) and
    ``rows_left_out_from_iteration`` (None when none), ``rows_per_epoch`` ([iteration, rows]:
    the rows the iteration's trainers held, each trained once per epoch), ``departures``
    (:attr:`ElasticRun.departures`), and the row-map changes for joins and stragglers
    (:func:`dvml.train.row_map_change.summary_fields`: ``rebalanced_at_iterations``,
    ``moved_rows``, ``moved_bytes``, ``joined``, ``joined_at_iterations``,
    ``row_map_changes``), and ``trainer_failures`` (:attr:`ElasticRun.failures`).
    """
    return {
        "elastic": True,
        "trainers": [w.name for w in run.workers],  # the last run's, joins and departures in
        **departure_fields(run.departures),
        "rows_per_epoch": [[i, run.rows_per_epoch[i]] for i in sorted(run.rows_per_epoch)],
        **summary_fields(run.changes),
        "trainer_failures": run.failures,
    }
