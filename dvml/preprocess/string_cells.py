"""Undo Dask's string conversion of array-valued cells, or say how to avoid it.

Dask's ``dataframe.convert-string`` (on by default) turns every object column into Arrow
strings when a DataFrame is built with ``dd.from_pandas``, ``from_delayed`` or ``from_map``:
a column whose cells are numpy arrays arrives as text (``"[0. 1. 2.]"``) and could never be
used as x. Where the graph still holds the original objects, :func:`restore_array_cells`
rebuilds the frame without the conversion (``from_pandas`` keeps the pandas frame as it was
and only converts when the graph runs; ``from_delayed`` / ``from_map`` add an
``ArrowStringConversion`` step on top of the user's partitions). Otherwise it raises a
:class:`DataError` that says what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dvml.exceptions import DataError

__all__ = ["CONVERT_STRING_ADVICE", "restore_array_cells", "without_string_conversion"]

CONVERT_STRING_ADVICE = (
    "If its cells are arrays, Dask's dataframe.convert-string (on by default) turned them into "
    "text: build the Dask DataFrame under `with dask.config.set({'dataframe.convert-string': "
    "False}):` (or set it in your Dask config), or pass the pandas DataFrame itself."
)


def _is_text(dtype: Any) -> bool:
    import pandas as pd

    return isinstance(dtype, pd.StringDtype) or str(dtype).startswith("string")


def without_string_conversion(ddf: Any) -> Any:
    """``ddf`` rebuilt from the same graph with every string conversion of Dask left out.

    Raises whatever Dask raises when its expression API differs (callers fall back).
    """
    from dask.dataframe.dask_expr._collection import new_collection
    from dask.dataframe.dask_expr._expr import ArrowStringConversion

    expr = ddf.expr
    for node in list(expr.walk()):
        if isinstance(node, ArrowStringConversion):
            expr = expr.substitute(node, node.frame)
        elif "pyarrow_strings_enabled" in getattr(node, "_parameters", ()) and node.operand(
            "pyarrow_strings_enabled"
        ):
            expr = expr.substitute(
                node, node.substitute_parameters({"pyarrow_strings_enabled": False})
            )
    return new_collection(expr)


def restore_array_cells(ddf: Any, x_columns: Sequence[str], what: str = "x column") -> Any:
    """``ddf``, or the same frame without Dask's string conversion when an x column is text.

    Raises
    ------
    DataError
        An x column is text and the graph does not hold the original objects any more.
    """
    text = [c for c in x_columns if _is_text(ddf.dtypes[c])]
    if not text:
        return ddf
    try:
        rebuilt = without_string_conversion(ddf)
        restored = all(not _is_text(rebuilt.dtypes[c]) for c in text)
    except Exception:  # another Dask version's expression API: explain instead
        restored = False
    if restored:
        return rebuilt
    raise DataError(
        f"{what} {text[0]!r} holds text. Received: dtype {ddf.dtypes[text[0]]}. "
        f"{CONVERT_STRING_ADVICE} Text columns cannot be model inputs: encode them as numbers."
    )
