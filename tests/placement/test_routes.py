"""The routes of the pack graph: groups by holder, slices per buffer, the scale model.

Pure: the group layout and the pack's row positions are checked against the per-partition
pack that came before (one split per partition, one piece per partition and target): the
same rows in the same order in every buffer, whatever the grouping.
"""

from __future__ import annotations

import numpy as np
import pytest

from dvml.exceptions import ArgumentError
from dvml.placement.planner import partition_seed, plan_layout, plan_pieces, split_partition
from dvml.placement.routes import (
    MAX_GROUP_BYTES,
    group_parts,
    pack_chunks,
    pack_graph_size,
    plan_routes,
)
from dvml.preprocess.exchange import coalesce
from dvml.preprocess.tasks import buffer_positions, fetch_rounds, lay_out_group, slice_positions


def test_group_parts_by_holder_threads_and_bytes() -> None:
    holders = ["b", "a", "b", "a", "b", "b", "a"]
    groups = group_parts(holders, [10] * 7, {"a": 1, "b": 2}, max_group_bytes=1000)
    assert groups == [("a", [1, 3, 6]), ("b", [0, 2]), ("b", [4, 5])]
    # bytes cut a worker's partitions into more groups than it has threads
    groups = group_parts(["a"] * 6, [40] * 6, {"a": 1}, max_group_bytes=100)
    assert groups == [("a", [0, 1]), ("a", [2, 3]), ("a", [4, 5])]
    # never more groups than partitions
    assert group_parts(["a"], [10], {"a": 8}) == [("a", [0])]
    with pytest.raises(ArgumentError, match="one entry per partition"):
        group_parts(["a"], [1, 2], {})


def _reference_buffers(xs: list[np.ndarray], layout, targets: list[str], seed: int) -> list:
    """The pack before groups: split each partition, take each target's piece, pack."""
    plan = plan_pieces(layout.counts, targets)
    laid = []
    for p, x in enumerate(xs):
        seed_p = partition_seed(seed, p)
        perm = np.concatenate(split_partition(len(x), plan.ordered_counts[p], seed_p))
        laid.append(x[perm])
    buffers = []
    for b in range(layout.counts.shape[1]):
        t = plan.target_of[b]
        rows = []
        for p in range(len(xs)):
            if layout.counts[p, b]:
                start, stop = plan.piece_ranges[p, t]
                piece = laid[p][start:stop]
                rows.append(piece[slice(*plan.buffer_ranges[p, b])])
        cat = np.concatenate(rows)
        order = np.random.default_rng(seed + b).permutation(len(cat))
        buffers.append(cat[order])
    return buffers


@pytest.mark.parametrize(
    "groups",
    [[[0], [1], [2], [3], [4], [5]], [[0, 3], [1], [2, 4, 5]], [[0, 1, 2, 3, 4, 5]]],
    ids=["one-per-part", "mixed", "one-group"],
)
@pytest.mark.parametrize("buffer_size", [None, 7, 3])
def test_grouped_pack_gives_the_same_buffers_as_per_partition_pack(
    groups: list[list[int]], buffer_size: int | None
) -> None:
    seed = 11
    sizes = [9, 0, 14, 5, 21, 8]
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 1000, size=(n, 2)).astype(np.float32) for n in sizes]
    targets = ["w0", "w1", "w2"]
    layout = plan_layout(sizes, targets, buffer_size, 8, 1 << 20, seed)
    buffer_targets = [b.worker for b in layout.buffers]
    want = _reference_buffers(xs, layout, buffer_targets, seed)

    routes = plan_routes(layout.counts, buffer_targets, groups)
    laid = []
    for g, parts in enumerate(routes.groups):
        prepared = [{"x": [xs[p]], "labels": np.zeros(len(xs[p]), int)} for p in parts]
        seeds = [partition_seed(seed, p) for p in parts]
        out = lay_out_group(prepared, routes.group_counts[g], routes.starts[g], seeds, [0], 1, 1.0)
        assert len(out["x_0"]) == sum(sizes[p] for p in parts)
        laid.append(out["x_0"])
    for b in range(layout.n_buffers):
        column = layout.counts[:, b]
        rows = int(column.sum())
        where = buffer_positions(seed, b, rows)
        offsets = np.cumsum(column) - column
        got = np.full((rows, 2), -1, dtype=np.float32)
        for g, start, stop in routes.fetches[b]:
            got[slice_positions(column, offsets, where, routes.groups[g])] = laid[g][start:stop]
        np.testing.assert_array_equal(got, want[b])


def test_plan_routes_refuses_groups_that_miss_partitions() -> None:
    counts = np.array([[1, 1], [2, 0]])
    with pytest.raises(ArgumentError, match="exactly once"):
        plan_routes(counts, ["a", "b"], [[0]])


