"""Encoders for one partition: class values, one-hot labels, x arrays, finiteness, scaling.

Plain values in, plain values out (numpy and pandas only), so the partition tasks of the
preprocessing graph stay thin and these rules are tested without a cluster.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError

__all__ = [
    "check_finite",
    "check_normalizing_const",
    "class_indices",
    "class_values_of",
    "index_dtype",
    "label_vartype",
    "normalize",
    "one_hot",
    "overflow_limit",
    "stack_label_cells",
    "x_to_array",
]

_MAX_SHOWN = 5


def _as_series(labels: Any, name: str = "labels") -> pd.Series:
    if isinstance(labels, pd.Series):
        return labels
    if isinstance(labels, str | bytes) or np.ndim(labels) != 1:
        raise DataError(
            f"{name} must be 1-D (one label per row). Received: {type(labels).__name__} with "
            f"shape {np.shape(labels)}. Pass a list, 1-D array or pandas Series."
        )
    return pd.Series(labels, dtype=None if isinstance(labels, np.ndarray) else object)


def _kind_of(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, int | np.integer):
        return "int"
    if isinstance(value, float | np.floating):
        return "float"
    if isinstance(value, str):
        return "str"
    return type(value).__name__


def _null_mask(series: pd.Series) -> np.ndarray:
    """Which cells are NULL (None or NaN): MADlib keeps NULL as a class of its own."""
    return np.asarray(series.isna(), dtype=bool)


def _python_values(series: pd.Series, name: str) -> tuple[list[Any], str | None]:
    """The distinct non-NULL values of ``series`` as Python scalars, and their kind
    (bool/int/str; None when every cell is NULL). NULL cells are left out here: the callers
    decide what a NULL label means (:func:`class_values_of` makes it a class)."""
    nulls = _null_mask(series)
    if nulls.any():
        series = series[~nulls]
        if series.dtype == object and len(series):
            # An int or bool column with NULLs comes as object (or float) cells.
            series = pd.Series(series.tolist())
    if len(series) == 0:
        return [], None
    if isinstance(series.dtype, pd.CategoricalDtype):
        series = series.astype(object)
    if pd.api.types.is_bool_dtype(series.dtype):
        kinds = {"bool"}
    elif pd.api.types.is_integer_dtype(series.dtype):
        kinds = {"int"}
    elif pd.api.types.is_float_dtype(series.dtype):
        kinds = {"float"}
    else:
        kinds = {_kind_of(v) for v in series.to_numpy(dtype=object)}
    if "float" in kinds and kinds <= {"float", "int"}:
        values = series.to_numpy(dtype=np.float64)
        fractional = values[~np.isfinite(values) | (values != np.round(values))]
        if fractional.size:
            shown = [float(v) for v in pd.unique(fractional)[:_MAX_SHOWN]]
            raise DataError(
                f"{name} must be class values (int, str or bool), not measurements. Received: "
                f"{fractional.size} float labels that are not whole numbers, e.g. {shown}. "
                f"Bin or round them, or train a regression model instead."
            )
        return sorted({int(v) for v in pd.unique(values)}), "int"
    if len(kinds) > 1:
        raise DataError(
            f"{name} mix value types. Received: types {sorted(kinds)}. Convert the labels to "
            f"one type (for example all str) first."
        )
    kind = next(iter(kinds))
    if kind not in ("bool", "int", "str"):
        hint = (
            " A column of arrays is a label already one-hot encoded: pass it as the y column"
            if kind in ("ndarray", "list", "tuple")
            else ""
        )
        raise DataError(
            f"{name} must be int, str or bool. Received: values of type {kind}. Convert them.{hint}"
        )
    uniques = [v.item() if isinstance(v, np.generic) else v for v in pd.unique(series)]
    if kind == "str":
        uniques = [str(v) for v in uniques]
    return sorted(set(uniques)), kind


def class_values_of(labels: Any) -> list[Any]:
    """The sorted distinct class values of ``labels`` (MADlib's ``class_values``).

    Parameters
    ----------
    labels : array-like, 1-D
        int, str or bool labels; floats are accepted when they are whole numbers. None and NaN
        are NULL labels: as in MADlib, NULL is a class of its own, first in the list (MADlib
        sorts its distinct levels with NULL first: ``{NULL,a,b}``).

    Returns
    -------
    list
        Python scalars (int, str or bool, and None for NULL), so the list is JSON-able.

    Raises
    ------
    DataError
        For fractional floats, or mixed types.
    """
    series = _as_series(labels)
    values, _ = _python_values(series, "labels")
    return [None, *values] if _null_mask(series).any() else values


def label_vartype(class_values: Sequence[Any] | None, array_dtype: str | None = None) -> str:
    """The summary's ``dependent_vartype``: the type of the labels (``int``, ``str``,
    ``bool``), ``<type>[]`` for a label column of arrays (already one-hot encoded; MADlib's
    ``INTEGER[]``/``REAL[]``), ``null`` when every label is NULL."""
    if array_dtype is not None:
        kind = np.dtype(array_dtype).kind
        return {"b": "bool", "i": "int", "u": "int"}.get(kind, "float") + "[]"
    present = [v for v in class_values or [] if v is not None]
    return type(present[0]).__name__ if present else "null"


def one_hot(labels: Any, class_values: Sequence[Any], num_classes: int | None = None) -> np.ndarray:
    """One-hot encode ``labels`` against ``class_values``.

    Parameters
    ----------
    labels : array-like, 1-D
    class_values : sequence
        The class of column ``i`` is ``class_values[i]``.
    num_classes : int, optional
        Width of the encoding (MADlib pads with zero columns); at least ``len(class_values)``.

    Returns
    -------
    numpy.ndarray
        float32 of shape ``(n, num_classes or len(class_values))``.

    Raises
    ------
    DataError
        When ``num_classes`` is smaller than the number of class values, or a label is not
        one of ``class_values`` (the message lists up to 5 of them and their count).
    """
    index, width = _indices(labels, class_values, num_classes)
    out = np.zeros((len(index), width), dtype=np.float32)
    out[np.arange(len(index)), index] = 1.0
    return out


def index_dtype(num_classes: int) -> np.dtype[Any]:
    """The smallest unsigned integer type that holds class indices ``0 .. num_classes - 1``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if num_classes <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def class_indices(
    labels: Any, class_values: Sequence[Any], num_classes: int | None = None
) -> np.ndarray:
    """The index of each label in ``class_values``, as :func:`index_dtype` of the width.

    The compact form of :func:`one_hot` (same checks, same errors): ``one_hot(labels, ...)``
    equals ``np.eye(width)[class_indices(labels, ...)]``.
    """
    index, width = _indices(labels, class_values, num_classes)
    return index.astype(index_dtype(width))


