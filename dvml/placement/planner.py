"""The plan that maps input partitions to packed buffers on target workers.

Given how many rows each input partition holds and which workers receive data, the planner
decides how many rows each worker gets (balanced to within one row, so every
MultiWorkerMirroredStrategy trainer runs the same number of steps), cuts each worker's rows into
buffers of ``buffer_size`` rows (MADlib's name), and draws how many rows of each partition go to
each buffer. That draw is a random contingency table, so the rows of every partition spread over
all buffers: a global shuffle without a global permutation. Plain values in, plain values out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError, PlacementError

__all__ = [
    "BufferPlan",
    "Layout",
    "PiecePlan",
    "default_buffer_size",
    "partition_seed",
    "plan_layout",
    "plan_pieces",
    "split_partition",
]

# numpy's "marginals" multivariate hypergeometric loses precision from 10**9 items on.
_MAX_ROWS = 10**9 - 1


@dataclasses.dataclass(frozen=True)
class BufferPlan:
    """One packed buffer: its global index, the target that holds it and its row count."""

    index: int
    worker: str
    rows: int


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """Where every row goes.

    Attributes
    ----------
    buffers : tuple of BufferPlan
        In order of targets, then of buffers within a target; ``buffers[b].index == b``.
    counts : numpy.ndarray
        Read-only int64 array of shape ``(n_partitions, n_buffers)``: ``counts[p, b]`` rows of
        partition ``p`` go to buffer ``b``. Row sums are the partition sizes, column sums the
        buffer sizes.
    buffer_size : int
        The largest number of rows in one buffer.
    rows_per_worker : dict of str to int
        Rows each target receives, in target order.
    """

    buffers: tuple[BufferPlan, ...]
    counts: np.ndarray
    buffer_size: int
    rows_per_worker: dict[str, int]

    @property
    def n_partitions(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_buffers(self) -> int:
        return len(self.buffers)

    def buffers_of(self, worker: str) -> tuple[BufferPlan, ...]:
        """The buffers that ``worker`` holds, in index order."""
        return tuple(b for b in self.buffers if b.worker == worker)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentTypeError(f"{name} must be an int. Received: {name}={value!r}.")
    if value < minimum:
        raise ArgumentError(f"{name} must be at least {minimum}. Received: {name}={value!r}.")
    return int(value)


def default_buffer_size(n_rows: int, n_targets: int, row_bytes: int, max_buffer_bytes: int) -> int:
    """MADlib's default ``buffer_size``: the rows per target, capped by a byte budget.

    Parameters
    ----------
    n_rows : int
        Rows in the whole input.
    n_targets : int
        Workers that receive rows.
    row_bytes : int
        Bytes of one packed row (x and y together).
    max_buffer_bytes : int
        Upper bound of one buffer in bytes.

    Returns
    -------
    int
        ``min(ceil(n_rows / n_targets), max_buffer_bytes // row_bytes)``, at least 1.
    """
    n_rows = _check_int("n_rows", n_rows, 0)
    n_targets = _check_int("n_targets", n_targets, 1)
    row_bytes = _check_int("row_bytes", row_bytes, 1)
    max_buffer_bytes = _check_int("max_buffer_bytes", max_buffer_bytes, 1)
    per_target = math.ceil(n_rows / n_targets)
    return max(1, min(per_target, max_buffer_bytes // row_bytes))


def _balanced(n_rows: int, targets: Sequence[str]) -> dict[str, int]:
    base, extra = divmod(n_rows, len(targets))
    return {t: base + (1 if i < extra else 0) for i, t in enumerate(targets)}


def plan_layout(
    partition_rows: Sequence[int],
    targets: Sequence[str],
    buffer_size: int | None,
    row_bytes: int,
    max_buffer_bytes: int,
    seed: int,
    rows_per_worker: Mapping[str, int] | None = None,
) -> Layout:
    """Plan the buffers of a dataset and which rows of which partition fill them.

    Parameters
    ----------
    partition_rows : sequence of int
        Rows of each input partition, in partition order; zeros are allowed.
    targets : sequence of str
        Target ids (worker addresses), in order; the first ``N % T`` get one row more.
    buffer_size : int or None
        Rows per buffer; None picks :func:`default_buffer_size`.
    row_bytes : int
        Bytes of one packed row, for the default buffer size.
    max_buffer_bytes : int
        Byte budget of one buffer, for the default buffer size.
    seed : int
        Seed of the draw: the same inputs and seed give the same layout.
    rows_per_worker : mapping of str to int, optional
        Rows each target receives, when not the balanced split (an append's new rows,
        :func:`dvml.store.versions.balance_new_rows`); a target may then receive none.

    Returns
    -------
    Layout

    Raises
    ------
    ArgumentError
        For a negative partition size or ``buffer_size <= 0``.
    ArgumentTypeError
        For non-integer sizes or seed.
    DataError
        For an empty input, fewer rows than targets, or 10**9 rows or more.
    PlacementError
        For an empty target list or duplicate targets.

    Notes
    -----
    Rows inside a buffer still arrive grouped by partition; the packing step should permute
    them (seeded) if batches must mix partitions.
    """
    sizes = [_check_partition(i, n) for i, n in enumerate(partition_rows)]
    targets = list(targets)
    if not targets:
        raise PlacementError(
            "plan_layout needs at least one target. Received: targets=[]. "
            "Resolve the distribution rules first (resolve_rules)."
        )
    if len(set(targets)) != len(targets):
        raise PlacementError(f"targets must be unique. Received: targets={targets}.")
    seed = _check_int("seed", seed, 0)
    n_rows = sum(sizes)
    if n_rows == 0:
        raise DataError(
            f"Cannot place an empty input: the partitions hold 0 rows. Received: "
            f"{len(sizes)} partition(s). Check the input and any filter applied to it."
        )
    if rows_per_worker is not None:
        given = {t: int(rows_per_worker.get(t, 0)) for t in targets}
        if (
            sum(given.values()) != n_rows
            or min(given.values()) < 0
            or set(rows_per_worker) - set(targets)
        ):
            raise PlacementError(
                f"rows_per_worker must give each target a count >= 0, summing to the input's "
                f"{n_rows} rows. Received: rows_per_worker={dict(rows_per_worker)}."
            )
    elif n_rows < len(targets):
        raise DataError(
            f"The input has fewer rows than target workers: each worker would get "
            f"{n_rows} // {len(targets)} = 0 rows, and a trainer without rows cannot take "
            f"part in training. Received: {n_rows} rows for {len(targets)} workers. Use fewer "
            f"workers (distribution_rules) or more data."
        )
    if n_rows > _MAX_ROWS:
        raise DataError(
            f"One dataset holds at most {_MAX_ROWS} rows. Received: {n_rows} rows. "
            f"Split the input into several datasets."
        )
    if buffer_size is None:
        buffer_size = default_buffer_size(n_rows, len(targets), row_bytes, max_buffer_bytes)
    else:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int | np.integer):
            raise ArgumentTypeError(
                f"buffer_size must be an int or None. Received: buffer_size={buffer_size!r}."
            )
        if buffer_size <= 0:
            raise ArgumentError(
                f"buffer_size must be a positive number of rows. Received: "
                f"buffer_size={buffer_size}. Pass a positive int, or None for the default."
            )
        buffer_size = int(buffer_size)

    if rows_per_worker is None:
        per_worker = _balanced(n_rows, targets)
    else:
        per_worker = {t: int(rows_per_worker.get(t, 0)) for t in targets}
    buffers: list[BufferPlan] = []
    for target, rows in per_worker.items():
        full, rest = divmod(rows, buffer_size)
        for size in [buffer_size] * full + ([rest] if rest else []):
            buffers.append(BufferPlan(len(buffers), target, size))

    counts = _draw_counts(sizes, [b.rows for b in buffers], seed)
    counts.flags.writeable = False
    return Layout(tuple(buffers), counts, max(b.rows for b in buffers), per_worker)


def _check_partition(position: int, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise ArgumentTypeError(
            f"partition_rows must hold ints. Received: partition {position} has {n!r} rows."
        )
    if n < 0:
        raise ArgumentError(
            f"partition_rows must not be negative. Received: partition {position} has {n} rows."
        )
    return int(n)


def _draw_counts(partition_rows: list[int], buffer_rows: list[int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    remaining = np.asarray(buffer_rows, dtype=np.int64)
    counts = np.zeros((len(partition_rows), len(buffer_rows)), dtype=np.int64)
    # Drawing partition by partition from what is left of every buffer gives a uniformly random
    # assignment of rows to buffers, conditioned on all the margins.
    for p, n in enumerate(partition_rows):
        if n:
            counts[p] = rng.multivariate_hypergeometric(remaining, n)
            remaining -= counts[p]
    return counts


def partition_seed(seed: int, partition: int) -> int:
    """A seed for partition ``partition`` that is independent of the other partitions' seeds.

    Use it with :func:`split_partition`, so partitions of equal size are not permuted alike.
    """
    seed = _check_int("seed", seed, 0)
    partition = _check_int("partition", partition, 0)
    return int(np.random.SeedSequence(seed, spawn_key=(partition,)).generate_state(1)[0])


def split_partition(n_rows: int, counts_row: np.ndarray, seed: int) -> list[np.ndarray]:
    """The row indices a partition sends to each buffer.

    Parameters
    ----------
    n_rows : int
        Rows in the partition.
    counts_row : numpy.ndarray
        ``layout.counts[p]``: rows for each buffer; must sum to ``n_rows``.
    seed : int
        Seed of the permutation; derive one per partition with :func:`partition_seed`.

    Returns
    -------
    list of numpy.ndarray
        One int64 index array per buffer (empty where the partition sends nothing), together a
        permutation of ``range(n_rows)``.
    """
    n_rows = _check_int("n_rows", n_rows, 0)
    seed = _check_int("seed", seed, 0)
    counts = np.asarray(counts_row)
    if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer):
        raise ArgumentError(
            f"counts_row must be a 1-D integer array. Received: shape {counts.shape}, "
            f"dtype {counts.dtype}."
        )
    if (counts < 0).any():
        raise ArgumentError(f"counts_row must not be negative. Received: counts_row={counts}.")
    if int(counts.sum()) != n_rows:
        raise ArgumentError(
            f"counts_row must sum to n_rows. Received: n_rows={n_rows}, "
            f"sum(counts_row)={int(counts.sum())}. Pass layout.counts[p] with that partition's "
            f"row count."
        )
    if counts.size == 0:
        return []
    perm = np.random.default_rng(seed).permutation(n_rows).astype(np.int64, copy=False)
    return np.split(perm, np.cumsum(counts)[:-1])


@dataclasses.dataclass(frozen=True, eq=False)
class PiecePlan:
    """How a partition's shuffled rows are cut into one piece per target worker.

    A partition is permuted once and laid out buffer after buffer in :attr:`order`, which
    keeps the buffers of one target together: the rows a target needs from a partition are
    then ONE contiguous piece, moved once, and each of the target's buffers is a slice of it.

    Attributes
    ----------
    order : numpy.ndarray
        Buffer indices grouped by target (targets by first appearance), then by index.
    targets : tuple of str
        The distinct targets, in that order.
    target_of : numpy.ndarray
        ``target_of[b]``: position in :attr:`targets` of buffer ``b``'s target.
    ordered_counts : numpy.ndarray
        ``counts[:, order]``: pass row ``p`` to :func:`split_partition` with the permutation
        of partition ``p``.
    piece_ranges : numpy.ndarray
        Shape ``(n_partitions, n_targets, 2)``: start and stop, in partition ``p``'s laid-out
        rows, of the piece that target ``t`` receives.
    buffer_ranges : numpy.ndarray
        Shape ``(n_partitions, n_buffers, 2)``: start and stop of buffer ``b``'s rows within
        the piece of partition ``p`` that buffer ``b``'s target receives.
    """

    order: np.ndarray
    targets: tuple[str, ...]
    target_of: np.ndarray
    ordered_counts: np.ndarray
    piece_ranges: np.ndarray
    buffer_ranges: np.ndarray


def plan_pieces(counts: np.ndarray, buffer_targets: Sequence[str]) -> PiecePlan:
    """Group each partition's rows by target worker (see :class:`PiecePlan`).

    Parameters
    ----------
    counts : numpy.ndarray
        ``Layout.counts``: rows of partition ``p`` for buffer ``b``.
    buffer_targets : sequence of str
        The target (worker address) of each buffer.

    Returns
    -------
    PiecePlan
    """
    counts = np.asarray(counts)
    if counts.ndim != 2 or not np.issubdtype(counts.dtype, np.integer):
        raise ArgumentError(
            f"counts must be a 2-D integer array. Received: shape {counts.shape}, "
            f"dtype {counts.dtype}."
        )
    if len(buffer_targets) != counts.shape[1]:
        raise ArgumentError(
            f"buffer_targets must name one target per buffer. Received: "
            f"{len(buffer_targets)} targets for {counts.shape[1]} buffers."
        )
    targets = tuple(dict.fromkeys(buffer_targets))
    target_of = np.array([targets.index(t) for t in buffer_targets], dtype=np.int64)
    order = np.argsort(target_of, kind="stable")
    ordered_counts = counts[:, order]
    # Row offsets of every buffer in a partition's laid-out rows, in `order`.
    ends = np.cumsum(ordered_counts, axis=1)
    starts = ends - ordered_counts
    n_parts, n_buffers = counts.shape
    piece_ranges = np.zeros((n_parts, len(targets), 2), dtype=np.int64)
    buffer_ranges = np.zeros((n_parts, n_buffers, 2), dtype=np.int64)
    for t in range(len(targets)):
        members = np.flatnonzero(target_of[order] == t)  # positions in `order`, consecutive
        first, last = members[0], members[-1]
        piece_ranges[:, t] = np.stack([starts[:, first], ends[:, last]], axis=1)
        for position in members:
            b = order[position]
            buffer_ranges[:, b, 0] = starts[:, position] - starts[:, first]
            buffer_ranges[:, b, 1] = ends[:, position] - starts[:, first]
    return PiecePlan(order, targets, target_of, ordered_counts, piece_ranges, buffer_ranges)