def test_pack_graph_size_grows_with_partitions_plus_workers() -> None:
    small = pack_graph_size(10_000, 8, 8)
    assert small["prepare"] == 10_000 and small["pack"] == 8
    assert small["stats"] == small["split"] == 8  # one group per worker thread
    big = pack_graph_size(10_000, 512, 512)
    assert big["tasks"] - big["prepare"] == 3 * 512 + big["catalog"]
    # bytes make more groups: 100 GiB in 10,000 partitions on 64 workers
    model = pack_graph_size(10_000, 64, 64, partition_bytes=10 << 20)
    assert MAX_GROUP_BYTES == 128 << 20  # 156 or 157 partitions of 10 MiB: 13 groups a worker
    assert model["split"] == 64 * 13
    assert model["etcd_writes"] == 2 * 64 + 2 + 2  # per instance, not per buffer (#17.2)
    with pytest.raises(ArgumentError, match="partitions must be at least 1"):
        pack_graph_size(0, 1, 1)


def test_pack_chunks_one_task_per_thread_of_each_target() -> None:
    targets = ["b", "a", "b", "a", "b", "c"]
    assert pack_chunks(targets, {"a": 1, "b": 2}) == [[0, 2], [4], [1, 3], [5]]
    # Never more chunks than buffers, nor an empty one.
    assert pack_chunks(["a", "a"], {"a": 8}) == [[0], [1]]
    assert pack_chunks([], {"a": 1}) == []


def test_fetch_rounds_bound_the_bytes_in_flight() -> None:
    assert fetch_rounds([10, 10, 10, 10], limit=25) == [[0, 1], [2, 3]]
    assert fetch_rounds([30, 5, 5], limit=25) == [[0], [1, 2]]  # a big buffer alone
    assert fetch_rounds([], limit=25) == []


def test_coalesce_merges_adjacent_slices_of_a_key() -> None:
    requests = [("a", 0, 4), ("b", 10, 12), ("a", 4, 9), ("a", 9, 9), ("a", 12, 15), ("b", 12, 13)]
    merged, spans = coalesce(requests)
    # a 0:9 is one request (an empty slice included); a 12:15 leaves a gap, so it is its own.
    assert merged == [("a", 0, 9), ("b", 10, 13), ("a", 12, 15)]
    assert spans == [(0, 0, 4), (1, 0, 2), (0, 4, 9), (0, 9, 9), (2, 0, 3), (1, 2, 3)]
    for (key, start, stop), (m, lo, hi) in zip(requests, spans, strict=True):
        assert merged[m][0] == key and merged[m][1] + lo == start and merged[m][1] + hi == stop
    assert coalesce([]) == ([], [])


def test_pack_graph_size_counts_pack_tasks_per_thread_of_each_target() -> None:
    # B12i: 256 buffers on 2 workers of 1 thread: 2 pack tasks, each one fetch round of
    # 128 small buffers, one request to each of the 2 groups' workers.
    model = pack_graph_size(32, 2, 256, partition_bytes=1 << 20, batched=True)
    assert model["pack"] == 2 and model["fetches"] == 2 * 2
    # 2 threads a worker: 2 pack tasks each; buffers of 800 MiB: one round per buffer, one
    # request to each of the 2 holders per round.
    model = pack_graph_size(64, 2, 8, threads=2, partition_bytes=100 << 20)
    assert model["pack"] == 4
    assert model["fetches"] == 8 * 2


def test_pack_graph_size_counts_batches_of_small_known_partitions() -> None:
    # B12e: 1,024 partitions of 32 KiB (32 MiB) on 2 workers of 1 thread: 8 prepare tasks.
    model = pack_graph_size(1024, 2, 2, partition_bytes=32 << 10, batched=True)
    assert model["prepare"] == 8 and model["stats"] == model["split"] == 2
    assert model["tasks"] == 8 + 2 * 2 + model["pack"] + model["catalog"]
    # Partitions of a table (sizes unknown): one task each, whatever their size.
    assert pack_graph_size(1024, 2, 2, partition_bytes=32 << 10)["prepare"] == 1024
    # Large partitions are never batched.
    big = pack_graph_size(100, 4, 4, partition_bytes=64 << 20, batched=True)
    assert big["prepare"] == 100


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float64])
def test_lay_out_group_gives_float32_from_any_source_dtype(dtype: type) -> None:
    # Enough rows per buffer for the block path (np.take into the output), which refused
    # to cast uint8 images (the feature cache's sources) into float32.
    sizes, seed = [200, 150], 3
    xs = [np.random.default_rng(p).integers(0, 255, size=(n, 2, 2)) for p, n in enumerate(sizes)]
    layout = plan_layout(sizes, ["w0", "w1"], None, 8, 1 << 20, seed)
    routes = plan_routes(layout.counts, [b.worker for b in layout.buffers], [[0, 1]])
    seeds = [partition_seed(seed, p) for p in (0, 1)]

    def laid(as_type: type) -> dict[str, np.ndarray]:
        prepared = [{"x": [x.astype(as_type)], "labels": np.zeros(len(x), int)} for x in xs]
        return lay_out_group(
            prepared, routes.group_counts[0], routes.starts[0], seeds, [0], 1, 255.0
        )

    got, want = laid(dtype), laid(np.float32)
    assert got["x_0"].dtype == np.float32
    np.testing.assert_array_equal(got["x_0"], want["x_0"])
