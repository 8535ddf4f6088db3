"""Worker-side steps of the pack graph: prepare a partition, split it, pack a buffer.

Top-level functions only (Dask pickles them by reference). Each takes and returns plain
values; the graph that wires them together is in :mod:`dvml.preprocess.graph`.

A *prepared part* is ``{"x": [array per input], "labels": ndarray, "dropped": int,
"invalid": {column: rows}, "nonfinite": {column: {"rows", "nan", "inf"}}, "invalid_rows":
int}``: raw features of one source partition, validated but not yet normalized or encoded.
Rows with NaN or inf are dropped here only with ``on_invalid="drop"``; with ``"raise"`` they
are counted, and the client raises with the totals of the whole source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dvml.cluster.workers import worker_host
from dvml.exceptions import DataError
from dvml.placement.planner import split_partition
from dvml.preprocess.encode import check_finite, normalize, one_hot, overflow_limit, x_to_array
from dvml.preprocess.images import decode_image
from dvml.preprocess.shards import read_tar_samples, samples_to_images_labels
from dvml.store.tensors import write_arrays

__all__ = [
    "pack_buffer",
    "part_stats",
    "prepare_arrays",
    "prepare_image_files",
    "prepare_table",
    "prepare_tar_shard",
    "split_part",
]


def _finish(
    xs: list[np.ndarray],
    labels: np.ndarray,
    names: Sequence[str],
    on_invalid: str,
    normalizing_const: float,
) -> dict[str, Any]:
    """Find the rows whose x holds NaN or inf (as float32, once normalized); drop them when
    ``on_invalid == "drop"``.

    With ``"raise"`` the rows are kept and only counted (rows, NaN and inf values per input):
    the client raises with the totals of the whole source, not those of one partition.
    """
    keep = np.ones(len(labels), dtype=bool)
    nonfinite: dict[str, dict[str, int]] = {}
    for name, x in zip(names, xs, strict=True):
        mask = check_finite(x, name, "drop", normalizing_const)
        if mask.all():
            continue
        keep &= mask
        arr = np.asarray(x)
        floating = arr.dtype.kind == "f"
        # inf as stored: inf in the source, or finite but beyond float32 once normalized
        inf = int(np.isinf(arr).sum()) if floating else 0
        limit = overflow_limit(arr.dtype, normalizing_const)
        if limit is not None:
            with np.errstate(invalid="ignore"):
                inf += int((np.isfinite(arr) & (np.abs(arr) > limit)).sum())
        nonfinite[name] = {
            "rows": int((~mask).sum()),
            "nan": int(np.isnan(arr).sum()) if floating else 0,
            "inf": inf,
        }
    invalid_rows = int((~keep).sum())
    dropped = 0
    if on_invalid == "drop" and invalid_rows:
        dropped = invalid_rows
        xs = [x[keep] for x in xs]
        labels = labels[keep]
    return {
        "x": xs,
        "labels": labels,
        "dropped": dropped,
        "invalid": {name: c["rows"] for name, c in nonfinite.items()},
        "nonfinite": nonfinite,
        "invalid_rows": invalid_rows,
    }


def _label_mask(labels: np.ndarray, y: str) -> np.ndarray:
    import pandas as pd

    missing = pd.isna(labels)
    if missing.any():
        raise DataError(
            f"Column {y!r} has {int(missing.sum())} missing labels (None/NaN) in a partition. "
            "Fill or drop them before preprocessing."
        )
    return np.ones(len(labels), dtype=bool)


def prepare_table(
    frame: Any,
    x_groups: Sequence[Sequence[str]],
    y: str,
    on_invalid: str,
    normalizing_const: float = 1.0,
) -> dict[str, Any]:
    """Prepare one pandas partition: x arrays per input group, labels, invalid rows."""
    if y not in frame.columns:
        raise DataError(
            f"The label column {y!r} is missing. Available columns: {list(frame.columns)}."
        )
    xs = [x_to_array(frame, list(group)) for group in x_groups]
    labels = frame[y].to_numpy()
    _label_mask(labels, y)
    names = [",".join(group) for group in x_groups]
    return _finish(xs, labels, names, on_invalid, normalizing_const)


def prepare_arrays(
    xs: Sequence[np.ndarray],
    labels: np.ndarray,
    x_names: Sequence[str],
    y: str,
    on_invalid: str,
    normalizing_const: float = 1.0,
) -> dict[str, Any]:
    """Prepare one block of array sources (dask or numpy arrays aligned on axis 0)."""
    labels = np.asarray(labels)
    arrays = []
    for name, x in zip(x_names, xs, strict=True):
        x = np.asarray(x)
        if x.dtype.kind not in "biuf":
            raise DataError(f"Input {name!r} has non-numeric dtype {x.dtype}; x must be numeric.")
        if len(x) != len(labels):
            raise DataError(
                f"Input {name!r} has {len(x)} rows in a block where {y!r} has {len(labels)}."
            )
        arrays.append(x)
    _label_mask(labels, y)
    return _finish(arrays, labels, list(x_names), on_invalid, normalizing_const)


def prepare_image_files(
    paths: Sequence[str], labels: Sequence[str], size: tuple[int, int], channels: int
) -> dict[str, Any]:
    """Decode and resize a chunk of image files (runs on a worker)."""
    images = []
    for path in paths:
        with open(path, "rb") as f:
            images.append(decode_image(f.read(), size, channels, source=path))
    shape = (0, size[0], size[1], channels)
    x = np.stack(images) if images else np.zeros(shape, np.uint8)
    return {"x": [x], "labels": np.asarray(labels), "dropped": 0, "invalid": {}}


def prepare_tar_shard(path: str, size: tuple[int, int], channels: int) -> dict[str, Any]:
    """Decode the samples of one WebDataset-style tar shard (runs on a worker)."""
    images, labels = samples_to_images_labels(read_tar_samples(path), size, channels=channels)
    return {"x": [images], "labels": np.asarray(labels), "dropped": 0, "invalid": {}}


def part_stats(part: dict[str, Any]) -> dict[str, Any]:
    """Small facts about a prepared part, gathered by the client to plan the layout."""
    import pandas as pd

    labels = part["labels"]
    # pd.unique does not sort: np.unique of [1, "1"] raises a raw TypeError here, before the
    # client can say that the labels mix types (encode.class_values_of).
    uniques = pd.unique(pd.Series(labels, dtype=labels.dtype)) if len(labels) else []
    return {
        "rows": len(labels),
        "labels": [u.item() if isinstance(u, np.generic) else u for u in uniques],
        "label_kind": labels.dtype.kind if len(labels) else None,
        "x_shapes": [list(x.shape[1:]) for x in part["x"]],
        "x_dtypes": [str(x.dtype) for x in part["x"]],
        "dropped": part["dropped"],
        "invalid": part["invalid"],
        "nonfinite": part.get("nonfinite", {}),
        "invalid_rows": part.get("invalid_rows", 0),
    }


def split_part(
    part: dict[str, Any],
    ordered_counts: Sequence[int],
    seed: int,
    class_values: list[Any],
    num_classes: int,
    normalizing_const: float,
) -> dict[str, np.ndarray]:
    """Normalize, one-hot encode and permute a part, laid out buffer after buffer.

    ``ordered_counts`` is the part's row of :attr:`PiecePlan.ordered_counts`: the rows of each
    buffer, buffers grouped by target worker, so that what one target needs is one contiguous
    slice (:func:`take_piece`). x is copied once: gathered in the permuted order, then
    converted and divided in place (the same float32 values as normalizing first).
    """
    normalize(part["x"][0][:0], normalizing_const)  # validates the constant and the dtype
    y = one_hot(part["labels"], class_values, num_classes)
    pieces = split_partition(len(y), np.asarray(ordered_counts), seed)
    perm = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    laid_out = {
        f"x_{i}": _take_normalized(x, perm, normalizing_const) for i, x in enumerate(part["x"])
    }
    laid_out["y"] = y[perm]
    return laid_out


def _take_normalized(x: np.ndarray, idx: np.ndarray, normalizing_const: float) -> np.ndarray:
    """``normalize(x, c)[idx]`` in one copy: take the rows, then convert and divide in place."""
    out = np.take(np.asarray(x), idx, axis=0)
    if out.dtype != np.float32:
        out = out.astype(np.float32)
    if normalizing_const != 1:
        out /= np.float32(normalizing_const)
    return out


def take_piece(laid_out: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    """The rows one target needs from a split part (a separate task, so only they move).

    Views, not copies: a piece that stays on its worker costs nothing, and one that moves is
    sent as its own bytes only.
    """
    return {field: values[start:stop] for field, values in laid_out.items()}


def pack_buffer(
    index: int, seed: int, staging_name: str, ranges: Sequence[tuple[int, int]], *pieces: Any
) -> dict[str, Any]:
    """Shuffle a buffer's rows straight into THIS worker's vineyardd.

    ``pieces[i][start:stop]``, with ``ranges[i] == (start, stop)``, are the buffer's rows from
    one source part. They are written, in a random order, into tensors allocated in vineyard
    shared memory: the only copy of the buffer's bytes on this worker.
    """
    from distributed import get_worker

    parts = [
        {field: values[start:stop] for field, values in piece.items()}
        for piece, (start, stop) in zip(pieces, ranges, strict=True)
    ]
    rows = sum(len(p["y"]) for p in parts)
    order = np.random.default_rng(seed + index).permutation(rows)
    # concatenate(parts)[order], written in one pass: row j of the concatenation goes to
    # position where[j], straight from its part.
    where = np.empty_like(order)
    where[order] = np.arange(rows)

    def scatter(out: dict[str, np.ndarray]) -> None:
        for field, buffer in out.items():
            start = 0
            for p in parts:
                n = len(p[field])
                buffer[where[start : start + n]] = p[field]
                start += n

    specs = {k: ((rows, *v.shape[1:]), v.dtype) for k, v in parts[0].items()}
    record = write_arrays(specs, scatter, staging_name=staging_name)
    worker = get_worker()
    return {
        "index": index,
        "rows": rows,
        "instance_id": record["instance_id"],
        "worker": worker.address,
        "worker_name": str(worker.name),
        "host": worker_host(worker.address),
        "fields": record["fields"],
    }
