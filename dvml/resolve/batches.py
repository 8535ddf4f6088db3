"""Pure batching arithmetic: equal steps on every worker, per-epoch shuffles by index.

The averaging rule of ``sync="step"``
-------------------------------------
A step's gradient is the mean over the global batch's rows, however the batch is split over
the trainers. tf-keras under MultiWorkerMirroredStrategy takes each trainer's loss as the
mean over its LOCAL batch (``SUM_OVER_BATCH_SIZE`` divides by the number of rows, not by the
sum of their weights), scales it by ``1/n`` and sums the gradients over the ``n`` trainers:
with unequal local batches a row of a small batch would weigh more. Each trainer therefore
weighs its rows :func:`row_weights` (``n * b / B`` for a local batch of ``b`` rows of a global
batch of ``B``), which makes the sum exactly the mean over the ``B`` rows (checked for one-
and two-output models against one process: tests/train/test_step_weights.py). Even splits
weigh 1 and train unweighted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from dvml.exceptions import ParameterError

__all__ = [
    "BatchPlan",
    "batch_sizes_by_rows",
    "per_worker_batch_sizes",
    "row_weights",
    "steps_covering",
    "steps_per_epoch",
]


def per_worker_batch_sizes(global_batch_size: int, rows_per_worker: Sequence[int]) -> list[int]:
    """Split the global batch over the workers as evenly as possible, one size per worker.

    When ``global_batch_size`` does not divide evenly, the ``global_batch_size % n`` workers
    that hold the most rows (the first of equals) feed one row more per batch, which keeps the
    number of full batches every worker can run (:func:`steps_per_epoch`) as large as possible.
    Each step then still uses exactly ``global_batch_size`` rows over all workers; with
    ``sync="step"`` the rows are weighted (:func:`row_weights`) so that the gradient is the mean
    over them all.

    Raises
    ------
    ParameterError
        When ``global_batch_size`` is smaller than the number of workers (a worker would get
        an empty batch).
    """
    n_workers = len(rows_per_worker)
    if global_batch_size < n_workers:
        raise ParameterError(
            f"batch_size is the global batch, split over the {n_workers} trainers, so it must "
            f"be at least {n_workers}. Received: batch_size={global_batch_size}. Use "
            f"batch_size >= {n_workers} or preprocess onto fewer workers."
        )
    base, extra = divmod(global_batch_size, n_workers)
    most_rows_first = sorted(range(n_workers), key=lambda i: (-rows_per_worker[i], i))
    larger = set(most_rows_first[:extra])
    return [base + (i in larger) for i in range(n_workers)]


def batch_sizes_by_rows(global_batch_size: int, rows_per_worker: Sequence[int]) -> list[int]:
    """Split the global batch over the workers in proportion to the rows each holds.

    When an elastic fit gives a faster trainer more rows (dvml.placement.row_map), an even
    split would leave the extra rows out of every epoch (:func:`steps_per_epoch` is the fewest
    full batches any worker holds). Split by rows, every worker runs about the same number of
    steps over its own rows, the sum is still exactly ``global_batch_size``, and a trainer with
    fewer rows runs smaller (faster) steps.

    The split runs the most full steps any split can: the largest ``s`` for which the batches
    ``rows // s`` add up to at least the global batch, then one row less for the trainers
    furthest above their proportional share until the sum is exact. Fewer than
    ``global_batch_size`` rows per epoch wait for a later epoch wherever the rows allow it (a
    simple "largest remainders" split of 64 over 1,300 and 300 rows gave 51 and 13: 23 steps,
    128 rows left out, where 52 and 12 run 25 steps and train every row).

    ``sync="step"`` and an int ``k`` use it in an elastic fit whose rows moved. With
    ``sync="step"`` a trainer with fewer rows (a straggler that gave rows away) runs smaller
    steps, and :func:`row_weights` keeps every row's weight in the step's mean gradient equal.

    Raises
    ------
    ParameterError
        When ``global_batch_size`` is smaller than the number of workers.
    """
    rows = [int(r) for r in rows_per_worker]
    total = sum(rows)
    if total <= 0 or global_batch_size < len(rows) or min(rows) < 1:
        # no split by rows: the even one (which raises for too small a batch, saying why)
        return per_worker_batch_sizes(global_batch_size, rows)

    def room(steps: int) -> int:  # the largest global batch that runs `steps` full steps
        return sum(r // steps for r in rows)

    low, high = 0, min(rows)  # room(low) >= global_batch_size; high: every trainer has a row
    while low < high:
        mid = (low + high + 1) // 2
        if room(mid) >= global_batch_size:
            low = mid
        else:
            high = mid - 1
    if low == 0:  # fewer rows than one global batch: the batch cannot run a full step
        return per_worker_batch_sizes(global_batch_size, rows)
    sizes = [r // low for r in rows]
    share = [global_batch_size * r / total for r in rows]
    for _ in range(sum(sizes) - global_batch_size):
        over = max((i for i in range(len(rows)) if sizes[i] > 1),
                   key=lambda i: (sizes[i] - share[i], -i))  # fmt: skip
        sizes[over] -= 1
    return sizes


def row_weights(per_worker_batch: Sequence[int]) -> list[float]:
    """Each trainer's weight per row under ``sync="step"``: ``n * b / B``.

    With it, tf-keras's per-trainer mean over ``b`` rows, scaled by ``1/n`` and summed over
    the ``n`` trainers, is the mean over all ``B = sum(per_worker_batch)`` rows (module
    docstring). Every weight is 1.0 for an even split.

    Raises
    ------
    ParameterError
        When a batch is not a positive int.
    """
    sizes = list(per_worker_batch)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ParameterError(
            "Each trainer's batch must be a positive int, one per trainer. Received: "
            f"per_worker_batch={sizes!r}. Split the global batch with per_worker_batch_sizes "
            "or batch_sizes_by_rows."
        )
    total = sum(sizes)
    return [len(sizes) * b / total for b in sizes]


def steps_covering(rows: int, batch_size: int) -> int:
    """Steps that train every one of ``rows`` once: full batches, and a short last one for
    the rest (``sync="iteration"``'s trainers and the model hopper's hops, which run their
    own steps: nothing makes them stop at the same step as the others)."""
    return max(1, -(-int(rows) // int(batch_size)))


def steps_per_epoch(rows_per_worker: Sequence[int], per_worker_batch: int | Sequence[int]) -> int:
    """Steps every worker runs per epoch: the fewest full batches any worker holds.

    ``per_worker_batch`` is one size for every worker or one per worker (from
    :func:`per_worker_batch_sizes`). Synchronous training needs the same number of steps
    everywhere; the preprocessor keeps workers within one row of each other, so at most one
    batch of rows is left out per epoch (a different one each epoch, since every epoch
    reshuffles).
    """
    batches = (
        [per_worker_batch] * len(rows_per_worker)
        if isinstance(per_worker_batch, int)
        else list(per_worker_batch)
    )
    steps = min(rows // batch for rows, batch in zip(rows_per_worker, batches, strict=True))
    if steps < 1:
        short = min(range(len(batches)), key=lambda i: (rows_per_worker[i] // batches[i], i))
        raise ParameterError(
            f"batch_size is too large: a worker holds only {rows_per_worker[short]} rows, fewer "
            f"than its per-worker batch of {batches[short]}. Use a smaller batch_size or fewer "
            "workers."
        )
    return steps


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Which rows of the local buffers make up each batch of an epoch.

    Rows are numbered across the local buffers in order; each epoch draws a new permutation
    (seeded by ``seed`` and the epoch), so batches mix rows of every local buffer.

    ``steps`` batches of ``batch_size`` rows; when ``steps * batch_size`` exceeds the rows (at
    most by ``batch_size - 1``: ``steps`` of :func:`steps_covering`), the last batch holds the
    rest, so the epoch trains every row once. With fewer steps, the rows past
    ``steps * batch_size`` of the epoch's permutation wait for another epoch.
    """

    buffer_rows: tuple[int, ...]
    batch_size: int
    steps: int
    seed: int

    def __post_init__(self) -> None:
        covering = steps_covering(int(sum(self.buffer_rows)), self.batch_size)
        if self.steps > covering:
            raise ParameterError(
                f"A batch plan of {self.steps} steps of {self.batch_size} rows needs more rows "
                f"than the {sum(self.buffer_rows)} it has (at most {covering} steps). Plan "
                "the steps with steps_per_epoch or steps_covering."
            )

    @property
    def short_batch(self) -> int:
        """Rows of the epoch's last, short batch (0 when every batch is full)."""
        total = int(sum(self.buffer_rows))
        return total % self.batch_size if self.steps * self.batch_size > total else 0

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.buffer_rows)])

    def epoch(self, epoch: int, shuffle: bool = True) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Yield, for each step, ``[(buffer index, sorted row indices in that buffer), ...]``."""
        total = int(sum(self.buffer_rows))
        order = (
            np.random.default_rng([self.seed, epoch]).permutation(total)
            if shuffle
            else np.arange(total)
        )
        offsets = self.offsets
        # One sort per epoch, not per batch: sorted global row numbers are grouped by buffer
        # (offsets increase) and sorted within each, so a batch splits at the buffer offsets.
        # This runs in the trainer's input thread, where per-batch Python work competes with
        # the training loop for the GIL.
        full = min(self.steps, total // self.batch_size)
        used = order[: full * self.batch_size].reshape(full, self.batch_size)
        batches = list(np.sort(used, axis=1))
        if self.short_batch:
            batches.append(np.sort(order[full * self.batch_size :]))
        for rows in batches:
            cuts = np.searchsorted(rows, offsets)
            yield [
                (b, rows[cuts[b] : cuts[b + 1]] - offsets[b])
                for b in range(len(self.buffer_rows))
                if cuts[b + 1] > cuts[b]
            ]
