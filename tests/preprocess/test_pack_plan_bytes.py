"""The row bytes the pack plan counts (pure): the float32 layout, and compact when it applies."""

from __future__ import annotations

from dvml.preprocess.row_format import all_row_bytes, compact_row_bytes

DIGITS_STATS = [{"rows": 10, "x_dtypes": ["uint8"]}, {"rows": 0, "x_dtypes": []}]
TEN_CLASSES = [(list(range(10)), 10, None)]


def test_digits_row_bytes_match_benchmark_b17() -> None:
    # B17 (docs/benchmarks.md): digits take 296 bytes a row as float32, 65 compact.
    assert all_row_bytes([[8, 8]], TEN_CLASSES, None) == 296
    assert compact_row_bytes(DIGITS_STATS, [[8, 8]], TEN_CLASSES) == 65


def test_compact_is_not_offered_for_float_data() -> None:
    stats = [{"rows": 10, "x_dtypes": ["float64"]}]
    assert compact_row_bytes(stats, [[8, 8]], TEN_CLASSES) is None


def test_known_x_bytes_bound_a_pack_from_shapes_alone() -> None:
    import dask.array as da
    import numpy as np

    from dvml.preprocess.admission import known_x_bytes

    images = da.zeros((100, 8, 8, 1), dtype="uint8", chunks=10)
    labels = np.zeros(100, dtype="int64")
    source = {"image": images, "meta": np.zeros((100, 3)), "label": labels}
    assert known_x_bytes(source, "image", compact=False) == (100, 64 * 4)  # stored as float32
    assert known_x_bytes(source, "image", compact=True) == (100, 64)  # uint8 stays uint8
    assert known_x_bytes(source, ["image", "meta"], compact=True) == (100, 64 + 12)
    # unknown: a row count Dask cannot tell, text, a DataFrame, no x, rows that disagree
    kept = images[images[:, 0, 0, 0] >= 0]
    assert known_x_bytes({"image": kept, "label": labels}, "image", compact=False) is None
    assert known_x_bytes({"path": np.array(["a", "b"])}, "path", compact=False) is None
    assert known_x_bytes(object(), "image", compact=False) is None
    assert known_x_bytes(source, None, compact=False) is None
    short = {"image": images, "meta": np.zeros((99, 3))}
    assert known_x_bytes(short, ["image", "meta"], compact=False) is None
