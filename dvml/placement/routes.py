"""Routes of the pack graph: source partitions grouped where they live, rows to buffers.

The pack graph (:mod:`dvml.preprocess.graph`) has a number of Dask tasks that grows with
partitions plus targets, not with their product. Partitions are grouped by the worker that
holds them (:func:`group_parts`); one task per group lays out the rows of all its partitions
buffer after buffer (buffers grouped by target, as :func:`~dvml.placement.planner.plan_pieces`
orders them), so that the rows a buffer needs from a group are ONE contiguous slice
(:func:`plan_routes`). The pack task of a buffer fetches its slice from each group's worker
directly, outside the task graph. Small source partitions whose sizes are known are prepared
several per task (:func:`batch_sizes`). :func:`pack_graph_size` counts the tasks and the etcd
writes of one run, the scale model the README quotes. Plain values in, plain values out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from dvml.exceptions import ArgumentError
from dvml.placement.planner import plan_pieces

__all__ = [
    "BATCH_BYTES",
    "FETCH_ROUND_BYTES",
    "MAX_GROUP_BYTES",
    "RoutePlan",
    "batch_sizes",
    "group_parts",
    "pack_chunks",
    "pack_graph_size",
    "plan_routes",
]

# Bytes of prepared partitions per group task. A group task holds its inputs and its laid-out
# rows at once, so this bounds the extra memory of a worker while it splits (per thread);
# larger groups mean fewer tasks.
MAX_GROUP_BYTES = 128 << 20
# Rows a pack task fetches in one round (one request per worker that holds them) before
# writing them: bounds the task's memory beside the buffers in shared memory.
FETCH_ROUND_BYTES = 64 << 20

# A prepare task reads at most this many bytes of source partitions, and every thread gets
# at least BATCHES_PER_THREAD tasks: big enough that Dask's cost per task (~2 ms on this
# machine) is small beside the work, small enough to balance the threads and bound memory.
BATCH_BYTES = 16 << 20
BATCHES_PER_THREAD = 4


def batch_sizes(block_bytes: Sequence[int] | None, n_blocks: int, threads: int) -> list[int]:
    """How many consecutive blocks (partitions) each prepare task takes.

    Parameters
    ----------
    block_bytes
        The size of each block in bytes, or None where unknown (then one block per task).
    n_blocks
        The number of blocks.
    threads
        Threads of the cluster.

    Returns
    -------
    list of int
        Blocks per task, in order; they sum to ``n_blocks``.
    """
    if block_bytes is None:
        return [1] * n_blocks
    if len(block_bytes) != n_blocks:
        raise ArgumentError(
            f"block_bytes must have one entry per block. Received: {len(block_bytes)} sizes "
            f"for {n_blocks} blocks."
        )
    limit = min(BATCH_BYTES, sum(block_bytes) / (BATCHES_PER_THREAD * max(1, threads)))
    sizes: list[int] = []
    count = size = 0
    for nbytes in block_bytes:
        if count and size + nbytes > limit:
            sizes.append(count)
            count = size = 0
        count += 1
        size += nbytes
    if count:
        sizes.append(count)
    return sizes


def group_parts(
    holders: Sequence[str],
    part_bytes: Sequence[int],
    threads: Mapping[str, int],
    max_group_bytes: int = MAX_GROUP_BYTES,
) -> list[tuple[str, list[int]]]:
    """Group partitions by the worker that holds them.

    Parameters
    ----------
    holders : sequence of str
        The worker holding each partition, in partition order.
    part_bytes : sequence of int
        The size of each partition in bytes.
    threads : mapping of str to int
        Threads of each worker (a worker not listed counts as 1).
    max_group_bytes : int
        A worker's partitions are cut into groups of about this many bytes at most, and into
        at least as many groups as it has threads (so that every thread splits).

    Returns
    -------
    list of (str, list of int)
        ``(worker, partitions)`` per group: workers in sorted order, partitions ascending and
        consecutive within the worker's own, each partition in exactly one group.
    """
    if len(holders) != len(part_bytes):
        raise ArgumentError(
            f"holders and part_bytes must have one entry per partition. Received: "
            f"{len(holders)} holders and {len(part_bytes)} sizes."
        )
    if max_group_bytes < 1:
        raise ArgumentError(
            f"max_group_bytes must be positive. Received: max_group_bytes={max_group_bytes}."
        )
    by_holder: dict[str, list[int]] = {}
    for p, holder in enumerate(holders):
        by_holder.setdefault(holder, []).append(p)
    groups: list[tuple[str, list[int]]] = []
    for holder in sorted(by_holder):
        parts = by_holder[holder]
        size = sum(int(part_bytes[p]) for p in parts)
        n = min(len(parts), max(int(threads.get(holder, 1)), math.ceil(size / max_group_bytes)))
        groups.extend((holder, [int(p) for p in chunk]) for chunk in np.array_split(parts, n))
    return groups


def pack_chunks(buffer_targets: Sequence[str], threads: Mapping[str, int]) -> list[list[int]]:
    """The buffers each pack task packs: those of one target, cut into one chunk per thread.

    Parameters
    ----------
    buffer_targets : sequence of str
        The target worker of each buffer.
    threads : mapping of str to int
        Threads of each worker (a worker not listed counts as 1).

    Returns
    -------
    list of list of int
        Buffer indices per task, ascending; targets in order of their first buffer, and at
        most as many chunks per target as it has threads and buffers.
    """
    by_target: dict[str, list[int]] = {}
    for b, target in enumerate(buffer_targets):
        by_target.setdefault(target, []).append(b)
    chunks: list[list[int]] = []
    for target, buffers in by_target.items():
        n = min(len(buffers), max(1, int(threads.get(target, 1))))
        chunks.extend([int(b) for b in chunk] for chunk in np.array_split(buffers, n))
    return chunks


@dataclasses.dataclass(frozen=True, eq=False)
class RoutePlan:
    """Where each group lays out its rows and which slice of it each buffer reads.

    Attributes
    ----------
    groups : tuple of tuple of int
        The partitions of each group, ascending.
    group_counts : tuple of numpy.ndarray
        Per group, ``counts[parts][:, order]`` (shape ``(len(parts), n_buffers)``): pass row
        ``i`` to :func:`~dvml.placement.planner.split_partition` for the group's ``i``-th
        partition.
    starts : tuple of numpy.ndarray
        Per group, shape ``(n_buffers, len(parts))``: the first row, in the group's laid-out
        rows, of partition ``i``'s rows for the buffer at position ``j`` of ``order``. The
        laid-out rows run buffer after buffer (in ``order``), partition after partition.
    order : numpy.ndarray
        Buffer indices grouped by target (see :class:`~dvml.placement.planner.PiecePlan`).
    fetches : tuple of tuple of (int, int, int)
        Per buffer ``b``: ``(group, start, stop)`` for every group that holds rows of ``b``:
        rows ``start:stop`` of that group's laid-out rows are ``b``'s rows from the group's
        partitions, partition after partition.
    """

    groups: tuple[tuple[int, ...], ...]
    group_counts: tuple[np.ndarray, ...]
    starts: tuple[np.ndarray, ...]
    order: np.ndarray
    fetches: tuple[tuple[tuple[int, int, int], ...], ...]


def plan_routes(
    counts: np.ndarray, buffer_targets: Sequence[str], groups: Sequence[Sequence[int]]
) -> RoutePlan:
    """Plan the laid-out rows of every group and the slice each buffer fetches from it.

    Parameters
    ----------
    counts : numpy.ndarray
        ``Layout.counts``: rows of partition ``p`` for buffer ``b``.
    buffer_targets : sequence of str
        The target (worker address) of each buffer.
    groups : sequence of sequence of int
        Partitions of each group; together each partition exactly once.

    Returns
    -------
    RoutePlan
    """
    pieces = plan_pieces(counts, buffer_targets)
    counts = np.asarray(counts)
    n_parts, n_buffers = counts.shape
    flat = sorted(p for g in groups for p in g)
    if flat != list(range(n_parts)):
        raise ArgumentError(
            f"groups must hold every partition 0..{n_parts - 1} exactly once. Received: "
            f"{len(flat)} entries over {len(groups)} groups."
        )
    position = np.empty(n_buffers, dtype=np.int64)
    position[pieces.order] = np.arange(n_buffers)
    fetches: list[list[tuple[int, int, int]]] = [[] for _ in range(n_buffers)]
    group_counts, all_starts = [], []
    for g, parts in enumerate(groups):
        ordered = np.ascontiguousarray(pieces.ordered_counts[sorted(parts)])
        sizes = ordered.T  # (buffer position, part): laid out buffer-major
        ends = np.cumsum(sizes.ravel()).reshape(sizes.shape)
        starts = ends - sizes
        group_counts.append(ordered)
        all_starts.append(starts)
        totals = sizes.sum(axis=1)
        for b in range(n_buffers):
            j = position[b]
            if totals[j]:
                first = int(starts[j, 0])
                fetches[b].append((g, first, first + int(totals[j])))
    return RoutePlan(
        groups=tuple(tuple(sorted(int(p) for p in g)) for g in groups),
        group_counts=tuple(group_counts),
        starts=tuple(all_starts),
        order=pieces.order,
        fetches=tuple(tuple(f) for f in fetches),
    )


def pack_graph_size(
    partitions: int,
    workers: int,
    buffers: int,
    *,
    fields: int = 2,
    threads: int = 1,
    partition_bytes: int = 0,
    holders: int | None = None,
    batched: bool = False,
) -> dict[str, int]:
    """Tasks, fetches and etcd writes of one pack, as :mod:`dvml.preprocess.graph` runs it.

    A model for partitions spread evenly over the workers that hold them; the benchmark B12
    and the README quote it. It leaves out the tasks of the source itself (reading, e.g. two
    per block of a dict of Dask arrays), which any computation of the source runs too.

    Parameters
    ----------
    partitions, workers, buffers : int
        Source partitions P, target workers W and buffers B of the run.
    fields : int
        Tensors per buffer (x inputs plus y).
    threads : int
        Threads per worker.
    partition_bytes : int
        Bytes of one prepared partition (decides the groups; 0: one group per thread).
    holders : int, optional
        Workers that hold source partitions (default ``min(P, W)``).
    batched : bool
        Whether the source's partition sizes are known before reading (a dict of Dask
        arrays), so that small ones are prepared several per task (:func:`batch_sizes`, from
        ``partition_bytes``, all W workers' threads). Otherwise one prepare task per partition.

    Returns
    -------
    dict of str to int
        ``prepare`` (P, or the batches), ``stats`` and ``split`` (one per group), ``pack``
        (one per thread of each target that holds buffers), ``catalog`` (the tasks that
        persist, publish and clean up: two per target instance and one), ``tasks`` (their
        sum), ``fetches`` (worker-to-worker requests of the pack tasks, outside the graph)
        and ``etcd_writes`` (metadata writes, :mod:`dvml.store.publish`: none per buffer;
        per target instance one persist of its buffers and one delete of the object that
        carried them; per field a GlobalTensor; the dataset's root object and its name).
    """
    for name, value in (("partitions", partitions), ("workers", workers), ("buffers", buffers)):
        if value < 1:
            raise ArgumentError(f"{name} must be at least 1. Received: {name}={value}.")
    sizes = [1] * partitions
    if batched:
        sizes = batch_sizes([partition_bytes] * partitions, partitions, workers * threads)
    prepare = len(sizes)
    holders = min(prepare, workers) if holders is None else holders
    n_groups = 0
    for h in range(holders):
        held = len(range(h, prepare, holders))  # prepare tasks (batches) on this holder
        by_bytes = math.ceil(len(range(h, partitions, holders)) * partition_bytes / MAX_GROUP_BYTES)
        n_groups += min(held, max(threads, by_bytes))
    buffers = max(buffers, workers)
    # dvml.store.publish: one persist task per target instance, the publish task, one cleanup
    # task per instance (the targets, for the model)
    catalog = 2 * min(workers, buffers) + 1
    # One pack task per thread of each target (pack_chunks), buffers spread evenly; each
    # fetches its buffers' rows in rounds of FETCH_ROUND_BYTES, one request per holder.
    buffer_bytes = partitions * partition_bytes / buffers
    pack = fetches = 0
    for w in range(workers):
        held = len(range(w, buffers, workers))
        for n in (len(range(t, held, threads)) for t in range(min(held, threads))):
            pack += 1
            per_round = max(1, int(FETCH_ROUND_BYTES // buffer_bytes)) if buffer_bytes else n
            fetches += math.ceil(n / per_round) * min(n_groups, holders)
    tasks = prepare + 2 * n_groups + pack + catalog
    etcd = 2 * min(workers, buffers) + fields + 2
    return {
        "prepare": prepare,
        "stats": n_groups,
        "split": n_groups,
        "pack": pack,
        "catalog": catalog,
        "tasks": tasks,
        "fetches": fetches,
        "etcd_writes": etcd,
    }
