"""The feature cache's memory plan (dvml.placement.feature_memory): pure, table-driven."""

from __future__ import annotations

import pytest

from dvml.exceptions import ArgumentError
from dvml.placement.feature_memory import (
    BackboneSize,
    FeatureTarget,
    plan_features,
)
from dvml.placement.fit_memory import HostRoom
from dvml.placement.memory import VineyarddRoom

MiB = 2**20
GiB = 2**30
# 16 features per row from 32x32x3 images, 10 classes, 1392 parameters
TINY = BackboneSize(params=1392, activations_per_row=14776, input_values=3072,
                    feature_values=16, label_values=10)  # fmt: skip
RUNTIME = 600 * MiB


def _targets(tf_imported: bool = False) -> list[FeatureTarget]:
    return [
        FeatureTarget("worker-0", "host-0", 0, (600, 400), tf_imported),
        FeatureTarget("worker-1", "host-1", 1, (1000,), tf_imported),
    ]


def _plan(vineyard: int = 256 * MiB, host: int = 8 * GiB, **kwargs: object) -> object:
    targets = kwargs.pop("targets", None) or _targets()
    rooms = [VineyarddRoom(0, vineyard, 0), VineyarddRoom(1, vineyard, 0)]
    hosts = [HostRoom("host-0", host), HostRoom("host-1", host)]
    return plan_features(targets, TINY, kwargs.pop("batch_size", 64), rooms, hosts,
                         runtime=RUNTIME, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def test_shared_memory_is_rows_times_features_and_labels_float32() -> None:
    plan = _plan()
    assert plan.fits and plan.fixes == ()
    assert plan.row_bytes == 4 * (16 + 10)
    assert [r.needed for r in plan.vineyardds] == [1000 * 104, 1000 * 104]
    assert plan.shared == 2000 * 104


def test_resident_growth_by_part() -> None:
    w0, w1 = _plan().workers
    assert w0.runtime == RUNTIME
    assert w0.weights == 2 * 4 * 1392  # the model's variables and the shipped spec
    assert w0.batch == 64 and w0.batches == 64 * 4 * (3072 + 14776)
    assert w0.buffer == 600 * 4 * 16 and w1.buffer == 1000 * 4 * 16  # the largest buffer
    assert w0.resident == w0.runtime + w0.weights + w0.batches + w0.buffer


def test_a_worker_with_tensorflow_imported_counts_no_runtime() -> None:
    plan = _plan(targets=_targets(tf_imported=True))
    assert all(w.runtime == 0 for w in plan.workers)
    assert any("imported TensorFlow already" in n for n in plan.notes)


def test_compact_source_converts_batches_and_labels_in_the_worker() -> None:
    w0 = _plan(compact=True).workers[0]
    assert w0.batches == 64 * 4 * (2 * 3072 + 14776)
    assert w0.buffer == 600 * 4 * (16 + 10)


def test_a_batch_is_capped_by_the_largest_buffer() -> None:
    w0 = _plan(batch_size=5000).workers[0]
    assert w0.batch == 600


def test_a_small_vineyard_is_refused_with_its_fixes() -> None:
    plan = _plan(vineyard=100_000, pooled_values=8)
    assert not plan.fits
    assert all(not r.fits for r in plan.vineyardds)
    assert any("vineyard_memory: at least 1.0 MiB" in f for f in plan.fixes)
    assert any("pooling='avg'" in f for f in plan.fixes)
    assert any("smaller batch_size does not help shared memory" in f for f in plan.fixes)
    assert "short by" in plan.describe()


def test_a_host_too_small_offers_a_smaller_batch() -> None:
    # room for the runtime and about 100 rows of a batch per worker, with the 20% margin
    per_row = 4 * (3072 + 14776)
    host = int((RUNTIME + 2 * 4 * 1392 + 1000 * 64 + 100 * per_row) * 1.2)
    plan = _plan(host=host, batch_size=512)
    assert not plan.fits and all(r.fits for r in plan.vineyardds)
    batch_fix = next(f for f in plan.fixes if "a smaller batch_size: at most" in f)
    assert 90 <= int(batch_fix.split("at most ")[1].split()[0]) <= 100


def test_a_host_without_room_for_tensorflow_says_a_batch_does_not_help() -> None:
    plan = _plan(host=300 * MiB)
    assert not plan.fits
    assert any("does not help: TensorFlow" in f for f in plan.fixes)


def test_table_has_a_row_per_worker() -> None:
    table = _plan().table()
    assert list(table["worker"]) == ["worker-0", "worker-1"]
    assert list(table["features"]) == [104_000, 104_000]
    assert table["fits"].all()


def test_a_raw_source_counts_its_packed_bytes_first() -> None:
    targets = [FeatureTarget("worker-0", "host-0", 0, (1000,), source_bytes=50 * MiB)]
    plan = plan_features(targets, TINY, 64, [VineyarddRoom(0, 50 * MiB, 0)],
                         [HostRoom("host-0", 8 * GiB)])  # fmt: skip
    assert not plan.fits and plan.vineyardds[0].needed == 50 * MiB + 104_000


def test_missing_rooms_are_an_argument_error() -> None:
    with pytest.raises(ArgumentError, match="missing rooms"):
        plan_features(_targets(), TINY, 64, [VineyarddRoom(0, MiB, 0)], [])
