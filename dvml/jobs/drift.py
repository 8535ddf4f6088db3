"""Drift of appended rows: the population stability index (PSI) of each feature, new against old.

The retrain workflow keeps a small per-feature summary of the rows it has packed (bin edges
fixed by the first version's quantiles, and the count of rows in each bin), so that checking
new rows never re-reads the old ones: the new rows are counted in the same bins, compared, and
their counts added to the summary.

PSI of one feature: ``sum((p_new - p_old) * ln(p_new / p_old))`` over the bins, with each
proportion floored at :data:`EPSILON` (an empty bin would make it infinite). The usual reading:
below 0.1 no drift, 0.1-0.25 a moderate shift, above 0.25 a large one (:data:`DEFAULT_THRESHOLD`).
A feature whose values all fall in one bin on both sides reads 0.

Pure: numpy arrays and plain values in, plain (JSON-able) values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dvml.exceptions import ArgumentError

__all__ = [
    "DEFAULT_BINS",
    "DEFAULT_THRESHOLD",
    "EPSILON",
    "bin_edges",
    "compare",
    "describe_drift",
    "merge",
    "psi",
    "summarize",
]

DEFAULT_BINS = 10
DEFAULT_THRESHOLD = 0.25
"""A feature whose PSI is above this has drifted (the conventional "large shift")."""
EPSILON = 1e-4


def _matrix(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        array = array.reshape(array.shape[0], -1)
    return array


def bin_edges(values: Any, bins: int = DEFAULT_BINS) -> list[list[float]]:
    """Inner bin edges per feature (column) of ``values``: its quantiles, deduplicated.

    ``values`` is rows by features (a 1-D array is one feature). ``k`` inner edges make
    ``k + 1`` bins, the outer ones open-ended, so later values outside the first version's
    range still fall in a bin.
    """
    if bins < 2:
        raise ArgumentError(f"Drift needs at least 2 bins. Received: bins={bins}.")
    matrix = _matrix(values)
    if matrix.shape[0] == 0:
        raise ArgumentError("Bin edges need at least one row. Received: 0 rows.")
    quantiles = np.linspace(0, 1, bins + 1)[1:-1]
    return [
        sorted({float(e) for e in np.quantile(matrix[:, j], quantiles)})
        for j in range(matrix.shape[1])
    ]


def _counts(matrix: np.ndarray, edges: Sequence[Sequence[float]]) -> list[list[int]]:
    if matrix.shape[1] != len(edges):
        raise ArgumentError(
            f"The rows have {matrix.shape[1]} feature(s) and the summary {len(edges)}: the "
            "features changed. Repack the data (retrain with --force)."
        )
    out = []
    for j, inner in enumerate(edges):
        index = np.searchsorted(np.asarray(inner, dtype=np.float64), matrix[:, j], side="right")
        out.append(np.bincount(index, minlength=len(inner) + 1).astype(int).tolist())
    return out


def summarize(
    values: Any, edges: Sequence[Sequence[float]] | None = None, bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """The summary of rows: ``{"edges", "counts", "rows"}`` (edges from them when not given)."""
    matrix = _matrix(values)
    edges = [list(e) for e in edges] if edges is not None else bin_edges(matrix, bins)
    return {"edges": edges, "counts": _counts(matrix, edges), "rows": int(matrix.shape[0])}


def psi(old: Sequence[int], new: Sequence[int]) -> float:
    """The population stability index of one feature from its bin counts (old, new)."""
    if len(old) != len(new):
        raise ArgumentError(f"Bin counts differ in length. Received: {len(old)} and {len(new)}.")
    a, b = float(sum(old)), float(sum(new))
    if a == 0 or b == 0:
        return 0.0
    total = 0.0
    for o, n in zip(old, new, strict=True):
        p, q = max(o / a, EPSILON), max(n / b, EPSILON)
        total += (q - p) * math.log(q / p)
    return total


def compare(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    threshold: float = DEFAULT_THRESHOLD,
    names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Drift of ``new`` against ``old`` (two summaries with the same edges).

    Returns
    -------
    dict
        ``test`` ("psi"), ``threshold``, ``rows_old``, ``rows_new``, ``max_psi``, ``feature``
        (the name of the feature with the largest PSI), ``drifted`` (names above the
        threshold) and ``psi`` (per feature, rounded).
    """
    names = list(names) if names is not None else [f"x[{j}]" for j in range(len(old["counts"]))]
    values = [psi(o, n) for o, n in zip(old["counts"], new["counts"], strict=True)]
    worst = int(np.argmax(values)) if values else 0
    return {
        "test": "psi",
        "threshold": float(threshold),
        "rows_old": int(old["rows"]),
        "rows_new": int(new["rows"]),
        "max_psi": round(values[worst], 6) if values else 0.0,
        "feature": names[worst] if values else None,
        "drifted": [n for n, v in zip(names, values, strict=True) if v > threshold],
        "psi": {n: round(v, 6) for n, v in zip(names, values, strict=True)},
    }


def merge(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of old and new rows together (same edges): counts added."""
    counts = [
        [a + b for a, b in zip(o, n, strict=True)]
        for o, n in zip(old["counts"], new["counts"], strict=True)
    ]
    return {"edges": old["edges"], "counts": counts, "rows": int(old["rows"]) + int(new["rows"])}


def describe_drift(result: Mapping[str, Any]) -> str:
    """One log line for a :func:`compare` result."""
    head = (
        f"drift (PSI, {result['rows_new']} new rows against {result['rows_old']}): max "
        f"{result['max_psi']:.4f} ({result['feature']}), threshold {result['threshold']:g}"
    )
    drifted = result["drifted"]
    if not drifted:
        return f"{head}: no feature drifted"
    shown = ", ".join(drifted[:8]) + (f" and {len(drifted) - 8} more" if len(drifted) > 8 else "")
    return f"{head}: {len(drifted)} feature(s) drifted: {shown}"