def _indices(
    labels: Any, class_values: Sequence[Any], num_classes: int | None
) -> tuple[np.ndarray, int]:
    classes = list(class_values)
    if not classes:
        raise ArgumentError(
            "class_values is empty. Received: class_values=[]. Pass the classes, for example "
            "class_values_of(labels)."
        )
    width = len(classes)
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer):
            raise ArgumentTypeError(
                f"num_classes must be an int. Received: num_classes={num_classes!r}."
            )
        if num_classes < len(classes):
            raise DataError(
                f"num_classes is smaller than the number of class values. Received: "
                f"num_classes={num_classes}, {len(classes)} class values {classes[:10]}. "
                f"Raise num_classes or leave it as None."
            )
        width = int(num_classes)
    class_kind = _python_values(pd.Series(classes, dtype=object), "class_values")[1]
    if len(set(classes)) != len(classes):
        raise ArgumentError(f"class_values must be distinct. Received: class_values={classes}.")
    series = _as_series(labels)
    n = len(series)
    if n == 0:
        return np.zeros(0, dtype=np.int64), width
    _, label_kind = _python_values(series, "labels")
    if label_kind is not None and class_kind is not None and label_kind != class_kind:
        raise DataError(
            f"labels and class_values differ in type. Received: {label_kind} labels, "
            f"{class_kind} class_values {classes[:10]}. Convert the labels to {class_kind}."
        )
    # NULL labels (None, NaN) get the sentinel code -1: the class None, when there is one.
    codes, uniques = pd.factorize(series)
    lookup = {v: i for i, v in enumerate(classes)}
    as_python = [u.item() if isinstance(u, np.generic) else u for u in uniques]
    if class_kind == "int":
        as_python = [int(u) for u in as_python]
    table = np.array([lookup.get(u, -1) for u in as_python] + [lookup.get(None, -1)])
    unknown: list[Any] = [u for u, i in zip(as_python, table[:-1], strict=True) if i < 0]
    null_rows = int((codes < 0).sum()) if table[-1] < 0 else 0
    if unknown or null_rows:
        rows = int(np.isin(codes, np.flatnonzero(table[:-1] < 0)).sum()) + null_rows
        shown = sorted(unknown)[:_MAX_SHOWN] + ([None] if null_rows else [])
        raise DataError(
            f"labels hold values that are not in class_values. Received: "
            f"{len(unknown) + bool(null_rows)} unknown value(s) in {rows} row(s), e.g. {shown}; "
            f"class_values={classes[:10]}{' ...' if len(classes) > 10 else ''}. Drop those "
            f"rows, or build the dataset with the class_values of the training data."
        )
    return table[codes], width


