"""Pure batching arithmetic: equal steps on every worker, per-epoch shuffles by index."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from dvml.exceptions import ParameterError

__all__ = ["BatchPlan", "per_worker_batch_size", "steps_per_epoch"]


def per_worker_batch_size(global_batch_size: int, n_workers: int) -> int:
    """The batch each worker feeds when ``global_batch_size`` is split over ``n_workers``.

    Raises
    ------
    ParameterError
        When the global batch does not divide evenly (MultiWorkerMirroredStrategy needs equal
        per-replica batches).
    """
    if global_batch_size < n_workers or global_batch_size % n_workers:
        raise ParameterError(
            f"batch_size is the global batch, split evenly over the {n_workers} trainers, so it "
            f"must be a multiple of {n_workers}. Received: batch_size={global_batch_size}."
        )
    return global_batch_size // n_workers


def steps_per_epoch(rows_per_worker: Sequence[int], per_worker_batch: int) -> int:
    """Steps every worker runs per epoch: the fewest full batches any worker holds.

    Synchronous training needs the same number of steps everywhere; the preprocessor keeps
    workers within one row of each other, so at most one batch of rows is left out per epoch
    (a different one each epoch, since every epoch reshuffles).
    """
    fewest = min(rows_per_worker)
    steps = fewest // per_worker_batch
    if steps < 1:
        raise ParameterError(
            f"batch_size is too large: a worker holds only {fewest} rows, fewer than its "
            f"per-worker batch of {per_worker_batch}. Use a smaller batch_size or fewer workers."
        )
    return steps


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Which rows of the local buffers make up each batch of an epoch.

    Rows are numbered across the local buffers in order; each epoch draws a new permutation
    (seeded by ``seed`` and the epoch), so batches mix rows of every local buffer.
    """

    buffer_rows: tuple[int, ...]
    batch_size: int
    steps: int
    seed: int

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
        used = order[: self.steps * self.batch_size].reshape(self.steps, self.batch_size)
        used = np.sort(used, axis=1)
        for rows in used:
            cuts = np.searchsorted(rows, offsets)
            yield [
                (b, rows[cuts[b] : cuts[b + 1]] - offsets[b])
                for b in range(len(self.buffer_rows))
                if cuts[b + 1] > cuts[b]
            ]
