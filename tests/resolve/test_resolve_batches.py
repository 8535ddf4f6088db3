"""Batch gathering from local views: what each batch holds, and that it is copied once."""

from __future__ import annotations

import numpy as np
import pytest

from dvml.resolve.batches import BatchPlan
from dvml.resolve.partitions import ALIGNMENT, LocalPartitions, aligned_empty


def _parts(sizes: tuple[int, ...]) -> tuple[LocalPartitions, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    xs = [rng.random((n, 3, 2), dtype=np.float32) for n in sizes]
    ys = [np.eye(4, dtype=np.float32)[rng.integers(0, 4, n)] for n in sizes]
    for a in xs + ys:
        a.setflags(write=False)  # as views on vineyard's shared memory are
    parts = LocalPartitions("d", {}, 0, list(range(len(sizes))), {"x_0": xs, "y": ys})
    return parts, np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("sizes", [(17,), (5, 7, 4), (0, 9, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_epoch_is_a_permutation_in_sorted_per_buffer_pieces(
    sizes: tuple[int, ...], shuffle: bool
) -> None:
    parts, x, y = _parts(sizes)
    plan = BatchPlan(parts.buffer_rows, batch_size=4, steps=sum(sizes) // 4, seed=1)
    seen = []
    for pieces in plan.epoch(3, shuffle):
        assert [b for b, _ in pieces] == sorted({b for b, _ in pieces})
        assert all(len(idx) and (np.diff(idx) > 0).all() for _, idx in pieces)
        rows = np.concatenate([idx + plan.offsets[b] for b, idx in pieces])
        batch = parts.take(pieces)
        assert np.array_equal(batch["x_0"], x[rows]) and np.array_equal(batch["y"], y[rows])
        seen.extend(rows.tolist())
    assert len(seen) == len(set(seen)) == plan.steps * 4
    if not shuffle:
        assert seen == sorted(seen)


def test_take_gathers_once_into_an_aligned_writable_array() -> None:
    parts, _, _ = _parts((5, 7))
    batch = parts.take([(0, np.array([1, 3])), (1, np.array([0, 6]))])
    for field, array in batch.items():
        assert array.ctypes.data % ALIGNMENT == 0, field  # TensorFlow adopts it without a copy
        assert array.flags.c_contiguous and array.flags.writeable and array.flags.owndata is False
        assert not any(np.shares_memory(array, view) for view in parts.fields[field])
    assert batch["x_0"].shape == (4, 3, 2) and batch["y"].shape == (4, 4)


def test_aligned_empty() -> None:
    for shape in [(3, 5), (1, 2, 3)]:
        a = aligned_empty(shape, np.float64)
        assert a.shape == shape and a.dtype == np.float64 and a.ctypes.data % ALIGNMENT == 0
    assert aligned_empty((0, 4), np.float32).shape == (0, 4)  # no data: nothing to align


def test_the_metrics_pass_reads_larger_batches_only_where_they_are_small() -> None:
    from dvml.placement.metrics_batch import EVAL_BYTES, EVAL_SCALE, evaluation_batch

    assert evaluation_batch(256, 64) == 256 * EVAL_SCALE  # a table: 64 KiB a batch
    assert evaluation_batch(128, 32 * 32 * 3) == 128  # images: their training batch
    assert evaluation_batch(1, 10**9) == 1  # never below the training batch
    for batch, values in [(32, 100), (64, 1000), (3, 7)]:
        rows = evaluation_batch(batch, values)
        assert rows % batch == 0 and batch <= rows <= batch * EVAL_SCALE
        assert rows == batch or rows * values * 4 <= EVAL_BYTES
