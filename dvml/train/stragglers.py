"""Which trainer of a synchronous fit holds the others back: plain figures in, names out.

The rule
--------
Each trainer reports, per iteration, the steps it trained, the seconds of its fit (reading
its input and computing, *including* the time it waited in the averaging) and the part of
them it waited in the averaging (``sync="iteration"`` or an int ``k``) or in its steps'
gradient all-reduce (``sync="step"``). A trainer's **step
time** is its own work per step::

    step_seconds = (fit_seconds - waiting_seconds) / steps

and a trainer is a **straggler** when its step time is more than ``THRESHOLD`` (1.5) times
the median step time of the OTHER trainers (with two trainers: the other one's), and its
steps took at least ``MIN_EXCESS_SECONDS`` (0.2 s) more than the others' median would have.
Both are judged on the run so far: each trainer's seconds and steps summed over the
iterations it reported (:func:`cumulative`), so a slow trainer is named after the first
iteration it trained slowly, and a trainer slow for one moment of one iteration is not.

Why this rule:

- *The waiting is left out.* Synchronous training makes every trainer as slow as the slowest:
  with ``sync="iteration"`` the fast trainers finish their local steps first and wait in the
  averaging's all-reduce until the slow one arrives, so their ``fit_seconds`` equal the slow
  one's and their waiting is the visible symptom. Measured without the wait, the slow trainer
  stands out and the waiter does not: the slow one is named, never the one that waits.
- *Per step, not per row.* Every trainer of a fit runs the same steps per iteration with the
  same per-trainer batch (dvml.train.runtime.plan), so a step is the same amount of work on
  each; a trainer's local row count only says how often its rows repeat. (An elastic fit
  whose rows follow speed keeps the per-trainer batch with ``sync="iteration"``, each trainer
  running the steps of its own rows, so a step stays the same work; with an int ``k`` it
  splits the batch by rows, and a trainer given more rows has larger steps: the row map's
  hysteresis, not this rule, keeps rows from moving back. ``sync="step"`` splits it by rows
  too, and its trainers report their batch: their steps are counted in steps of the mean
  batch, so they are compared per row, :func:`timings_of`.)
- *Against the others' median.* The median of the others is not moved by the straggler itself
  (a mean over all trainers would be) nor by a second slow trainer among many; with two
  trainers it is simply the other one.
- *1.5x, and 0.2 s.* Above the noise of trainers sharing a busy machine, below the 2x of a
  trainer at half speed. Measured on a 2-core machine shared with other work: two
  undisturbed trainers of the same fit 1.2x apart over a whole 4-iteration run and 1.46x in
  one of its iterations (1.2x, the first choice, named a trainer of an even fit). The floor in
  seconds keeps scheduling jitter of sub-second iterations out (tens of ms at a few ms/step).
- *The run so far, not the last iteration alone.* The same reason: the figures of one short
  iteration are noisy; summed over the run they converge, and a trainer slow for the whole
  job is still named after its first iteration.

The fit names stragglers after each iteration in its progress line, and in its summary
over the whole run (:func:`run_summary`). ``fit_multiple`` does the same from its hops
(:func:`hop_timings`): each worker's training seconds per step over the models it trained.

With ``sync="step"`` every step's all-reduce is inside TensorFlow's train function, so every
trainer's step lasts as long as the slowest one's and ``fit_seconds`` alone cannot tell them
apart. Each trainer times its steps' wait in that all-reduce inside the step
(:mod:`dvml.train.runtime.collective_wait`) and reports it as its ``averaging_seconds``: the
fast trainers wait there for the slow one, so the same rule names the slow one after its
first iteration. It reads the iteration's steps in lock-step only (``steady``): from the end
of the fit's first call of the train function (tracing, the collectives' set-up) to the end
of its last. Before and after them each trainer works on its own while its peer waits in
places the timer does not see.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "MIN_EXCESS_SECONDS",
    "THRESHOLD",
    "Straggler",
    "TrainerTiming",
    "by_iteration",
    "cumulative",
    "describe",
    "hop_timings",
    "run_summary",
    "stragglers",
    "timings_of",
]

THRESHOLD = 1.5
MIN_EXCESS_SECONDS = 0.2


@dataclasses.dataclass(frozen=True)
class TrainerTiming:
    """One trainer's figures for one iteration (or means over several)."""

    worker: str
    steps: int
    fit_seconds: float  # input + compute + waiting in the averaging
    waiting_seconds: float = 0.0  # the part of fit_seconds spent in the averaging

    @property
    def step_seconds(self) -> float:
        """Its own work per step (input and compute, without the waiting)."""
        return max(self.fit_seconds - self.waiting_seconds, 0.0) / max(self.steps, 1)

    @property
    def waiting_step_seconds(self) -> float:
        return self.waiting_seconds / max(self.steps, 1)


