"""The prepare step fused with the source's tasks, small partitions batched (issue 17)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from dvml.exceptions import ArgumentError
from dvml.placement.routes import BATCH_BYTES, batch_sizes
from dvml.preprocess.fusion import exclusive_ancestors
from dvml.preprocess.sources import source_parts
from dvml.preprocess.tasks import prepare_arrays


def test_exclusive_ancestors_leave_shared_and_unneeded_keys_alone() -> None:
    # a1 -> a2 -> out0 ; b1 -> out1 ; shared -> a2 and out1 ; unused -> nothing ; out1 also
    # needs "external", a key outside the graph (a future).
    deps = {
        "a1": [],
        "a2": ["a1", "shared"],
        "b1": [],
        "shared": [],
        "unused": [],
        "out0": ["a2"],
        "out1": ["b1", "shared", "external"],
    }
    found = exclusive_ancestors(deps, ["out0", "out1"])
    assert found == [["a1", "a2"], ["b1"]]


def test_exclusive_ancestors_order_dependencies_first() -> None:
    deps = {"r": [], "m1": ["r"], "m2": ["r", "m1"], "out": ["m2", "m1"]}
    assert exclusive_ancestors(deps, ["out"]) == [["r", "m1", "m2"]]


def test_batch_sizes_by_bytes_and_threads() -> None:
    # 512 blocks of 64 KiB (32 MiB) on 2 threads: 4 tasks per thread of 4 MiB each.
    assert batch_sizes([64 << 10] * 512, 512, 2) == [64] * 8
    # Large blocks are never merged, and never cut.
    assert batch_sizes([BATCH_BYTES * 2] * 3, 3, 1) == [1, 1, 1]
    # Many threads do not make more tasks than blocks; at most BATCH_BYTES per task.
    assert batch_sizes([1] * 5, 5, 64) == [1] * 5
    sizes = batch_sizes([1 << 20] * 1000, 1000, 1)
    assert sum(sizes) == 1000 and max(sizes) == BATCH_BYTES >> 20
    # Unknown sizes: one block per task.
    assert batch_sizes(None, 3, 2) == [1, 1, 1]
    with pytest.raises(ArgumentError, match="one entry per block"):
        batch_sizes([1, 2], 3, 1)


@pytest.mark.parametrize("x_rows", [16, 48])
def test_small_array_blocks_prepare_in_few_fused_tasks(x_rows: int) -> None:
    rng = np.random.default_rng(5)
    x_np, y_np = rng.random((2048, 4)), rng.integers(0, 3, size=2048)
    x, y = da.from_array(x_np, chunks=(x_rows, 4)), da.from_array(y_np, chunks=16)
    src = source_parts({"x": x, "y": y}, "y", "x", 2, "raise", None, 3, threads=2)
    batches = dask.compute(*src.parts, scheduler="sync")
    assert [len(b) for b in batches] == [16] * 8  # 128 blocks, 4 tasks per thread
    # Every partition is still its own prepared part (y's blocks, in order).
    parts = [p for batch in batches for p in batch]
    for i, part in enumerate(parts):
        rows = slice(16 * i, 16 * (i + 1))
        want = prepare_arrays([x_np[rows]], y_np[rows], ["x"], "y", "raise")
        np.testing.assert_array_equal(part["x"][0], want["x"][0])
        np.testing.assert_array_equal(part["labels"], want["labels"])
    # The graph: one task per batch. Where x's chunks do not line up with y's (x is
    # rechunked to them), a block of x that two batches read stays a task of its own: one at
    # most per boundary between batches.
    graph = dict(src.parts[0].dask)
    batch_keys = {p.key for p in src.parts}
    shared = set(graph) - batch_keys
    assert batch_keys <= set(graph)
    assert len(shared) == 0 if x_rows == 16 else 1 <= len(shared) <= 7