_SHAPE = operator.attrgetter("shape")


def _is_array_cell(value: Any) -> bool:
    return isinstance(value, list | tuple | np.ndarray)


def _numeric_categories(frame: Any, cols: list[Any]) -> Any:
    """Categorical columns whose categories are numbers, as those numbers: hive partition
    columns (``part=3/``) come back from Parquet as categoricals of their values."""
    import pandas as pd

    numeric = [
        c
        for c in cols
        if isinstance(frame[c].dtype, pd.CategoricalDtype)
        and pd.api.types.is_numeric_dtype(frame[c].cat.categories.dtype)
    ]
    if not numeric:
        return frame
    return frame.assign(**{str(c): frame[c].astype(frame[c].cat.categories.dtype) for c in numeric})


def x_to_array(frame: pd.DataFrame, x_cols: Sequence[str]) -> np.ndarray:
    """Turn the columns of ONE x input into an array.

    Parameters
    ----------
    frame : pandas.DataFrame
    x_cols : sequence of str
        Either one column whose cells are arrays or lists (stacked into ``(n, *shape)``, the
        cell dtype kept), or one or more numeric columns (``(n, k)`` float). A frame without
        rows gives shape ``(0,)`` for an object column, whose cell shape is unknown.

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    DataError
        For missing columns, ragged or non-numeric array cells, non-numeric columns or array
        cells mixed with other columns.
    """
    if not isinstance(frame, pd.DataFrame):
        raise ArgumentTypeError(
            f"frame must be a pandas DataFrame. Received: {type(frame).__name__}."
        )
    cols = [x_cols] if isinstance(x_cols, str) else list(x_cols)
    if not cols:
        raise ArgumentError("x_cols is empty. Received: x_cols=[]. Name at least one column.")
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise DataError(
            f"x columns are missing from the data. Received: missing {missing}; available "
            f"columns {[str(c) for c in frame.columns]}. Fix the column names."
        )
    if len(frame) == 0 and len(cols) == 1 and frame[cols[0]].dtype == object:
        # Without a cell the shape of an array column is unknown; an empty part adds no rows.
        return np.zeros((0,), dtype=np.float32)
    array_cols = [c for c in cols if frame[c].dtype == object and has_array_cells(frame[c])]
    if array_cols and len(cols) > 1:
        raise DataError(
            f"A column of arrays must be the only column of its x input. Received: array "
            f"column(s) {array_cols} among x_cols={cols}. Give it its own x input."
        )
    if array_cols:
        return _stack_cells(frame[cols[0]], cols[0])
    frame = _numeric_categories(frame, cols)
    for c in cols:
        dtype = frame[c].dtype
        if not pd.api.types.is_numeric_dtype(dtype):
            raise DataError(
                f"x column {c!r} is not numeric. Received: dtype {dtype}. Encode it as numbers "
                f"(for example one-hot) or leave it out of the x columns."
            )
    out_dtype = np.result_type(*[np.dtype(_numpy_dtype(frame[c].dtype)) for c in cols], np.float32)
    if not np.issubdtype(out_dtype, np.floating):
        out_dtype = np.dtype(np.float64)
    return frame[cols].to_numpy(dtype=out_dtype, na_value=np.nan)


