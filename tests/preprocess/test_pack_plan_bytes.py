"""The row bytes the pack plan counts (pure): the float32 layout, and compact when it applies."""

from __future__ import annotations

from dvml.preprocess.api import _all_row_bytes, _compact_row_bytes

DIGITS_STATS = [{"rows": 10, "x_dtypes": ["uint8"]}, {"rows": 0, "x_dtypes": []}]
TEN_CLASSES = [(list(range(10)), 10, None)]


def test_digits_row_bytes_match_benchmark_b17() -> None:
    # B17 (docs/benchmarks.md): digits take 296 bytes a row as float32, 65 compact.
    assert _all_row_bytes([[8, 8]], TEN_CLASSES, None) == 296
    assert _compact_row_bytes(DIGITS_STATS, [[8, 8]], TEN_CLASSES) == 65


def test_compact_is_not_offered_for_float_data() -> None:
    stats = [{"rows": 10, "x_dtypes": ["float64"]}]
    assert _compact_row_bytes(stats, [[8, 8]], TEN_CLASSES) is None
