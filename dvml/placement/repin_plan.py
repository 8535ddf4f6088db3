"""The re-pin plan of an elastic job: where the buffers of departed workers go.

When a worker leaves during an elastic job (``dvml.fit(..., elastic=True)``), the rows it held
must not be lost: each of its *whole* buffers is copied onto a surviving trainer's vineyardd
(the rebalance copy, :mod:`dvml.preprocess.rebalance`), read from the departed worker's own
vineyardd, which still runs when only the worker process died. A buffer whose vineyardd is gone
too (its host died) cannot be copied: it is left out, and the plan says how many rows that is,
so that the job can say so rather than train on fewer rows silently.

Each buffer goes to the survivor that holds the fewest rows at that moment (largest buffers
first), so the survivors' rows stay as even as whole buffers allow and the per-iteration
averaging, weighted by rows, keeps MADlib's rule.

Plain values in, plain values out (:func:`plan_repin`); copying is the caller's job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.placement.buffer_rows import parsed_buffers
from dvml.placement.move_plan import Move

__all__ = ["RepinPlan", "plan_repin"]


@dataclasses.dataclass(frozen=True)
class RepinPlan:
    """The copies of a re-pin and what they lead to.

    Attributes
    ----------
    moves : tuple of Move
        Buffers to copy from a departed worker (``source``) to a survivor (``target``), in
        the order planned (largest first).
    left_out : tuple of int
        Indexes of the departed workers' buffers that cannot be copied (their vineyardd is
        gone), in index order.
    rows_left_out : int
        Their rows.
    rows_per_worker : dict of str to int
        Rows per survivor after the copies.
    """

    moves: tuple[Move, ...]
    left_out: tuple[int, ...]
    rows_left_out: int
    rows_per_worker: dict[str, int]

    @property
    def repinned_rows(self) -> int:
        """Rows copied onto survivors."""
        return sum(m.rows for m in self.moves)

    @property
    def bytes_moved(self) -> int:
        """Bytes copied onto survivors."""
        return sum(m.nbytes for m in self.moves)


def plan_repin(
    buffers: Sequence[Mapping[str, Any]],
    departed: Collection[str],
    survivors: Sequence[str],
    readable: Collection[str],
) -> RepinPlan:
    """Plan the copies that put the departed workers' buffers onto the survivors.

    Parameters
    ----------
    buffers : sequence of mapping
        The dataset's buffers: ``index``, ``worker`` (the key of the worker holding it),
        ``rows`` and ``nbytes``.
    departed : collection of str
        The keys of the workers that left.
    survivors : sequence of str
        The keys of the workers the job goes on with (the targets), in a stable order (it
        breaks ties).
    readable : collection of str
        The departed workers whose vineyardd still answers (their buffers can be copied);
        the others' buffers are left out.

    Returns
    -------
    RepinPlan

    Raises
    ------
    ArgumentError
        No survivor, or a worker both departed and surviving.
    """
    if isinstance(survivors, str) or not all(isinstance(s, str) for s in survivors):
        raise ArgumentTypeError(
            f"survivors must be a sequence of worker keys (str). Received: {survivors!r}."
        )
    gone = set(departed)
    if not survivors or gone & set(survivors):
        raise ArgumentError(
            "A re-pin needs at least one survivor and no worker both departed and surviving. "
            f"Received: departed={sorted(gone)}, survivors={list(survivors)}."
        )
    parsed = parsed_buffers(buffers)
    load = {s: 0 for s in survivors}
    for _, worker, rows, _ in parsed:
        if worker in load:
            load[worker] += rows
    order = {s: i for i, s in enumerate(survivors)}
    lost = sorted((b for b in parsed if b[1] in gone), key=lambda b: (-b[2], b[0]))
    moves: list[Move] = []
    left_out: list[tuple[int, int]] = []
    for index, source, rows, nbytes in lost:
        if source not in readable:
            left_out.append((index, rows))
            continue
        target = min(survivors, key=lambda s: (load[s], order[s]))
        load[target] += rows
        moves.append(Move(index, source, target, rows, nbytes))
    left_out.sort()
    return RepinPlan(
        tuple(moves),
        tuple(i for i, _ in left_out),
        sum(r for _, r in left_out),
        dict(load),
    )