def _numpy_dtype(dtype: Any) -> Any:
    # pandas extension dtypes (Int64, Float32, boolean) expose their numpy equivalent.
    return getattr(dtype, "numpy_dtype", dtype)


def has_array_cells(column: pd.Series) -> bool:
    """Whether the first non-None cell of ``column`` is an array, list or tuple."""
    for cell in column:
        if cell is not None:
            return _is_array_cell(cell)
    return False


def stack_label_cells(column: pd.Series, name: str) -> np.ndarray:
    """A label column whose cells are arrays (already one-hot encoded, MADlib's ``REAL[]``
    or ``INTEGER[]`` dependent variable) as one 2-D numeric array.

    Raises
    ------
    DataError
        For NULL or non-array cells, cells that are not 1-D, or ragged or non-numeric cells.
    """
    stacked = _stack_cells(column, name, "label column")
    if stacked.ndim != 2:
        raise DataError(
            f"label column {name!r} holds arrays of shape {stacked.shape[1:]}: labels already "
            "one-hot encoded must be 1-D arrays, one value per class. Flatten them."
        )
    return stacked


def _stack_cells(column: pd.Series, name: str, what: str = "x column") -> np.ndarray:
    cells = column.tolist()
    # The common case, every cell a numpy array, is checked and stacked without a Python
    # loop per cell: type, shape and the copy run in C (np.stack's per-cell views cost ~8x
    # more than np.concatenate on hundreds of thousands of small cells).
    if set(map(type, cells)) == {np.ndarray}:
        arrays = cells
    else:
        empty = [i for i, c in enumerate(cells) if not _is_array_cell(c)]
        if empty:
            raise DataError(
                f"{what} {name!r} mixes arrays with other cells. Received: {len(empty)} rows "
                f"without an array, e.g. row {empty[0]} = {cells[empty[0]]!r}. Drop or fix them."
            )
        arrays = [np.asarray(c) for c in cells]
    shapes = list(dict.fromkeys(map(_SHAPE, arrays)))
    if len(shapes) > 1:
        shown = " and ".join(str(s) for s in shapes[:_MAX_SHOWN])
        raise DataError(
            f"{what} {name!r} holds arrays of different shapes: rows have shapes {shown}"
            f"{' ...' if len(shapes) > _MAX_SHOWN else ''}. Resize or pad them to one shape."
        )
    shape = shapes[0] if shapes else ()
    # Joined along their first axis, then split into rows again (one copy); scalar cells
    # (0-d arrays) cannot be concatenated.
    stacked = np.concatenate(arrays).reshape(len(arrays), *shape) if shape else np.stack(arrays)
    if not (np.issubdtype(stacked.dtype, np.number) or stacked.dtype == np.bool_):
        raise DataError(
            f"{what} {name!r} holds non-numeric arrays. Received: dtype {stacked.dtype}. "
            f"Convert the cells to numbers."
        )
    return stacked


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def overflow_limit(dtype: Any, normalizing_const: float) -> float | None:
    """The magnitude above which ``x / normalizing_const`` overflows float32, or None.

    None when no value of ``dtype`` can overflow (float32 or narrower, or small integers,
    divided by a constant of at least 1): the common case skips the extra pass over x.
    """
    limit = _FLOAT32_MAX * float(normalizing_const)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        widest = float(np.finfo(dtype).max)
    elif dtype.kind in "iu":
        widest = float(np.iinfo(dtype).max)
    else:
        return None
    return limit if widest > limit else None