@dataclasses.dataclass(frozen=True)
class Straggler:
    """A trainer slower than the others, with the figures that name it."""

    worker: str
    step_seconds: float  # its own work per step
    others_step_seconds: float  # the median of the other trainers' step times
    ratio: float  # step_seconds / others_step_seconds
    waiting_step_seconds: float  # its own wait in the averaging, per step


def stragglers(
    timings: Sequence[TrainerTiming],
    threshold: float = THRESHOLD,
    min_excess: float = MIN_EXCESS_SECONDS,
) -> list[Straggler]:
    """The trainers whose step time is over ``threshold`` times the others' median, and whose
    steps took at least ``min_excess`` seconds more than that median would have.

    Parameters
    ----------
    timings : sequence of TrainerTiming
        One per trainer (of one iteration, or means over a run).
    threshold : float
        The ratio above which a trainer is named.
    min_excess : float
        The seconds (over its steps) by which a named trainer is at least behind.

    Returns
    -------
    list of Straggler
        Slowest first; empty with fewer than two trainers, or where the others took no time.
    """
    found = []
    for timing in timings:
        others = [t.step_seconds for t in timings if t is not timing]
        if not others:
            continue
        median = statistics.median(others)
        if median <= 0.0:
            continue
        ratio = timing.step_seconds / median
        excess = (timing.step_seconds - median) * max(timing.steps, 1)
        if ratio > threshold and excess >= min_excess:
            found.append(
                Straggler(
                    timing.worker, timing.step_seconds, median, ratio, timing.waiting_step_seconds
                )
            )
    return sorted(found, key=lambda s: -s.ratio)


def timings_of(messages: Iterable[dict[str, Any]]) -> list[TrainerTiming]:
    """The timings in trainers' ``Iteration`` messages (as dicts with their ``worker``).

    Messages of trainers older than the ``steps`` field count 1 step each, which leaves
    the comparison between them as valid (every trainer runs the same steps). Messages of one
    iteration that all carry their local ``batch`` (``sync="step"``), unequal once an elastic
    fit split the batch by rows, count their steps in steps of the mean batch
    (``steps * batch / mean``): a trainer given fewer rows for its speed runs smaller steps,
    and is compared per row, not per (smaller) step. Its seconds are unchanged. A message with
    a ``steady`` stretch (``sync="step"``) is timed over that stretch only.
    """
    messages = list(messages)
    batched = bool(messages) and all(m.get("batch") for m in messages)
    batches = [int(m["batch"]) if batched else 1 for m in messages]
    mean = sum(batches) / len(batches) if batched else 1.0
    timings = []
    for m, batch in zip(messages, batches, strict=True):
        steps = int(m.get("steps") or 1)
        fit, wait = float(m.get("fit_seconds") or 0.0), float(m.get("averaging_seconds") or 0.0)
        steady = m.get("steady")  # sync="step": the steps in lock-step only
        if steady:
            steps = int(steady["steps"])
            fit, wait = float(steady["seconds"]), float(steady["averaging_seconds"])
        if batched:
            steps = max(1, round(steps * batch / mean))
        timings.append(TrainerTiming(m["worker"], steps, fit, wait))
    return timings


