"""The row map at an iteration boundary: which whole buffers move, and why. Pure.

An elastic fit (``dvml.fit(..., elastic=True)``) changes which rows each trainer owns only
between two iterations (docs/concepts/cluster.md). Three things change it:

- a worker LEFT: its buffers are re-pinned onto the survivors
  (:func:`dvml.placement.repin_plan.plan_repin`);
- a worker JOINED: the dataset's distribution rules are re-applied and whole buffers move onto
  the workers that hold none, no more than their share (:func:`plan_join`, which is
  :func:`dvml.placement.move_plan.plan_rebalance`'s rule);
- a trainer is SLOW: whole buffers move off it onto faster trainers so that each trainer's
  rows follow its measured speed (:func:`plan_speed`).

The speed rule
--------------
A trainer's measured cost is its *seconds per row*: its own work (input and compute, the
averaging wait left out: :mod:`dvml.train.stragglers`) divided by the rows it trained. An
iteration lasts as long as its slowest trainer, ``max(rows[w] * seconds_per_row[w])``. The
plan moves one whole buffer at a time off the trainer that finishes last onto the trainer on
which it finishes earliest, as long as a move shortens the predicted iteration, then keeps
the moves only when they pay:

- the predicted iteration is at least ``min_gain`` (10 %) shorter: below that the moves
  chase measurement noise;
- the seconds saved over the iterations left exceed ``restart_seconds`` (the copy, the
  trainers' restart and the part of an iteration that the restart throws away);
- hysteresis: a trainer that gave rows away for speed never receives rows for speed later in
  the same job, and one that received never gives (``gave`` and ``took``), so rows never
  move back and forth when the measurements swing (a slow trainer that recovers keeps its
  smaller share: the cost is bounded by the gain that moved them).

Only whole buffers move (never a re-read of the source) and only off the trainer that holds
the others back, so the bytes moved are at most what that trainer holds beyond its share.

Plain values in, plain values out; copying the buffers and restarting the trainers is
:mod:`dvml.train.row_map_change`'s job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.placement.buffer_rows import parsed_buffers
from dvml.placement.move_plan import Move, RebalancePlan, plan_rebalance

__all__ = ["MIN_GAIN", "SpeedPlan", "plan_join", "plan_speed"]

MIN_GAIN = 0.1
"""The least relative shortening of the predicted iteration that moves rows for speed."""


@dataclasses.dataclass(frozen=True)
class SpeedPlan:
    """The moves that make each trainer's rows follow its speed, and what they promise.

    Attributes
    ----------
    moves : tuple of Move
        Whole buffers to copy, in order (none when the moves do not pay).
    rows_per_worker : dict of str to int
        Rows per trainer after the moves.
    seconds_before, seconds_after : float
        The predicted iteration (its slowest trainer's seconds) before and after the moves.
    saved_seconds : float
        ``(seconds_before - seconds_after) * iterations_left``.
    reason : str
        Why it moves, or why not (for the log and the summary).
    """

    moves: tuple[Move, ...]
    rows_per_worker: dict[str, int]
    seconds_before: float
    seconds_after: float
    saved_seconds: float
    reason: str

    @property
    def moved_rows(self) -> int:
        return sum(m.rows for m in self.moves)

    @property
    def bytes_moved(self) -> int:
        return sum(m.nbytes for m in self.moves)


def _checked_speeds(seconds_per_row: Mapping[str, float]) -> dict[str, float]:
    speeds = {}
    for worker, value in seconds_per_row.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ArgumentTypeError(
                "seconds_per_row must map each trainer to a number >= 0. Received: "
                f"{worker!r}: {value!r}."
            )
        speeds[str(worker)] = float(value)
    if len(speeds) < 2:
        raise ArgumentError(
            "Moving rows for speed needs at least two trainers. Received: "
            f"seconds_per_row={dict(seconds_per_row)!r}."
        )
    return speeds


def plan_speed(
    buffers: Sequence[Mapping[str, Any]],
    seconds_per_row: Mapping[str, float],
    *,
    iterations_left: int,
    restart_seconds: float,
    gave: Collection[str] = (),
    took: Collection[str] = (),
    min_gain: float = MIN_GAIN,
) -> SpeedPlan:
    """Plan whole-buffer moves so that each trainer's rows follow its measured speed.

    Parameters
    ----------
    buffers : sequence of mapping
        The dataset's buffers: ``index``, ``worker`` (a key of ``seconds_per_row``),
        ``rows`` and ``nbytes``. Buffers of other workers stay where they are.
    seconds_per_row : mapping of str to float
        Each trainer's measured seconds of its own work per row trained.
    iterations_left : int
        Iterations the job still runs after this boundary.
    restart_seconds : float
        What a change of the row map costs (copy, restart, work thrown away).
    gave, took : collection of str
        Trainers that gave rows away, or received rows, for speed earlier in the job
        (hysteresis: a giver never receives, a receiver never gives).
    min_gain : float
        The least relative shortening of the predicted iteration worth a move.

    Returns
    -------
    SpeedPlan
    """
    speeds = _checked_speeds(seconds_per_row)
    if isinstance(iterations_left, bool) or not isinstance(iterations_left, int):
        raise ArgumentTypeError(f"iterations_left must be an int. Received: {iterations_left!r}.")
    parsed = [b for b in parsed_buffers(buffers) if b[1] in speeds]
    load = {w: 0 for w in speeds}
    for _, worker, rows, _ in parsed:
        load[worker] += rows
    before = _makespan(load, speeds)
    moves = _greedy(parsed, dict(load), speeds, set(gave), set(took))
    after_load = dict(load)
    for m in moves:
        after_load[m.source] -= m.rows
        after_load[m.target] += m.rows
    after = _makespan(after_load, speeds)
    saved = (before - after) * max(iterations_left, 0)
    reason = _verdict(moves, before, after, saved, restart_seconds, min_gain)
    if not reason.startswith("moves"):
        return SpeedPlan((), dict(load), before, before, 0.0, reason)
    return SpeedPlan(tuple(moves), after_load, before, after, saved, reason)


def _makespan(load: Mapping[str, int], speeds: Mapping[str, float]) -> float:
    return max(load[w] * speeds[w] for w in load)


def _greedy(
    parsed: list[tuple[int, str, int, int]],
    load: dict[str, int],
    speeds: Mapping[str, float],
    gave: set[str],
    took: set[str],
) -> list[Move]:
    """One buffer at a time off the trainer that finishes last, while that shortens the
    iteration; the best move wins (ties: fewer rows, then the lower buffer index). A trainer
    keeps its last buffer: the job's trainers stay the same at a speed move, and one that
    holds no row cannot train (a host throttled to a fifteenth of the others' speed gave
    every buffer away and the next run refused its empty share)."""
    held = {w: [b for b in parsed if b[1] == w] for w in load}
    order = {w: i for i, w in enumerate(load)}
    moves: list[Move] = []
    while True:
        current = _makespan(load, speeds)
        source = max(load, key=lambda w: (load[w] * speeds[w], -order[w]))
        if source in took:
            return moves
        best: tuple[float, int, int, str] | None = None
        chosen = None
        for b in held[source]:
            for target in load:
                if target == source or target in gave or b[2] == 0 or len(held[source]) < 2:
                    continue
                load[source] -= b[2]
                load[target] += b[2]
                span = _makespan(load, speeds)
                load[source] += b[2]
                load[target] -= b[2]
                key = (span, b[2], b[0], target)
                if span < current - 1e-12 and (best is None or key < best):
                    best, chosen = key, (b, target)
        if chosen is None:
            return moves
        b, target = chosen
        held[source].remove(b)
        held[target].append((b[0], target, b[2], b[3]))
        load[source] -= b[2]
        load[target] += b[2]
        moves.append(Move(b[0], source, target, b[2], b[3]))


def _verdict(
    moves: list[Move],
    before: float,
    after: float,
    saved: float,
    restart_seconds: float,
    min_gain: float,
) -> str:
    if not moves:
        return "no whole buffer moved off the slowest trainer shortens the iteration"
    if before <= 0 or (before - after) / before < min_gain:
        return (
            f"the iteration would shorten by {before - after:.2f}s of {before:.2f}s, under "
            f"{min_gain:.0%}"
        )
    if saved <= restart_seconds:
        return (
            f"the {saved:.1f}s saved over the iterations left do not pay the restart "
            f"({restart_seconds:.1f}s)"
        )
    return (
        f"moves {sum(m.rows for m in moves)} rows: the iteration's work goes from {before:.2f}s "
        f"to {after:.2f}s ({saved:.1f}s saved over the iterations left, restart "
        f"{restart_seconds:.1f}s)"
    )


def plan_join(
    buffers: Sequence[Mapping[str, Any]], targets: Sequence[str], rules_kind: str
) -> RebalancePlan:
    """The moves onto workers that joined a running job: the dataset's distribution rules
    re-applied (``targets``: what they resolve to now, e.g. only GPU workers for
    ``"gpu_workers"``), whole buffers onto the workers that hold none, no more than their
    share. Exactly :func:`dvml.placement.move_plan.plan_rebalance`'s rule, so that a join
    during a fit and a ``dvml.datasets.rebalance`` between fits place the same way."""
    return plan_rebalance(buffers, targets, rules_kind)