def check_finite(
    x: np.ndarray, column: str, on_invalid: str = "raise", normalizing_const: float = 1.0
) -> np.ndarray:
    """Find the rows of ``x`` whose values are all finite once normalized and cast to float32.

    A value such as 1e300 is finite as float64 but is stored as inf in float32 (or after
    dividing by a tiny ``normalizing_const``): it counts as an inf value here, so that the
    check sees what will be stored, not what was read.

    Parameters
    ----------
    x : numpy.ndarray
        Shape ``(n, ...)``.
    column : str
        Name used in the error message.
    on_invalid : {"raise", "drop"}
        ``"raise"``: a row with NaN or inf is an error. ``"drop"``: return the mask, and let
        the caller drop and count the rows.
    normalizing_const : float
        The constant x will be divided by before it is stored as float32.

    Returns
    -------
    numpy.ndarray
        bool mask of shape ``(n,)``, True for valid rows.

    Raises
    ------
    DataError
        With ``on_invalid="raise"``, counting the rows and the NaN and inf values.
    """
    if on_invalid not in ("raise", "drop"):
        raise ArgumentError(
            f"on_invalid must be 'raise' or 'drop'. Received: on_invalid={on_invalid!r}."
        )
    arr = np.asarray(x)
    if arr.ndim == 0:
        raise DataError(f"x must have one row per sample. Received: a scalar for {column!r}.")
    n = arr.shape[0]
    limit = overflow_limit(arr.dtype, normalizing_const) if arr.dtype.kind in "iuf" else None
    if not np.issubdtype(arr.dtype, np.inexact) and limit is None:
        return np.ones(n, dtype=bool)
    finite = np.isfinite(arr) if np.issubdtype(arr.dtype, np.inexact) else np.ones_like(arr, bool)
    if limit is not None:
        with np.errstate(invalid="ignore"):
            finite &= ~(np.abs(arr) > limit)
    mask = np.asarray(finite.reshape(n, -1).all(axis=1)) if n else np.ones(0, dtype=bool)
    if on_invalid == "raise" and not mask.all():
        n_nan = int(np.isnan(arr).sum()) if np.issubdtype(arr.dtype, np.inexact) else 0
        n_inf = int((~finite).sum()) - n_nan
        raise DataError(
            f"Column {column!r} holds values that are not finite. Received: {int(n - mask.sum())}"
            f" of {n} rows with NaN or inf ({n_nan} NaN, {n_inf} inf values). Clean the data, "
            f"or pass on_invalid='drop' to drop those rows."
        )
    return mask


def check_normalizing_const(normalizing_const: Any) -> None:
    """Refuse a constant that is not a positive number that float32 can hold.

    x is divided by ``float32(normalizing_const)``: 1e-300 would become 0 (every value inf)
    and 1e300 would become inf (every value 0).
    """
    try:
        c = float("nan") if isinstance(normalizing_const, bool) else float(normalizing_const)
    except (TypeError, ValueError):
        c = float("nan")
    tiny = float(np.finfo(np.float32).tiny)
    if not math.isfinite(c) or not tiny <= c <= _FLOAT32_MAX:
        raise ArgumentError(
            f"normalizing_const must be a positive number that float32 can hold, between "
            f"{tiny:.3g} and {_FLOAT32_MAX:.3g}. Received: {normalizing_const!r}. Use 1.0 to "
            "leave x as it is, or e.g. 255.0 for 8-bit images."
        )


def normalize(x: np.ndarray, normalizing_const: float) -> np.ndarray:
    """Divide ``x`` by ``normalizing_const`` (MADlib's name), as float32.

    Parameters
    ----------
    x : numpy.ndarray
        Numeric; not modified.
    normalizing_const : float
        Positive and finite, for example 255.0 for 8-bit images.

    Returns
    -------
    numpy.ndarray
        A new float32 array.
    """
    if isinstance(normalizing_const, bool) or not isinstance(
        normalizing_const, int | float | np.integer | np.floating
    ):
        raise ArgumentTypeError(
            f"normalizing_const must be a number. Received: "
            f"normalizing_const={normalizing_const!r}."
        )
    check_normalizing_const(normalizing_const)
    arr = np.asarray(x)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ArgumentTypeError(f"x must be numeric to normalize. Received: dtype {arr.dtype}.")
    out = arr.astype(np.float32, copy=True)
    out /= np.float32(normalizing_const)
    return out
