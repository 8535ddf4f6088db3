"""An elastic fit's row map, changed at an iteration boundary: for a worker that joined, or
a trainer that holds the others back.

:func:`dvml.train.elastic.run_elastic` asks a :class:`Boundary` after every iteration all its
trainers reported (and so checkpointed) whether the row map should change:

- a worker **joined** the cluster since the fit started, and the training set's distribution
  rules take it (``all_workers``, ``gpu_workers`` onto GPU workers only; explicit workers,
  hosts and tables never grow): whole buffers move onto it, no more than its share
  (:func:`dvml.placement.row_map.plan_join`, the rule of ``dvml.datasets.rebalance``), the
  validation set's too;
- a trainer is named a **straggler** (:mod:`dvml.train.stragglers`; with ``sync="step"`` from
  the trainers' wait in the all-reduce: :mod:`dvml.train.runtime.collective_wait`): whole
  buffers of the training set move off it so that each trainer's rows follow its measured
  speed, when that pays (:func:`dvml.placement.row_map.plan_speed`:
  at least 10 % shorter iterations, more seconds saved than the restart costs, hysteresis).

When it should, the lock-step run is stopped
(:class:`~dvml.train.runtime.lockstep.BoundaryReached`); :func:`apply` copies the buffers
worker to worker (the rebalance copy: never a re-read of the source) and publishes the
datasets' next versions, and the trainers restart from the boundary's checkpoint on the new
row map, the same global batch split over them by their rows
(:func:`dvml.resolve.batches.batch_sizes_by_rows`; ``sync="iteration"`` keeps an even batch and
runs each trainer's own steps, :func:`dvml.train.elastic._split`). With ``sync="step"`` the
slow trainer then runs smaller steps over its fewer rows, each row weighted so that a step's
gradient stays the mean over the global batch (:func:`dvml.resolve.batches.row_weights`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import WorkerInfo, discover_workers
from dvml.placement.move_plan import GROWABLE_KINDS, Move
from dvml.placement.row_map import plan_join, plan_speed
from dvml.placement.rules import resolve_rules
from dvml.preprocess.rebalance import copy_and_publish, move_record
from dvml.store.datasets import describe
from dvml.train.stragglers import cumulative, stragglers

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["Boundary", "Change", "RowMapState", "apply", "buffers_of", "seconds_per_row"]

logger = logging.getLogger("dvml.train")

COPY_SECONDS = 2.0
"""What a change's copy is taken to cost before one was measured (digits-sized buffers)."""


@dataclasses.dataclass
class RowMapState:
    """What an elastic job remembers across its row-map changes (hysteresis, joins seen)."""

    known: set[str]  # worker addresses present when the fit started or already taken in
    left: set[str] = dataclasses.field(default_factory=set)  # names of workers that left
    gave: set[str] = dataclasses.field(default_factory=set)  # gave rows away for speed
    took: set[str] = dataclasses.field(default_factory=set)  # received rows for speed
    copy_seconds: float = COPY_SECONDS
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Change:
    """A decided change: ``kind`` (``"join"`` or ``"speed"``), the training moves, the
    validation moves, the workers that joined and why."""

    kind: str
    after_iteration: int
    moves: tuple[Move, ...]
    validation_moves: tuple[Move, ...]
    joined: tuple[WorkerInfo, ...]
    why: str


def buffers_of(layout: dict[str, Any], workers: list[WorkerInfo]) -> list[dict[str, Any]]:
    """A dataset layout's buffers as the planners take them, keyed by the address of the
    worker whose vineyard instance holds each (a restarted worker keeps its instance)."""
    by_instance = {w.vineyard_instance_id: w.address for w in workers}
    return [{"index": b["index"], "worker": by_instance.get(b["instance_id"], b["worker"]),
             "rows": int(b["rows"]),
             "nbytes": sum(int(f["nbytes"]) for f in b["fields"].values())}
            for b in layout["buffers"]]  # fmt: skip