def by_iteration(messages: Iterable[dict[str, Any]]) -> list[list[TrainerTiming]]:
    """Trainers' ``Iteration`` messages (any order) → their timings per iteration, in order."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for m in messages:
        grouped.setdefault(int(m["iteration"]), []).append(m)
    return [timings_of(grouped[i]) for i in sorted(grouped)]


def describe(straggler: Straggler, averaging: bool = True, step: bool = False) -> str:
    """One phrase for a progress line: who, how much slower, and the split (``averaging``:
    with its wait in the averaging; a model hopper's trainers do not average; ``step``: the
    wait is in the steps' gradient all-reduce, ``sync="step"``)."""
    where = "the all-reduce" if step else "the averaging"
    waited = (
        f"; it waited {straggler.waiting_step_seconds:.3f} s/step in {where}" if averaging else ""
    )
    return (
        f"{straggler.worker} is {straggler.ratio:.1f}x slower than the others "
        f"({straggler.step_seconds:.3f} s/step of input+compute vs "
        f"{straggler.others_step_seconds:.3f}{waited})"
    )


def hop_timings(records: Iterable[dict[str, Any]]) -> list[list[TrainerTiming]]:
    """A model hopper's hop records (``iteration``, ``worker``, ``train_s``, ``steps``) →
    each worker's timing per iteration, in order: its hops' seconds and steps summed.

    In the MOP schedule every worker trains every model once per iteration, so the sums of
    one iteration are the same work on each worker (models of different sizes included); a
    hop trainer waits in no averaging. Records without ``steps`` count one step per hop.
    """
    sums: dict[int, dict[str, list[float]]] = {}
    for r in records:
        total = sums.setdefault(int(r["iteration"]), {}).setdefault(str(r["worker"]), [0, 0.0])
        total[0] += int(r.get("steps") or 1)
        total[1] += float(r.get("train_s") or 0.0)
    return [
        [TrainerTiming(w, int(n), secs) for w, (n, secs) in sums[i].items()] for i in sorted(sums)
    ]


def cumulative(per_iteration: Sequence[Sequence[TrainerTiming]]) -> list[TrainerTiming]:
    """Each trainer's steps and seconds summed over the iterations (first-seen order)."""
    sums: dict[str, list[float]] = {}
    for timings in per_iteration:
        for t in timings:
            total = sums.setdefault(t.worker, [0, 0.0, 0.0])
            total[0] += max(t.steps, 1)
            total[1] += max(t.fit_seconds, t.waiting_seconds)
            total[2] += t.waiting_seconds
    return [TrainerTiming(w, int(n), fit, wait) for w, (n, fit, wait) in sums.items()]


def run_summary(per_iteration: Sequence[Sequence[TrainerTiming]]) -> dict[str, Any]:
    """The summary's straggler fields over a run's iterations (MADlib-style: None when none).

    ``trainer_step_seconds`` is each trainer's mean step time over the run;
    ``straggler_worker`` and ``straggler_ratio`` name the slowest trainer of the whole run by
    :func:`stragglers` (None when none); ``straggler_iterations`` counts the iterations after
    which the run so far named it, as the progress line did (None when none).
    """
    found = stragglers(cumulative(per_iteration))
    worker = found[0].worker if found else None
    named = sum(
        any(s.worker == worker for s in stragglers(cumulative(per_iteration[: i + 1])))
        for i in range(len(per_iteration))
    )
    return {
        "straggler_worker": worker,
        "straggler_ratio": round(found[0].ratio, 3) if found else None,
        "straggler_iterations": named if found else None,
        "trainer_step_seconds": {
            t.worker: round(t.step_seconds, 6) for t in cumulative(per_iteration)
        },
    }
