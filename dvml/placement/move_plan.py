"""The move plan of a rebalance: which whole buffers go to the workers that joined.

When workers join a cluster, a dataset packed before holds no rows on them and the next job
cannot use them. A rebalance re-applies the dataset's distribution rules to the current
workers and moves *whole* buffers (never re-reading the source, never splitting a buffer)
from the most-loaded workers to the new ones, until rows per worker are as equal as buffers
allow. Only the workers that hold none of the dataset receive buffers: the bytes moved are
then at most the new workers' share of the dataset (what they would hold after a fresh pack),
and the old workers' buffers that stay are not touched.

Which rules may grow: ``"all_workers"`` and ``"gpu_workers"`` (the caller resolves them against
the current workers, so a ``gpu_workers`` dataset sees only GPU workers as targets); explicit
workers, hosts or a table name their workers once and for all, so their datasets do not move.

Plain values in, plain values out (:func:`plan_rebalance`); copying the bytes and publishing
the new version is :func:`dvml.preprocess.rebalance.rebalance`'s job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentTypeError
from dvml.placement.buffer_rows import parsed_buffers

__all__ = ["GROWABLE_KINDS", "Move", "RebalancePlan", "plan_rebalance"]

GROWABLE_KINDS = ("all_workers", "gpu_workers")
"""Distribution rule kinds whose datasets grow onto workers that join."""


@dataclasses.dataclass(frozen=True)
class Move:
    """One buffer to copy from ``source`` to ``target`` (worker keys as the caller gave them)."""

    buffer: int
    source: str
    target: str
    rows: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class RebalancePlan:
    """The moves of a rebalance and what they lead to.

    Attributes
    ----------
    moves : tuple of Move
        In the order to run them (each new worker filled in turn).
    rows_per_worker : dict of str to int
        Rows per worker after the moves, every target included (0 for one that got nothing).
    new_workers : tuple of str
        The targets that held none of the dataset before.
    bytes_moved : int
        Sum of the moved buffers' bytes.
    share_bytes : int
        The new workers' share of the dataset's bytes (their fraction of the targets times the
        dataset's bytes, rounded up). When buffers hold equal bytes per row, ``bytes_moved``
        never exceeds it: a new worker never receives more rows than its share.
    """

    moves: tuple[Move, ...]
    rows_per_worker: dict[str, int]
    new_workers: tuple[str, ...]
    bytes_moved: int
    share_bytes: int


def plan_rebalance(
    buffers: Sequence[Mapping[str, Any]], targets: Sequence[str], rules_kind: str
) -> RebalancePlan:
    """Plan the buffer moves that spread a dataset over the workers that joined.

    Parameters
    ----------
    buffers : sequence of mapping
        The dataset's buffers: ``index``, ``worker`` (the key of the worker holding it),
        ``rows`` and ``nbytes``.
    targets : sequence of str
        The workers the dataset's rules resolve to on the current cluster (same keys). Workers
        among them that hold no buffer are the new ones; holders missing from it keep their
        buffers (a rebalance never takes rows away from a worker that is not moving them to a
        new one).
    rules_kind : str
        The kind of the dataset's distribution rules
        (:class:`dvml.placement.DistributionRules`); only :data:`GROWABLE_KINDS` move.

    Returns
    -------
    RebalancePlan
        No moves when the rules do not grow, no target is new or no buffer fits.
    """
    if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
        raise ArgumentTypeError(
            f"targets must be a sequence of worker keys (str). Received: targets={targets!r}."
        )
    parsed = parsed_buffers(buffers)
    load: dict[str, int] = {}
    for _, worker, rows, _ in parsed:
        load[worker] = load.get(worker, 0) + rows
    new = tuple(t for t in dict.fromkeys(targets) if t not in load)
    if rules_kind not in GROWABLE_KINDS:
        new = ()  # rules that name their workers keep them: nothing joins such a dataset
    for t in new:
        load[t] = 0
    total_bytes = sum(b[3] for b in parsed)
    n_targets = len(set(targets) | {w for _, w, _, _ in parsed})
    share_bytes = -(-total_bytes * len(new) // n_targets) if n_targets else 0
    if rules_kind not in GROWABLE_KINDS or not new or not parsed:
        return RebalancePlan((), dict(load), new, 0, int(share_bytes))
    # Each worker's fair share of rows: the new ones are filled up to it, never past it, so
    # the bytes moved stay within the new workers' share (what a fresh pack would give them).
    share = sum(load.values()) / n_targets
    held: dict[str, list[tuple[int, str, int, int]]] = {}
    for b in parsed:
        held.setdefault(b[1], []).append(b)
    moves: list[Move] = []
    for target in new:
        while True:
            move = _best_move(held, load, target, share)
            if move is None:
                break
            index, source, rows, nbytes = move
            held[source] = [b for b in held[source] if b[0] != index]
            load[source] -= rows
            load[target] += rows
            moves.append(Move(index, source, target, rows, nbytes))
    return RebalancePlan(
        tuple(moves), dict(load), new, sum(m.nbytes for m in moves), int(share_bytes)
    )


def _best_move(
    held: Mapping[str, Sequence[tuple[int, str, int, int]]],
    load: Mapping[str, int],
    target: str,
    share: float,
) -> tuple[int, str, int, int] | None:
    """The buffer of the most-loaded worker that best brings ``target`` towards ``share``.

    A move must narrow the gap between source and target (``target + rows < source``) and
    leave the target at most at its share; among the candidates, the largest wins (fewest
    moves; the lower index on a tie, so that plans are deterministic).
    """
    sources = sorted((w for w in held if held[w] and w != target), key=lambda w: (-load[w], w))
    for source in sources:
        fits = [
            b
            for b in held[source]
            if b[2] > 0 and load[target] + b[2] < load[source] and load[target] + b[2] <= share
        ]
        if fits:
            return min(fits, key=lambda b: (-b[2], b[0]))
    return None
