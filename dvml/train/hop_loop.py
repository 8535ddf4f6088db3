"""The MOP iteration loop on a :class:`~dvml.train.runtime.hopper.ModelHopper`: one copy, for
``fit_multiple`` and for the model searches that train with its schedule (Hyperband's
diagonals, hyperopt's batches).

Each iteration is :func:`~dvml.train.hop_schedule.hop_schedule`'s ``W`` rounds: in round ``r``
model ``m`` trains its ``epochs`` on worker ``(m + r) mod W``'s local rows, from its current
state (weights and optimizer variables, wherever the runtime keeps them). After the last round
of an iteration every model is evaluated when metrics are due, and checkpointed on the worker
that holds it (the runtime's store: owner-only). Every task of the range is submitted at once
(Dask runs them in dependency order), then the loop waits iteration by iteration with the
runtime's watcher.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import WorkerInfo
from dvml.train.hop_schedule import hop_schedule
from dvml.train.runtime.hopper import ModelHopper
from dvml.train.stragglers import cumulative, describe, hop_timings, stragglers

if TYPE_CHECKING:
    from distributed import Future

__all__ = ["Evaluations", "first_workers", "run_iterations"]

logger = logging.getLogger("dvml.train")

Evaluations = dict[tuple[int, int], list[dict[str, Any]]]
"""``(mst_key, iteration)`` -> that model's evaluation on every worker's rows."""


def first_workers(keys: list[int], workers: list[WorkerInfo]) -> dict[int, WorkerInfo]:
    """Where each model starts: the worker of its first hop (:meth:`ModelHopper.add` there)."""
    schedule = hop_schedule(len(keys), len(workers))
    return {k: workers[schedule[0][m][1]] for m, k in enumerate(keys)}


def run_iterations(
    hopper: ModelHopper,
    keys: list[int],
    iterations: range,
    frequency: int,
    *,
    offset: int = 0,
    label: str | None = None,
    starts: Mapping[int, int] | None = None,
) -> tuple[list[dict[str, Any]], Evaluations]:
    """Train models ``keys`` (already in ``hopper``) for ``iterations`` of the MOP schedule on
    the hopper's workers; return every hop's record and the evaluations.

    Metrics are due after iteration ``t`` when ``t % frequency == 0`` and after the last one.
    Records, evaluations and checkpoints are numbered ``offset + t`` (a search's iterations
    before this call). ``label`` prints a progress line per iteration (None: silent).
    ``starts`` maps a model to the first iteration it trains (a model resumed from its own
    checkpoint): before it, the model sits out its slots of the schedule, so every hop it
    does train is on the worker it would have had in an uninterrupted run; a model it leaves
    out starts at ``iterations[0]``. Any failure cancels every task of the job and raises
    (:meth:`~dvml.train.runtime.hopper.ModelHopper.wait`).
    """
    if not iterations:  # resumed after the last iteration
        return [], {}
    workers = list(hopper.workers)
    schedule = hop_schedule(len(keys), len(workers))
    record_futures: list[Future] = []
    eval_futures: dict[tuple[int, int], list[Future]] = {}
    checkpoints: dict[int, list[Future]] = {}
    try:
        first = {k: iterations[0] for k in keys} | dict(starts or {})
        for t in iterations:
            at = offset + t
            active = [k for k in keys if first[k] <= t]
            per_model: dict[int, list[Future]] = {k: [] for k in active}
            holder: dict[int, WorkerInfo] = {}
            for round_ in schedule:
                for m, w in round_:
                    if first[keys[m]] > t:  # resumed from a later checkpoint
                        continue
                    _, record = hopper.train(keys[m], workers[w], at)
                    per_model[keys[m]].append(record)
                    record_futures.append(record)
                    holder[keys[m]] = workers[w]
            due = t % frequency == 0 or t == iterations[-1]
            checkpoints[t] = []
            for k in active:
                evals = hopper.evaluate(k) if due else []
                if due:
                    eval_futures[(k, at)] = evals
                checkpoints[t].append(hopper.checkpoint(k, at, per_model[k], evals, holder[k]))
        progress = _Progress(hopper, label, len(keys), iterations[-1])
        for t in iterations:
            hopper.wait(checkpoints[t])
            progress.iteration_done(t, record_futures)
        # fetched under the watcher: a worker that departs now holds results Dask cannot
        # compute again
        flat = [f for futures in eval_futures.values() for f in futures]
        values, gone = hopper.fetch([*record_futures, *flat])
        if gone:
            hopper.cancel()
            raise hopper.departure_error(gone)
        records, rest = values[: len(record_futures)], values[len(record_futures) :]
        evals_out: Evaluations = {}
        for key, futures in eval_futures.items():
            evals_out[key], rest = rest[: len(futures)], rest[len(futures) :]
    except BaseException:
        # Every task of the job, not only those waited on: the hops of a model whose chain
        # did not break would go on, start trainers after the job stopped them and write
        # checkpoints that a rerun then reads.
        hopper.cancel()
        raise
    return records, evals_out


class _Progress:
    """One progress line per iteration (none without a ``label``), naming the worker whose
    hops are slower than the others' so far (:mod:`dvml.train.stragglers`)."""

    def __init__(self, hopper: ModelHopper, label: str | None, models: int, last: int) -> None:
        self.hopper, self.label, self.models, self.last = hopper, label, models, last
        self.fetched = 0
        self.records: list[dict[str, Any]] = []

    def iteration_done(self, t: int, record_futures: list[Future]) -> None:
        if self.label is None:
            return
        elapsed = time.time() - float(self.hopper.job["started_at"])
        line = f"[{self.label}] iteration {t}/{self.last}: {self.models} models ({elapsed:.1f}s)"
        # the records of the hops done by now (iteration t's checkpoints waited on them); a
        # departure leaves them out: the final fetch raises it
        done = list(itertools.takewhile(lambda f: f.done(), record_futures[self.fetched :]))
        values, gone = self.hopper.fetch(done) if done else ([], [])
        if not gone:
            self.records += values
            self.fetched += len(done)
        slow = stragglers(cumulative(hop_timings(self.records)))
        if slow:
            line += f"; straggler: {describe(slow[0], averaging=False)}"
        logger.info(line)
        print(line, flush=True)