class Boundary:
    """Asked (in the client's thread, while a run's trainers train) whether the run should
    stop after the last iteration every trainer reported, because the row map changes.

    Only cheap questions are asked while the trainers go on into the next iteration (the
    scheduler's list of workers, the stragglers of the run so far, the speed plan over the
    layout read before the run started), so that the stop lands in that next iteration,
    not after it; what a join needs of the workers that joined is asked after the stop
    (:meth:`decide`)."""

    def __init__(
        self,
        client: Client,
        job: Any,
        workers: list[WorkerInfo],
        tally: Any,
        state: RowMapState,
    ) -> None:
        self.client, self.job, self.workers, self.tally = client, job, workers, tally
        self.state = state
        self.started = time.monotonic()
        self.checked = 0
        self.change: Change | None = None
        self.joining: set[str] = set()  # addresses the scheduler lists that the job does not
        # read before the trainers start: the layout the speed plan moves buffers of, and
        # whether the rules grow at all (explicit workers, hosts, tables never take a worker)
        train = describe(job.training, client=client)
        self.layout = train.layout
        rules = train.summary.get("distribution_rules", {})
        self.grows = str(rules.get("kind", "all_workers")) in GROWABLE_KINDS

    def due(self) -> bool:
        """Whether the run should stop now: a worker joined, or rows should move for speed."""
        done = self.tally.completed()
        if done is None or done <= self.checked or done >= self.job.last_iteration:
            return False
        self.checked = done
        try:
            self.joining = self._listed_new()
            if self.joining:
                return True
            self.change = self._speed(done)
        except Exception as exc:  # deciding must never fail the job: train on as planned
            logger.warning("dvml.fit: could not plan a row-map change after iteration %d: "
                           "%s: %s", done, type(exc).__name__, exc)  # fmt: skip
            self.change, self.joining = None, set()
        return self.change is not None

    def decide(self) -> Change | None:
        """The change, once the run stopped: the speed plan, or the join's (None when no
        worker that joined takes rows: the same row map goes on)."""
        if self.change is not None or not self.joining:
            return self.change
        return self._joined(self.checked)

    def _listed_new(self) -> set[str]:
        """Workers the scheduler lists that the job has not considered yet (one cheap call)."""
        listed = self.client.sync(self.client.scheduler.identity, n_workers=-1)  # type: ignore[union-attr]
        # A worker that left and came back under its name (its Nanny restarted it) is not
        # taken back by this job: a flapping worker would move rows to and fro.
        new = {a for a, info in listed["workers"].items()
               if str(info.get("name")) not in self.state.left}  # fmt: skip
        new -= self.state.known | {w.address for w in self.workers}
        if not self.grows:  # the dataset's rules never take a worker: no stop for it
            self.state.known |= new
            return set()
        return new

    def _joined(self, done: int) -> Change | None:
        current = discover_workers(self.client, omit_silent=True)
        fresh = [w for w in current if w.address in self.joining]
        self.state.known |= self.joining  # each worker considered once
        if not fresh:
            return None
        train = describe(self.job.training, client=self.client)
        rules = train.summary.get("distribution_rules", {})
        kind = str(rules.get("kind", "all_workers"))
        if kind not in GROWABLE_KINDS:
            return None
        eligible = {w.address for w in resolve_rules(rules.get("given", kind), current)}
        targets = [w.address for w in self.workers] + [
            w.address for w in fresh if w.address in eligible
        ]
        everyone = [*self.workers, *fresh]
        plan = plan_join(buffers_of(train.layout, everyone), targets, kind)
        if not plan.moves:
            return None
        valid: tuple[Move, ...] = ()
        if self.job.validation is not None:
            v = describe(self.job.validation, client=self.client)
            valid = plan_join(buffers_of(v.layout, everyone), targets, kind).moves
        joined = tuple(w for w in fresh if any(m.target == w.address for m in plan.moves))
        why = (f"{[w.name for w in joined]} joined: {sum(m.rows for m in plan.moves)} rows "
               f"moved onto them")  # fmt: skip
        return Change("join", done, plan.moves, valid, joined, why)

    def _speed(self, done: int) -> Change | None:
        if not self.job.balance:
            return None
        per_iteration = self.tally.timings()
        if not stragglers(cumulative(per_iteration)):
            return None
        names = {**{w.name: w.address for w in self.workers},
                 **{w.address: w.address for w in self.workers}}  # fmt: skip
        work = seconds_per_row(cumulative(per_iteration), self.tally.rows_of(), len(per_iteration))
        work = {names.get(w, w): spr for w, spr in work.items()}
        if len(work) < 2:
            return None
        plan = plan_speed(
            buffers_of(self.layout, self.workers), work,
            iterations_left=self.job.last_iteration - done,
            restart_seconds=self.restart_seconds(), gave=self.state.gave, took=self.state.took,
        )  # fmt: skip
        logger.info("dvml.fit: row map after iteration %d: %s", done, plan.reason)
        if not plan.moves:
            return None
        return Change("speed", done, plan.moves, (), (), plan.reason)

    def restart_seconds(self) -> float:
        """What a change costs: this run's start until its trainers' first step (measured),
        plus the copy (the last one measured)."""
        first = self.tally.first_done_at
        startup = 0.0
        if first is not None:
            startup = max(first - self.started - self.tally.first_work_seconds, 0.0)
        return startup + self.state.copy_seconds


