"""A packed row's format and size (pure): the stored dtype of every field and the bytes a row takes.

The preprocessors choose the format (:func:`field_dtypes`: compact uint8 x and class-index y,
or the float32 layout), record it in the summary for the readers (:func:`storage_record`) and
plan memory with the row's bytes (:func:`all_row_bytes`, :func:`compact_row_bytes`). Split from
:mod:`dvml.preprocess.api`, which packs; nothing here reads data or talks to a cluster.
"""

from __future__ import annotations

import math
from typing import Any

from dvml.preprocess.encode import index_dtype
from dvml.preprocess.tasks import storage_dtypes

__all__ = [
    "Output",
    "all_row_bytes",
    "common_dtypes",
    "compact_row_bytes",
    "field_dtypes",
    "row_bytes",
    "storage_record",
    "y_dtypes",
]

Output = tuple[list[Any] | None, int, str | None]  # class_values, width, array dtype


def y_dtypes(dtypes: dict[str, str] | None, k: int) -> dict[str, str] | None:
    """The dtypes of x and output ``k``'s y, named as :func:`row_bytes` reads them."""
    if dtypes is None:
        return None
    xs = {f: d for f, d in dtypes.items() if f.startswith("x_") and k == 0}
    return {**xs, "y": dtypes["y" if k == 0 else f"y_{k}"]}


def common_dtypes(stats: list[dict[str, Any]]) -> list[str]:
    """Each x input's source dtype where every non-empty part agrees; else ``"mixed"``."""
    found: list[set[str]] = []
    for s in stats:
        if not s["rows"]:
            continue
        for k, dtype in enumerate(s.get("x_dtypes") or []):
            if len(found) <= k:
                found.append(set())
            found[k].add(dtype)
    return [next(iter(d)) if len(d) == 1 else "mixed" for d in found]


def all_row_bytes(
    x_shapes: list[list[int]], outputs: list[Output], dtypes: dict[str, str] | None
) -> int:
    """Bytes of one packed row: x and every output's y."""
    return sum(
        row_bytes(x_shapes if k == 0 else [], width, y_dtypes(dtypes, k))
        for k, (_, width, _) in enumerate(outputs)
    )


def compact_row_bytes(
    stats: list[dict[str, Any]], x_shapes: list[list[int]], outputs: list[Output]
) -> int | None:
    """Bytes of one row with compact storage, when it would store some x as uint8 (else None:
    compact storage would save little, and the plan does not offer it)."""
    dtypes = field_dtypes(stats, outputs, True)
    if dtypes is None or all(d != "uint8" for f, d in dtypes.items() if f.startswith("x_")):
        return None
    return all_row_bytes(x_shapes, outputs, dtypes)


def field_dtypes(
    stats: list[dict[str, Any]], outputs: list[Output], compact: bool
) -> dict[str, str] | None:
    """The stored dtype of every field (None: the float32 layout): x and the first output's y
    by :func:`storage_dtypes`, each further output's y as class indices or float32."""
    class_values, n_classes, _ = outputs[0]
    dtypes = storage_dtypes(common_dtypes(stats), n_classes, compact, class_values is not None)
    if dtypes is not None:
        for k, (values, width, _) in enumerate(outputs[1:], start=1):
            dtypes[f"y_{k}"] = str(index_dtype(width)) if values is not None else "float32"
    return dtypes


def row_bytes(x_shapes: list[list[int]], n_classes: int, dtypes: dict[str, str] | None) -> int:
    """Bytes of one row of x and one output's y (``dtypes`` None: the float32 layout)."""
    import numpy as np

    if dtypes is None:
        return 4 * (sum(math.prod(s) for s in x_shapes) + n_classes)
    x = sum(math.prod(s) * np.dtype(dtypes[f"x_{k}"]).itemsize for k, s in enumerate(x_shapes))
    y = np.dtype(dtypes["y"])
    return int(x + y.itemsize * (1 if y.kind in "iu" else n_classes))


def storage_record(dtypes: dict[str, str] | None, n_outputs: int = 1) -> dict[str, Any]:
    """The summary's record of the packed format, read by :mod:`dvml.resolve`; a
    multi-output dataset records each output's (``y_dtypes``, ``ys``)."""
    import numpy as np

    if dtypes is None:
        return {"compact": False, "y": "one_hot"}
    xs = sorted((f for f in dtypes if f.startswith("x_")), key=lambda f: int(f[2:]))
    ys = ["y", *(f"y_{k}" for k in range(1, n_outputs))]
    # labels already one-hot encoded stay one-hot float32 in the compact format
    kinds = ["index" if np.dtype(dtypes[f]).kind in "iu" else "one_hot" for f in ys]
    out = {"compact": True, "x_dtypes": [dtypes[f] for f in xs], "y": kinds[0],
           "y_dtype": dtypes["y"]}  # fmt: skip
    if n_outputs > 1:
        out["ys"] = kinds
        out["y_dtypes"] = [dtypes[f] for f in ys]
    return out
