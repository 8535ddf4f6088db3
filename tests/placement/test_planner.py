"""The buffers → workers planner: balance, margins, determinism, validation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dvml.exceptions import DataError, PlacementError
from dvml.placement.planner import (
    BufferPlan,
    Layout,
    default_buffer_size,
    partition_seed,
    plan_layout,
    plan_pieces,
    split_partition,
)

TARGETS = ["tcp://a:1", "tcp://a:2", "tcp://b:1", "tcp://b:2"]
BIG = 1 << 30


@pytest.mark.parametrize(
    ("n_rows", "n_targets", "row_bytes", "max_bytes", "expected"),
    [
        (100, 4, 8, BIG, 25),
        (101, 4, 8, BIG, 26),
        (3, 4, 8, BIG, 1),
        (0, 4, 8, BIG, 1),
        (1000, 2, 100, 10_000, 100),  # capped by the byte budget
        (1000, 2, 100, 50, 1),  # a row larger than the budget still gets a buffer of 1
        (10, 1, 1, 10, 10),
    ],
)
def test_default_buffer_size(
    n_rows: int, n_targets: int, row_bytes: int, max_bytes: int, expected: int
) -> None:
    assert default_buffer_size(n_rows, n_targets, row_bytes, max_bytes) == expected


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((10, 0, 8, 64), ValueError),
        ((-1, 2, 8, 64), ValueError),
        ((10, 2, 0, 64), ValueError),
        ((10, 2, 8, 0), ValueError),
        ((10.0, 2, 8, 64), TypeError),
        ((10, True, 8, 64), TypeError),
    ],
)
def test_default_buffer_size_refuses(args: tuple, error: type[Exception]) -> None:
    with pytest.raises(error):
        default_buffer_size(*args)


LAYOUT_CASES = [
    # (partition_rows, n_targets, buffer_size)
    ([100], 1, None),
    ([100], 4, None),
    ([10, 20, 30, 40], 4, 7),
    ([10, 20, 30, 41], 4, 7),
    ([1, 0, 0, 3], 4, 1),
    ([0, 0, 5], 2, None),
    ([333, 1, 0, 12, 999, 50], 3, 64),
    ([5] * 40, 4, 3),
    ([1000, 1000], 2, 1000),
    ([1000, 1000], 2, 5000),
    ([17], 4, 2),
    ([123, 456, 789], 4, 1),
]
SEEDS = [0, 1, 12345]


def _check_invariants(layout: Layout, partition_rows: list[int], targets: list[str]) -> None:
    n_rows, n_targets = sum(partition_rows), len(targets)
    counts = layout.counts
    assert counts.shape == (len(partition_rows), len(layout.buffers))
    assert counts.dtype == np.int64
    assert (counts >= 0).all()
    # row sums: every row of every partition goes somewhere
    np.testing.assert_array_equal(counts.sum(axis=1), partition_rows)
    # column sums: every buffer gets exactly its rows
    np.testing.assert_array_equal(counts.sum(axis=0), [b.rows for b in layout.buffers])
    # balance within one row, in target order
    assert list(layout.rows_per_worker) == targets
    per_worker = list(layout.rows_per_worker.values())
    assert sum(per_worker) == n_rows
    assert max(per_worker) - min(per_worker) <= 1
    assert set(per_worker) <= {n_rows // n_targets, math.ceil(n_rows / n_targets)}
    # buffers: indexed in order, grouped by target, at most buffer_size, only the last smaller
    assert [b.index for b in layout.buffers] == list(range(len(layout.buffers)))
    assert [b.worker for b in layout.buffers] == sorted(
        (b.worker for b in layout.buffers), key=targets.index
    )
    for target in targets:
        sizes = [b.rows for b in layout.buffers_of(target)]
        assert sum(sizes) == layout.rows_per_worker[target]
        assert all(0 < s <= layout.buffer_size for s in sizes)
        assert all(s == layout.buffer_size for s in sizes[:-1])
        assert math.ceil(layout.rows_per_worker[target] / layout.buffer_size) == len(sizes)
    assert layout.n_buffers == len(layout.buffers)
    assert layout.n_partitions == len(partition_rows)


@pytest.mark.parametrize(("partition_rows", "n_targets", "buffer_size"), LAYOUT_CASES)
def test_plan_layout_invariants(
    partition_rows: list[int], n_targets: int, buffer_size: int | None
) -> None:
    targets = TARGETS[:n_targets]
    for seed in SEEDS:
        layout = plan_layout(partition_rows, targets, buffer_size, 8, BIG, seed)
        _check_invariants(layout, partition_rows, targets)
        if buffer_size is not None:
            assert layout.buffer_size == min(buffer_size, max(layout.rows_per_worker.values()))
        again = plan_layout(partition_rows, targets, buffer_size, 8, BIG, seed)
        np.testing.assert_array_equal(again.counts, layout.counts)
        assert again.buffers == layout.buffers
        assert again.rows_per_worker == layout.rows_per_worker


@pytest.mark.parametrize(
    ("partition_rows", "n_targets", "buffer_size"),
    [
        ([100, 200, 300], 4, 20),
        ([600, 400], 2, 100),
        ([50] * 20, 3, None),
    ],
)
def test_another_seed_gives_another_layout(
    partition_rows: list[int], n_targets: int, buffer_size: int | None
) -> None:
    targets = TARGETS[:n_targets]
    a = plan_layout(partition_rows, targets, buffer_size, 8, BIG, 0)
    b = plan_layout(partition_rows, targets, buffer_size, 8, BIG, 1)
    assert a.buffers == b.buffers  # the shape of the plan does not depend on the seed
    assert not np.array_equal(a.counts, b.counts)


def test_one_partition_needs_no_draw() -> None:
    layout = plan_layout([1000], TARGETS[:2], 100, 8, BIG, 3)
    np.testing.assert_array_equal(layout.counts, [[100] * 10])


def test_rows_of_a_partition_spread_over_all_buffers() -> None:
    layout = plan_layout([10_000, 10_000], TARGETS, 1000, 8, BIG, 7)
    assert layout.n_buffers == 20
    # each buffer of 1000 rows draws about half from each partition
    share = layout.counts[0] / np.array([b.rows for b in layout.buffers])
    assert (share > 0.35).all() and (share < 0.65).all()


def test_default_buffer_size_is_used_and_capped() -> None:
    layout = plan_layout([1000], TARGETS[:2], None, 100, 10_000, 0)
    assert layout.buffer_size == 100
    assert layout.n_buffers == 10
    uncapped = plan_layout([1000], TARGETS[:2], None, 100, BIG, 0)
    assert [b.rows for b in uncapped.buffers] == [500, 500]


def test_layout_counts_are_read_only() -> None:
    layout = plan_layout([10], TARGETS[:2], None, 8, BIG, 0)
    with pytest.raises(ValueError):
        layout.counts[0, 0] = 3
    assert layout.buffers[0] == BufferPlan(0, TARGETS[0], 5)


@pytest.mark.parametrize(
    ("partition_rows", "targets", "buffer_size", "error", "match"),
    [
        ([10], TARGETS, 0, ValueError, "buffer_size=0"),
        ([10], TARGETS, -3, ValueError, "buffer_size=-3"),
        ([10], TARGETS, 2.5, TypeError, "buffer_size=2.5"),
        ([], TARGETS, None, DataError, "empty input"),
        ([0, 0], TARGETS, None, DataError, "empty input"),
        ([1, 2], TARGETS, None, DataError, r"0 rows.*3 rows for 4 workers.*fewer workers"),
        ([10, -1], TARGETS, None, ValueError, "partition 1 has -1 rows"),
        ([10, 2.0], TARGETS, None, TypeError, "partition 1"),
        ([10], [], None, PlacementError, "at least one target"),
        ([10], ["tcp://a:1", "tcp://a:1"], None, ValueError, "unique"),
        ([10**9], TARGETS, None, DataError, "at most"),
    ],
)
def test_plan_layout_refuses(
    partition_rows: list,
    targets: list[str],
    buffer_size: object,
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        plan_layout(partition_rows, targets, buffer_size, 8, BIG, 0)  # type: ignore[arg-type]


def test_plan_layout_refuses_negative_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        plan_layout([10], TARGETS, None, 8, BIG, -1)


def test_numpy_ints_are_accepted() -> None:
    rows = np.array([5, 7])
    layout = plan_layout(rows, TARGETS[:2], np.int64(4), 8, BIG, np.int64(3))  # type: ignore[arg-type]
    _check_invariants(layout, [5, 7], TARGETS[:2])


@pytest.mark.parametrize(
    ("n_rows", "counts_row"),
    [(10, [3, 0, 7]), (0, [0, 0]), (5, [5]), (100, [25, 25, 25, 25]), (1, [0, 1, 0])],
)
def test_split_partition(n_rows: int, counts_row: list[int]) -> None:
    for seed in SEEDS:
        pieces = split_partition(n_rows, np.array(counts_row), seed)
        assert [len(p) for p in pieces] == counts_row
        joined = np.concatenate(pieces) if pieces else np.array([], dtype=np.int64)
        np.testing.assert_array_equal(np.sort(joined), np.arange(n_rows))
        again = split_partition(n_rows, np.array(counts_row), seed)
        assert all(np.array_equal(a, b) for a, b in zip(pieces, again, strict=True))


def test_split_partition_depends_on_seed() -> None:
    a = split_partition(1000, np.array([500, 500]), partition_seed(0, 0))
    b = split_partition(1000, np.array([500, 500]), partition_seed(0, 1))
    assert not np.array_equal(a[0], b[0])


def test_split_partition_of_a_planned_layout() -> None:
    partition_rows = [40, 25, 35]
    layout = plan_layout(partition_rows, TARGETS[:2], 16, 8, BIG, 5)
    received = np.zeros(layout.n_buffers, dtype=np.int64)
    for p, n in enumerate(partition_rows):
        pieces = split_partition(n, layout.counts[p], partition_seed(5, p))
        assert len(pieces) == layout.n_buffers
        received += [len(piece) for piece in pieces]
    np.testing.assert_array_equal(received, [b.rows for b in layout.buffers])


@pytest.mark.parametrize(
    ("n_rows", "counts_row", "error", "match"),
    [
        (10, [3, 3], ValueError, "sum to n_rows"),
        (3, [4, -1], ValueError, "negative"),
        (3, [[1, 2]], ValueError, "1-D"),
        (3, [1.5, 1.5], ValueError, "integer"),
        (-1, [0], ValueError, "n_rows"),
    ],
)
def test_split_partition_refuses(
    n_rows: int, counts_row: list, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        split_partition(n_rows, np.array(counts_row), 0)


def test_partition_seed() -> None:
    seeds = {partition_seed(7, p) for p in range(100)}
    assert len(seeds) == 100
    assert partition_seed(7, 3) == partition_seed(7, 3)
    assert partition_seed(7, 3) != partition_seed(8, 3)
    with pytest.raises(ValueError):
        partition_seed(7, -1)


@pytest.mark.parametrize(
    "buffer_targets",
    [
        ["w0", "w0", "w1", "w1", "w1"],  # grouped, as plan_layout orders buffers
        ["w1", "w0", "w1", "w0", "w1"],  # interleaved
        ["w0", "w0", "w0", "w0", "w0"],  # one target
    ],
)
def test_plan_pieces_gives_each_target_one_contiguous_piece(buffer_targets: list[str]) -> None:
    counts = np.array([[3, 0, 2, 5, 1], [0, 0, 0, 0, 4], [2, 2, 2, 2, 2]], dtype=np.int64)
    plan = plan_pieces(counts, buffer_targets)
    assert list(plan.targets) == list(dict.fromkeys(buffer_targets))
    assert sorted(plan.order.tolist()) == list(range(5))
    np.testing.assert_array_equal(plan.ordered_counts, counts[:, plan.order])
    for p in range(len(counts)):
        # The pieces tile the laid-out rows of the partition, target after target.
        bounds = plan.piece_ranges[p]
        assert bounds[0, 0] == 0 and bounds[-1, 1] == counts[p].sum()
        np.testing.assert_array_equal(bounds[1:, 0], bounds[:-1, 1])
        for b, target in enumerate(buffer_targets):
            t = plan.targets.index(target)
            assert plan.target_of[b] == t
            start, stop = plan.buffer_ranges[p, b]
            assert stop - start == counts[p, b]
        # The buffers of a target tile its piece: disjoint, in `order`, no gap.
        for t in range(len(plan.targets)):
            members = [b for b in plan.order if plan.target_of[b] == t]
            ranges = [tuple(plan.buffer_ranges[p, b]) for b in members]
            assert ranges[0][0] == 0 and ranges[-1][1] == bounds[t, 1] - bounds[t, 0]
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


@pytest.mark.parametrize("interleave", [False, True])
def test_plan_pieces_rows_reach_their_buffers(interleave: bool) -> None:
    """Lay a partition out as the split task does, cut pieces and buffers: every row once."""
    layout = plan_layout([40, 25, 35], TARGETS[:3], 9, 8, BIG, 5)
    targets = [b.worker for b in layout.buffers]
    if interleave:  # buffers of one target need not be neighbours
        targets = targets[1::2] + targets[::2]
    plan = plan_pieces(layout.counts, targets)
    received: dict[int, list[int]] = {b: [] for b in range(layout.n_buffers)}
    offset = 0
    for p, n in enumerate([40, 25, 35]):
        rows = np.arange(offset, offset + n)
        offset += n
        perm = np.concatenate(split_partition(n, plan.ordered_counts[p], partition_seed(5, p)))
        laid_out = rows[perm]
        for b in range(layout.n_buffers):
            t = plan.target_of[b]
            piece = laid_out[slice(*plan.piece_ranges[p, t])]
            received[b].extend(piece[slice(*plan.buffer_ranges[p, b])].tolist())
    assert sorted(r for rows in received.values() for r in rows) == list(range(100))
    assert [len(received[b]) for b in range(layout.n_buffers)] == [b.rows for b in layout.buffers]


@pytest.mark.parametrize(
    ("counts", "targets", "match"),
    [
        (np.zeros((2, 3), dtype=np.int64), ["a", "b"], "one target per buffer"),
        (np.zeros(3, dtype=np.int64), ["a", "b", "c"], "2-D"),
        (np.zeros((1, 2)), ["a", "b"], "integer"),
    ],
)
def test_plan_pieces_refuses(counts: np.ndarray, targets: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_pieces(counts, targets)