def apply(
    client: Client, job: Any, change: Change, workers: list[WorkerInfo], at_iteration: int,
    state: RowMapState,
) -> list[WorkerInfo]:  # fmt: skip
    """Copy ``change``'s buffers, publish the datasets' next versions, record the change in
    ``state``; return the trainers of the next run (the present ones, then those that joined
    and received rows)."""
    started = time.monotonic()
    everyone = {w.address: w for w in (*workers, *change.joined)}
    record: dict[str, Any] = {
        "kind": change.kind,
        "at_iteration": at_iteration,
        "after_iteration": change.after_iteration,
        "why": change.why,
    }
    for what, name, moves in (("training", job.training, change.moves),
                              ("validation", job.validation, change.validation_moves)):  # fmt: skip
        if name is None or not moves:
            continue
        dataset = describe(name, client=client)
        result = {"moves": [move_record(m) for m in moves],
                  "bytes_moved": sum(m.nbytes for m in moves)}  # fmt: skip
        published, _ = copy_and_publish(
            client, dataset, moves, everyone, result, True, None, change.kind
        )
        record[what] = {**result, "version": published["version"],
                        "rows_moved": sum(m.rows for m in moves)}  # fmt: skip
    state.copy_seconds = time.monotonic() - started
    record["seconds"] = round(state.copy_seconds, 3)
    record["joined"] = [w.name for w in change.joined]
    if change.kind == "speed":
        state.gave |= {m.source for m in change.moves}
        state.took |= {m.target for m in change.moves}
    trainers = [*workers, *change.joined]
    record["trainers"] = [w.name for w in trainers]
    state.changes.append(record)
    return trainers


def seconds_per_row(timings: list[Any], rows: dict[str, int], iterations: int) -> dict[str, float]:
    """Each trainer's seconds of its own work (its timing's step time: the wait in the
    averaging or the all-reduce left out) per row it holds, per iteration: the speed plan's
    measure (:func:`dvml.placement.row_map.plan_speed`), from its ``timings`` summed over
    ``iterations`` and the ``rows`` it holds. Pure.

    Per row, so that the prediction holds for another share of rows: ``sync="iteration"`` runs
    the steps of a trainer's own rows, and ``"step"`` and ``k`` its share of the global batch
    by rows (every row once per epoch either way).
    """
    work: dict[str, float] = {}
    for t in timings:
        held = rows.get(t.worker, 0) * iterations
        if held:
            work[t.worker] = t.step_seconds * t.steps / held
    return work


def summary_fields(changes: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields an elastic fit's row-map changes add to its summary. Pure.

    ``rebalanced_at_iterations`` (the first iteration of each new row map, joins and speed),
    ``moved_rows`` and ``moved_bytes`` (training rows and bytes moved by them),
    ``joined`` (names) and ``joined_at_iterations`` (name -> its first iteration),
    ``row_map_changes`` (one record each: kind, at_iteration, why, moves, seconds).
    """
    joined: dict[str, int] = {}
    for c in changes:
        joined.update({name: int(c["at_iteration"]) for name in c.get("joined", [])})
    train = [c.get("training") or {} for c in changes]
    return {
        "rebalanced_at_iterations": [int(c["at_iteration"]) for c in changes],
        "moved_rows": sum(int(t.get("rows_moved", 0)) for t in train),
        "moved_bytes": sum(int(t.get("bytes_moved", 0)) for t in train),
        "joined": sorted(joined),
        "joined_at_iterations": joined,
        "row_map_changes": changes,
    }
