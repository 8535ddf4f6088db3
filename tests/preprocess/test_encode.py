"""Pure encoders: class values, one-hot, x arrays, finiteness, normalizing_const."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dvml.exceptions import DataError
from dvml.preprocess.encode import (
    check_finite,
    class_indices,
    class_values_of,
    label_vartype,
    normalize,
    one_hot,
    overflow_limit,
    x_to_array,
)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ([3, 1, 2, 1], [1, 2, 3]),
        (np.array([3, 1, 2, 1], dtype=np.int8), [1, 2, 3]),
        (np.array([2.0, 0.0, 2.0]), [0, 2]),
        ([1, 2.0], [1, 2]),
        (["b", "a", "b"], ["a", "b"]),
        (np.array(["cat", "dog"]), ["cat", "dog"]),
        (pd.Series(["x", "y"], dtype="string"), ["x", "y"]),
        (pd.Series(["y", "x"], dtype="category"), ["x", "y"]),
        ([True, False, True], [False, True]),
        (np.array([True, True]), [True]),
        (pd.Series([5, 4], dtype="Int64"), [4, 5]),
        ([], []),
    ],
)
def test_class_values_of(labels: object, expected: list) -> None:
    values = class_values_of(labels)
    assert values == expected
    assert [type(v) for v in values] == [type(v) for v in expected]
    json.dumps(values)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ([1.5, 2.0], r"1 float labels that are not whole numbers, e.g. \[1.5\]"),
        (np.array([0.0, np.inf]), "not whole numbers"),
        ([1, "a"], r"mix value types.*\['int', 'str'\]"),
        ([True, 1], r"mix value types.*\['bool', 'int'\]"),
        ([b"a", b"b"], "bytes"),
    ],
)
def test_class_values_of_refuses(labels: object, match: str) -> None:
    with pytest.raises(DataError, match=match):
        class_values_of(labels)


@pytest.mark.parametrize(
    ("labels", "expected", "vartype"),
    [
        # MADlib keeps NULL as a class of its own, first in class_values ({NULL,a,b}).
        ([1, None, None], [None, 1], "int"),
        (np.array([1.0, np.nan, 0.0]), [None, 0, 1], "int"),
        (pd.Series(["b", None, "a"], dtype="string"), [None, "a", "b"], "str"),
        (pd.Series(["b", np.nan, "a", None], dtype=object), [None, "a", "b"], "str"),
        ([True, None, False], [None, False, True], "bool"),
        ([None, None], [None], "null"),
    ],
)
def test_class_values_of_null_is_a_class(labels: object, expected: list, vartype: str) -> None:
    values = class_values_of(labels)
    assert values == expected
    assert label_vartype(values) == vartype
    # NULL labels encode as the class None
    index = class_indices(labels, values)
    nulls = pd.isna(pd.Series(labels, dtype=object)).to_numpy()
    assert (index[nulls] == 0).all()
    assert (index[~nulls] > 0).all()
    assert one_hot(labels, values).sum() == len(index)


def test_label_vartype_of_arrays() -> None:
    assert label_vartype(None, "float32") == "float[]"
    assert label_vartype(None, "int64") == "int[]"


def test_class_values_of_refuses_2d() -> None:
    with pytest.raises(ValueError, match="1-D"):
        class_values_of(np.zeros((3, 2)))


@pytest.mark.parametrize(
    ("labels", "class_values", "num_classes", "expected"),
    [
        ([2, 0, 1], [0, 1, 2], None, [[0, 0, 1], [1, 0, 0], [0, 1, 0]]),
        (np.array([2, 0]), [0, 1, 2], 5, [[0, 0, 1, 0, 0], [1, 0, 0, 0, 0]]),
        (["dog", "cat"], ["cat", "dog"], None, [[0, 1], [1, 0]]),
        (np.array([1.0, 3.0]), [1, 3], None, [[1, 0], [0, 1]]),
        ([True, False], [False, True], None, [[0, 1], [1, 0]]),
        ([], [0, 1], None, np.zeros((0, 2))),
    ],
)
def test_one_hot(
    labels: object, class_values: list, num_classes: int | None, expected: object
) -> None:
    out = one_hot(labels, class_values, num_classes)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.asarray(expected, dtype=np.float32))


@pytest.mark.parametrize(
    ("labels", "class_values", "num_classes", "error", "match"),
    [
        ([0, 1], [0, 1, 2], 2, DataError, r"num_classes=2, 3 class values"),
        (
            [0, 7, 8, 7],
            [0, 1],
            None,
            DataError,
            r"2 unknown value\(s\) in 3 row\(s\), e.g. \[7, 8\]",
        ),
        (
            list(range(20)),
            [0],
            None,
            DataError,
            r"19 unknown value\(s\) in 19 row\(s\), e.g. \[1, 2, 3, 4, 5\]",
        ),
        (["3"], [3], None, DataError, "str labels, int class_values"),
        ([1, None], [1], None, DataError, r"not in class_values.*1 row\(s\), e.g. \[None\]"),
        ([0], [], None, ValueError, "class_values is empty"),
        ([0], [0, 0], None, ValueError, "distinct"),
        ([0], [0], 1.5, TypeError, "num_classes"),
    ],
)
def test_one_hot_refuses(
    labels: object,
    class_values: list,
    num_classes: object,
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        one_hot(labels, class_values, num_classes)  # type: ignore[arg-type]


FRAME = pd.DataFrame(
    {
        "a": [1, 2, 3],
        "b": np.array([0.5, 1.5, 2.5], dtype=np.float32),
        "c": np.array([1, 0, 1], dtype=np.uint8),
        "big": np.array([1, 2, 3], dtype=np.int64),
        "flag": [True, False, True],
        "nullable": pd.Series([1, None, 3], dtype="Int64"),
        "text": ["x", "y", "z"],
        "img": [np.full((2, 2), i, dtype=np.uint8) for i in range(3)],
        "vec": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
        "ragged": [np.zeros(64), np.zeros(63), np.zeros(64)],
        "words": [np.array(["a"]), np.array(["b"]), np.array(["c"])],
        "holes": [np.zeros(2), None, np.zeros(2)],
    }
)


@pytest.mark.parametrize(
    ("cols", "shape", "dtype"),
    [
        (["a"], (3, 1), np.float64),
        (["b", "c"], (3, 2), np.float32),
        (["b", "big"], (3, 2), np.float64),
        (["flag"], (3, 1), np.float32),
        ("b", (3, 1), np.float32),
        (["img"], (3, 2, 2), np.uint8),
        (["vec"], (3, 2), np.float64),
    ],
)
def test_x_to_array(cols: list[str], shape: tuple, dtype: type) -> None:
    x = x_to_array(FRAME, cols)
    assert x.shape == shape
    assert x.dtype == dtype


def test_x_to_array_values() -> None:
    np.testing.assert_array_equal(x_to_array(FRAME, ["a", "c"]), [[1, 1], [2, 0], [3, 1]])
    np.testing.assert_array_equal(x_to_array(FRAME, ["img"])[2], np.full((2, 2), 2))
    nullable = x_to_array(FRAME, ["nullable"])
    assert np.isnan(nullable[1, 0]) and nullable[2, 0] == 3


@pytest.mark.parametrize(
    ("cols", "error", "match"),
    [
        (["nope", "a"], DataError, r"missing \['nope'\]; available columns \['a', 'b'"),
        (["text"], DataError, r"'text' is not numeric. Received: dtype object"),
        (["ragged"], DataError, r"rows have shapes \(64,\) and \(63,\)"),
        (["words"], DataError, "non-numeric arrays"),
        (["holes"], DataError, "1 rows without an array"),
        (["img", "a"], DataError, r"only column.*\['img'\]"),
        ([], ValueError, "x_cols is empty"),
    ],
)
def test_x_to_array_refuses(cols: list[str], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        x_to_array(FRAME, cols)


def test_x_to_array_empty_partition() -> None:
    empty = FRAME.iloc[:0]
    assert x_to_array(empty, ["a", "b"]).shape == (0, 2)
    assert x_to_array(empty, ["img"]).shape[0] == 0


@pytest.mark.parametrize(
    ("x", "valid"),
    [
        (np.array([[1.0, 2.0], [np.nan, 0.0], [np.inf, 1.0]]), [True, False, False]),
        (np.array([1.0, -np.inf, 3.0], dtype=np.float32), [True, False, True]),
        (np.ones((2, 3, 3)), [True, True]),
        (np.array([[1, 2]], dtype=np.int64), [True]),
        (np.zeros((0, 4)), []),
    ],
)
def test_check_finite_drop(x: np.ndarray, valid: list[bool]) -> None:
    mask = check_finite(x, "x", on_invalid="drop")
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, valid)
    if all(valid):
        np.testing.assert_array_equal(check_finite(x, "x"), valid)


def test_check_finite_raise_counts() -> None:
    x = np.array([[np.nan, np.nan], [np.inf, 0.0], [1.0, 1.0], [-np.inf, np.nan]])
    with pytest.raises(DataError, match=r"'pixels'.*3 of 4 rows.*\(3 NaN, 2 inf values\)"):
        check_finite(x, "pixels")


def test_check_finite_refuses_bad_mode() -> None:
    with pytest.raises(ValueError, match="on_invalid"):
        check_finite(np.ones(2), "x", on_invalid="skip")


@pytest.mark.parametrize(
    ("x", "const", "expected"),
    [
        (np.array([0, 255], dtype=np.uint8), 255.0, [0.0, 1.0]),
        (np.array([[2.0, 4.0]]), 2, [[1.0, 2.0]]),
        (np.array([1, 2], dtype=np.int64), np.float64(1.0), [1.0, 2.0]),
    ],
)
def test_normalize(x: np.ndarray, const: float, expected: list) -> None:
    before = x.copy()
    out = normalize(x, const)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize(
    ("const", "error"),
    [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
     ("255", TypeError), (True, TypeError), (1e-300, ValueError), (1e300, ValueError)],
)  # fmt: skip
def test_normalize_refuses(const: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="normalizing_const"):
        normalize(np.ones(2), const)  # type: ignore[arg-type]


def test_normalize_refuses_text() -> None:
    with pytest.raises(TypeError, match="numeric"):
        normalize(np.array(["a"]), 1.0)


@pytest.mark.parametrize(
    ("dtype", "const", "limit"),
    [(np.float32, 1.0, None), (np.uint8, 1e-30, None), (np.float16, 255.0, None),
     (np.float64, 1.0, float(np.finfo(np.float32).max)),
     (np.float32, 0.5, float(np.finfo(np.float32).max) * 0.5),
     (np.int64, 1e-20, float(np.finfo(np.float32).max) * 1e-20)],
)  # fmt: skip
def test_overflow_limit(dtype: type, const: float, limit: float | None) -> None:
    assert overflow_limit(dtype, const) == limit


def test_values_beyond_float32_are_not_finite() -> None:
    # Finite as float64, inf once stored as float32 (or once divided by a tiny constant).
    x = np.array([[1.0, 2.0], [1e300, 0.0], [1e30, 0.0], [-1e39, 0.0]])
    np.testing.assert_array_equal(check_finite(x, "x", "drop"), [True, False, True, False])
    np.testing.assert_array_equal(
        check_finite(x, "x", "drop", normalizing_const=1e-10), [True, False, False, False]
    )
    with pytest.raises(DataError, match=r"2 of 4 rows .*0 NaN, 2 inf"):
        check_finite(x, "x")
    assert np.isfinite(normalize(x[[0, 2]], 1.0)).all()
