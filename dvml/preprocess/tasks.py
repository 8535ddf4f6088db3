"""Worker-side steps of the pack graph: prepare a partition, split a group, pack a buffer.

Top-level functions only (Dask pickles them by reference). Each takes and returns plain
values; the graph that wires them together is in :mod:`dvml.preprocess.graph`.

A *prepared part* is ``{"x": [array per input], "labels": ndarray, "dropped": int,
"invalid": {column: rows}, "nonfinite": {column: {"rows", "nan", "inf"}}, "invalid_rows":
int}``: raw features of one source partition, validated but not yet normalized or encoded.
Rows with NaN or inf are dropped here only with ``on_invalid="drop"``; with ``"raise"`` they
are counted, and the client raises with the totals of the whole source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dvml.cluster.workers import worker_host
from dvml.exceptions import DataError, VineyardMemoryError
from dvml.placement.planner import split_partition
from dvml.placement.routes import FETCH_ROUND_BYTES
from dvml.preprocess.encode import (
    check_finite,
    class_indices,
    normalize,
    one_hot,
    overflow_limit,
    x_to_array,
)
from dvml.preprocess.exchange import fetch_slices, serve_slices_here
from dvml.preprocess.images import decode_image
from dvml.preprocess.locations import open_binary, read_bytes
from dvml.preprocess.shards import read_tar_samples, samples_to_images_labels
from dvml.store.tensors import write_buffers

__all__ = [
    "ClientPart",
    "buffer_positions",
    "decode_tar_shard",
    "fetch_rounds",
    "group_stats",
    "label_stats",
    "labels_of",
    "lay_out_group",
    "pack_buffers",
    "part_stats",
    "prepare_arrays",
    "prepare_batch",
    "prepare_image_files",
    "prepare_scattered",
    "prepare_table",
    "prepare_tar_shard",
    "slice_positions",
    "split_group",
    "split_part",
    "storage_dtypes",
    "take_piece",
]


def _finish(
    xs: list[np.ndarray],
    labels: np.ndarray,
    names: Sequence[str],
    on_invalid: str,
    normalizing_const: float,
    more_labels: Sequence[np.ndarray] = (),
) -> dict[str, Any]:
    """Find the rows whose x holds NaN or inf (as float32, once normalized); drop them when
    ``on_invalid == "drop"``.

    ``more_labels``: the labels of a multi-output model's other outputs (MADlib's several
    dependent variables), kept as ``"more_labels"``, row for row with ``labels``.

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
        more_labels = [m[keep] for m in more_labels]
    return {
        "x": xs,
        "labels": labels,
        **({"more_labels": list(more_labels)} if len(more_labels) else {}),
        "dropped": dropped,
        "invalid": {name: c["rows"] for name, c in nonfinite.items()},
        "nonfinite": nonfinite,
        "invalid_rows": invalid_rows,
    }


def labels_of(frame: Any, y: str) -> np.ndarray:
    """The labels of column ``y``: 1-D values (NULL kept: MADlib makes it a class), or for a
    column whose cells are arrays (a label already one-hot encoded, MADlib's ``REAL[]`` or
    ``INTEGER[]`` dependent variable) the stacked 2-D array."""
    from dvml.preprocess.encode import has_array_cells, stack_label_cells

    column = frame[y]
    if column.dtype == object and has_array_cells(column):
        return stack_label_cells(column, y)
    return column.to_numpy()


def prepare_table(
    frame: Any,
    x_groups: Sequence[Sequence[str]],
    y: str | Sequence[str],
    on_invalid: str,
    normalizing_const: float = 1.0,
) -> dict[str, Any]:
    """Prepare one pandas partition: x arrays per input group, labels (of each output, for
    several label columns), invalid rows."""
    ys = [y] if isinstance(y, str) else list(y)
    missing = [c for c in ys if c not in frame.columns]
    if missing:
        raise DataError(
            f"The label column {missing[0]!r} is missing. Available columns: {list(frame.columns)}."
        )
    xs = [x_to_array(frame, list(group)) for group in x_groups]
    labels = [labels_of(frame, c) for c in ys]
    names = [",".join(group) for group in x_groups]
    return _finish(xs, labels[0], names, on_invalid, normalizing_const, labels[1:])


def prepare_arrays(
    xs: Sequence[np.ndarray],
    labels: np.ndarray,
    x_names: Sequence[str],
    y: str,
    on_invalid: str,
    normalizing_const: float = 1.0,
    more_labels: Sequence[np.ndarray] = (),
) -> dict[str, Any]:
    """Prepare one block of array sources (dask or numpy arrays aligned on axis 0);
    ``more_labels`` are the labels of a multi-output model's other outputs."""
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
    if labels.ndim > 2 or (labels.ndim == 2 and labels.dtype.kind not in "biuf"):
        raise DataError(
            f"Labels {y!r} must be 1-D class values, or 2-D numbers (already one-hot encoded). "
            f"Received: shape {labels.shape}, dtype {labels.dtype}."
        )
    return _finish(arrays, labels, list(x_names), on_invalid, normalizing_const, more_labels)


@dataclasses.dataclass(frozen=True)
class ClientPart:
    """A part to prepare whose inputs the client holds (slices of an in-memory frame).

    The pack scatters ``args`` straight to a worker and runs ``fn(*args)`` there
    (:func:`prepare_scattered`), instead of embedding them in the task graph, which would send
    every byte through the scheduler (:func:`dvml.preprocess.graph.compute_stats`).
    """

    fn: Any
    args: tuple[Any, ...]


def prepare_scattered(fn: Any, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """A batch of one part prepared from inputs scattered to this worker (:class:`ClientPart`)."""
    return [fn(*args)]


def prepare_batch(fn: Any, arity: int, *values: Any) -> list[dict[str, Any]]:
    """The prepared parts of consecutive partitions: ``fn`` of every ``arity`` values.

    A pack's prepare tasks each return such a list (a batch), most often of one partition.
    """
    return [fn(*values[i : i + arity]) for i in range(0, len(values), arity)]


def prepare_image_files(
    paths: Sequence[str],
    labels: Sequence[str],
    size: tuple[int, int],
    channels: int,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Decode and resize a chunk of image files (runs on a worker, which reads them from
    where they are: a local path or a store URL)."""
    contents = read_bytes(paths, storage_options)
    images = [
        decode_image(data, size, channels, source=path)
        for path, data in zip(paths, contents, strict=True)
    ]
    shape = (0, size[0], size[1], channels)
    x = np.stack(images) if images else np.zeros(shape, np.uint8)
    return {"x": [x], "labels": np.asarray(labels), "dropped": 0, "invalid": {}}


def prepare_tar_shard(
    path: str,
    size: tuple[int, int],
    channels: int,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] = "cls",
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Decode the samples of one WebDataset tar shard (runs on a worker, which streams the
    shard from where it is: a local path or a store URL)."""
    _, images, labels = decode_tar_shard(
        path, size, channels, image_ext, label_ext, storage_options
    )
    return {"x": [images], "labels": np.asarray(labels), "dropped": 0, "invalid": {}}


def decode_tar_shard(
    path: str,
    size: tuple[int, int],
    channels: int,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] = "cls",
    storage_options: dict[str, Any] | None = None,
    require_labels: bool = True,
) -> tuple[list[str], np.ndarray, list[Any]]:
    """The keys, images (uint8) and labels of one shard's samples (runs on a worker)."""
    with open_binary(path, storage_options) as f:
        samples = read_tar_samples(path, f)
    images, labels = samples_to_images_labels(
        samples, size, image_ext, label_ext, channels=channels, source=path,
        require_labels=require_labels,
    )  # fmt: skip
    return [key for key, _ in samples], images, labels


def label_stats(labels: np.ndarray) -> dict[str, Any]:
    """The rows and distinct labels of one output's labels (or, for labels already one-hot
    encoded, their width and dtype)."""
    import pandas as pd

    if labels.ndim == 2:  # already one-hot encoded: no class values, a width
        uniques: Any = []
    else:
        # pd.unique does not sort: np.unique of [1, "1"] raises a raw TypeError here, before
        # the client can say that the labels mix types (encode.class_values_of). NULL (None
        # or NaN) is one value, None.
        series = pd.Series(labels, dtype=labels.dtype)
        nulls = bool(series.isna().any())
        uniques = pd.unique(series[series.notna()]) if len(labels) else []
        uniques = [*([None] if nulls else []), *uniques]
    return {
        "rows": len(labels),
        "labels": [u.item() if isinstance(u, np.generic) else u for u in uniques],
        "label_kind": labels.dtype.kind if len(labels) else None,
        "label_width": int(labels.shape[1]) if labels.ndim == 2 else None,
        "label_dtype": str(labels.dtype) if labels.ndim == 2 else None,
    }


def part_stats(part: dict[str, Any]) -> dict[str, Any]:
    """Small facts about a prepared part, gathered by the client to plan the layout."""
    return {
        **label_stats(part["labels"]),
        "more_outputs": [label_stats(m) for m in part.get("more_labels", [])],
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
    field_dtypes: dict[str, str] | None = None,
    more_outputs: Sequence[tuple[list[Any] | None, int]] = (),
) -> dict[str, np.ndarray]:
    """Normalize, one-hot encode and permute a part, laid out buffer after buffer.

    ``ordered_counts`` is the part's row of :attr:`PiecePlan.ordered_counts`: the rows of each
    buffer, buffers grouped by target worker, so that what one target needs is one contiguous
    slice (:func:`take_piece`). The laid-out rows of a group of one part (:func:`split_group`).
    """
    counts = np.asarray(ordered_counts, dtype=np.int64).reshape(1, -1)
    starts = (np.cumsum(counts[0]) - counts[0]).reshape(-1, 1)
    return lay_out_group([part], counts, starts, [seed], class_values, num_classes,
                         normalizing_const, field_dtypes, more_outputs)  # fmt: skip


def group_stats(batches: Sequence[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """:func:`part_stats` of each part of each batch of a group (one task per group, where
    the batches are)."""
    return [[part_stats(part) for part in batch] for batch in batches]


# A partition's rows for one buffer are copied as one block (np.take into the output) when
# blocks are at least this many rows on average; below, one scatter per partition is cheaper
# than a Python call per block.
_BLOCK_ROWS = 16


def split_group(
    batches: Sequence[list[dict[str, Any]]],
    group_counts: np.ndarray,
    starts: np.ndarray,
    seeds: Sequence[int],
    class_values: list[Any],
    num_classes: int,
    normalizing_const: float,
    field_dtypes: dict[str, str] | None = None,
    more_outputs: Sequence[tuple[list[Any] | None, int]] = (),
) -> dict[str, np.ndarray]:
    """The task of a group: :func:`lay_out_group` of its batches' parts, kept here for the
    pack tasks to fetch.

    Its result stays in this worker's memory under the task's key (Dask recomputes it, from
    the source if need be, should the worker die); the pack tasks fetch their slices of it
    through :mod:`dvml.preprocess.exchange`, which this installs on the worker.
    """
    serve_slices_here()
    parts = [part for batch in batches for part in batch]
    return lay_out_group(
        parts, group_counts, starts, seeds, class_values, num_classes, normalizing_const,
        field_dtypes, more_outputs,
    )  # fmt: skip


def lay_out_group(
    parts: Sequence[dict[str, Any]],
    group_counts: np.ndarray,
    starts: np.ndarray,
    seeds: Sequence[int],
    class_values: list[Any],
    num_classes: int,
    normalizing_const: float,
    field_dtypes: dict[str, str] | None = None,
    more_outputs: Sequence[tuple[list[Any] | None, int]] = (),
) -> dict[str, np.ndarray]:
    """Normalize, one-hot encode and lay out the rows of a group of parts for their buffers.

    Parameters
    ----------
    parts : sequence of dict
        Prepared parts, the group's partitions in ascending order.
    group_counts : numpy.ndarray
        ``RoutePlan.group_counts[g]``: rows of part ``i`` for the buffer at each position of
        the buffer order (buffers grouped by target).
    starts : numpy.ndarray
        ``RoutePlan.starts[g]``: where part ``i``'s rows for buffer position ``j`` begin.
    seeds : sequence of int
        The :func:`~dvml.placement.planner.partition_seed` of each part.
    field_dtypes : dict of str to str, optional
        The compact format (:func:`storage_dtypes`): an ``x_k`` stored as ``uint8`` keeps its
        pixels as they are (normalized on the fly by the reader), a ``y`` stored as an integer
        type holds class indices (one-hot encoded on the fly). None: every field float32, x
        normalized, y one-hot.
    more_outputs : sequence of (class_values, num_classes)
        A multi-output model's other outputs (MADlib's several dependent variables): their
        labels (the parts' ``more_labels``) are laid out as ``y_1``, ``y_2``, ... as ``y``
        is (``field_dtypes`` names each).

    Returns
    -------
    dict of str to numpy.ndarray
        ``x_0``, ... and ``y`` (float32 unless ``field_dtypes`` says otherwise): the group's
        rows buffer after buffer, part after part
        within a buffer, each part's rows in the order of its seeded permutation (the same rows
        in the same order as :func:`split_part` gives each part). x is copied once: gathered
        in the permuted order straight into the output, then divided in place.
    """
    group_counts = np.asarray(group_counts, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    total = int(group_counts.sum())
    first = next((p for p in parts if len(p["labels"])), parts[0])
    dtypes = field_dtypes or {}
    laid_out = {
        f"x_{k}": np.empty((total, *np.shape(x)[1:]), dtype=dtypes.get(f"x_{k}", np.float32))
        for k, x in enumerate(first["x"])
    }
    outputs = [(class_values, num_classes), *more_outputs]
    y_fields = ["y", *(f"y_{k}" for k in range(1, len(outputs)))]
    indices = [np.dtype(dtypes.get(f, np.float32)).kind in "iu" for f in y_fields]
    for f, (_, width), index in zip(y_fields, outputs, indices, strict=True):
        laid_out[f] = (
            np.empty(total, dtype=dtypes[f])
            if index
            else np.empty((total, width), dtype=np.float32)
        )
    for i, part in enumerate(parts):
        counts = group_counts[i]
        normalize(part["x"][0][:0], normalizing_const)  # validates the constant and the dtype
        sources = [np.asarray(x) for x in part["x"]]
        for labels, (classes, width), index in zip(
            [part["labels"], *part.get("more_labels", [])], outputs, indices, strict=True
        ):
            sources.append(_encoded_labels(labels, classes, width, index))
        pieces = split_partition(len(part["labels"]), counts, int(seeds[i]))
        blocks = [j for j in range(len(counts)) if counts[j]]
        n = int(counts.sum())
        if blocks and n >= _BLOCK_ROWS * len(blocks):
            for j in blocks:
                at = slice(int(starts[j, i]), int(starts[j, i] + counts[j]))
                for source, out in zip(sources, laid_out.values(), strict=True):
                    if source.dtype == out.dtype:
                        np.take(source, pieces[j], axis=0, out=out[at], mode="clip")
                    else:  # e.g. uint8 images: take refuses to cast, an assignment does
                        out[at] = source[pieces[j]]
        elif n:
            perm = np.concatenate(pieces)
            dest = np.repeat(starts[:, i] - (np.cumsum(counts) - counts), counts)
            dest += np.arange(n)
            for source, out in zip(sources, laid_out.values(), strict=True):
                out[dest] = source[perm]
    if normalizing_const != 1:
        for field, values in laid_out.items():
            if field.startswith("x_") and values.dtype == np.float32:  # compact x: on read
                values /= np.float32(normalizing_const)
    return laid_out


def _encoded_labels(
    labels: np.ndarray, class_values: list[Any] | None, num_classes: int, indices: bool
) -> np.ndarray:
    """Labels as stored: class indices (compact) or one-hot float32; labels already one-hot
    encoded (``class_values`` None) as float32, padded with zero columns to ``num_classes``."""
    if class_values is None:
        out = np.zeros((len(labels), num_classes), dtype=np.float32)
        out[:, : labels.shape[1]] = labels
        return out
    if indices:
        return class_indices(labels, class_values, num_classes)
    return one_hot(labels, class_values, num_classes)


def storage_dtypes(
    x_dtypes: Sequence[str], num_classes: int, compact: bool, y_indices: bool = True
) -> dict[str, str] | None:
    """The dtype of each packed field: None (float32 x, normalized; one-hot float32 y) unless
    ``compact``; then an x whose source is uint8 stays uint8 and y holds class indices of the
    smallest unsigned type (:func:`~dvml.preprocess.encode.index_dtype`), unless
    ``y_indices`` is False (labels already one-hot encoded stay float32)."""
    from dvml.preprocess.encode import index_dtype

    if not compact:
        return None
    dtypes = {f"x_{k}": ("uint8" if d == "uint8" else "float32") for k, d in enumerate(x_dtypes)}
    dtypes["y"] = str(index_dtype(num_classes)) if y_indices else "float32"
    return dtypes


def take_piece(laid_out: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows ``start:stop`` of laid-out rows: what one target needs from a split part.

    Views, not copies: a piece that stays on its worker costs nothing, and one that moves is
    sent as its own bytes only.
    """
    return {field: values[start:stop] for field, values in laid_out.items()}


def buffer_positions(seed: int, index: int, rows: int) -> np.ndarray:
    """Where each row of buffer ``index`` goes: ``where[j]`` for row ``j`` of its rows from
    every partition, concatenated in partition order (a seeded shuffle of the buffer)."""
    order = np.random.default_rng(seed + index).permutation(rows)
    where = np.empty_like(order)
    where[order] = np.arange(rows)
    return where


def slice_positions(
    column: np.ndarray, offsets: np.ndarray, where: np.ndarray, parts: Sequence[int]
) -> np.ndarray:
    """Positions in the buffer of the rows of one fetched slice.

    The slice holds the buffer's rows from ``parts`` (ascending), part after part;
    ``column[p]`` rows of partition ``p`` begin at ``offsets[p]`` in the concatenation that
    ``where`` (:func:`buffer_positions`) shuffles.
    """
    chosen = np.asarray(parts, dtype=np.int64)
    sizes = column[chosen]
    dest = np.repeat(offsets[chosen] - (np.cumsum(sizes) - sizes), sizes)
    dest += np.arange(len(dest))
    return where[dest]


def fetch_rounds(buffer_bytes: Sequence[int], limit: int = FETCH_ROUND_BYTES) -> list[list[int]]:
    """Positions of consecutive buffers fetched together: at most ``limit`` bytes a round,
    at least one buffer."""
    rounds: list[list[int]] = []
    size = 0
    for i, nbytes in enumerate(buffer_bytes):
        if not rounds or size + nbytes > limit:
            rounds.append([])
            size = 0
        rounds[-1].append(i)
        size += nbytes
    return rounds


def pack_buffers(
    indices: Sequence[int],
    seed: int,
    staging_name: str,
    fields: dict[str, list[int]],
    columns: Sequence[np.ndarray],
    sources: Sequence[Sequence[tuple[str, int, int, Sequence[int]]]],
    abort_event: str | None = None,
    dtypes: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Shuffle buffers' rows straight into THIS worker's vineyardd, a round after another.

    One task packs all the buffers of its worker (of one of its threads), in rounds of as
    many buffers as fit in :data:`FETCH_ROUND_BYTES`. A round fetches its rows with one
    scheduler query and one request per worker that holds them, and writes its buffers with
    one round of vineyardd calls (:func:`~dvml.store.tensors.write_buffers`), instead of a
    task, a query, a request and seven vineyardd calls per buffer (at hundreds of buffers
    those were most of the pack).

    Parameters
    ----------
    indices : sequence of int
        The buffers' indices. Buffer ``b``'s rows are shuffled with ``default_rng(seed +
        b)``, as the concatenation of its rows from every partition in partition order.
    seed : int
        The run's seed.
    staging_name : str
        This attempt's, carried by every buffer it stages (see
        :func:`~dvml.store.publish.staging_name`).
    fields : dict of str to list of int
        Each field's shape after the row axis.
    columns : sequence of numpy.ndarray
        Per buffer ``b``, ``Layout.counts[:, b]``: its rows from each partition.
    sources : sequence of sequence of (str, int, int, sequence of int)
        Per buffer, ``(key, start, stop, parts)``: rows ``start:stop`` of the split group
        held under Dask key ``key`` are the buffer's rows from ``parts``, part after part.
        They are fetched from the worker that holds the key
        (:func:`~dvml.preprocess.exchange.fetch_slices`).
    abort_event : str, optional
        A Dask event set when the run failed elsewhere: a pack waiting for rows a dead worker
        took along stops waiting.
    dtypes : dict of str to str, optional
        Each field's dtype (:func:`storage_dtypes`); None: all float32.

    Returns
    -------
    list of dict
        Per buffer, its index, rows, instance, worker, host and fields.
    """
    from distributed import get_worker

    worker = get_worker()
    where = {"worker": worker.address, "worker_name": str(worker.name),
             "host": worker_host(worker.address)}  # fmt: skip
    types = {f: np.dtype((dtypes or {}).get(f, np.float32)) for f in fields}
    row_bytes = sum(math.prod(shape) * types[f].itemsize for f, shape in fields.items())
    columns = [np.asarray(c, dtype=np.int64) for c in columns]
    out = []
    for chosen in fetch_rounds([int(c.sum()) * row_bytes for c in columns]):
        requests = [(key, a, b) for i in chosen for key, a, b, _ in sources[i]]
        owners = [(i, j) for i in chosen for j in range(len(sources[i]))]
        pieces: dict[int, list[tuple[Sequence[int], dict[str, np.ndarray]]]] = {}
        for r, piece in fetch_slices(requests, abort_event):
            i, j = owners[r]
            pieces.setdefault(i, []).append((sources[i][j][3], piece))
        records = _write_buffers(
            [indices[i] for i in chosen], seed, staging_name, fields,
            [columns[i] for i in chosen], [pieces.pop(i, []) for i in chosen], types,
        )  # fmt: skip
        for i, record in zip(chosen, records, strict=True):
            out.append({"index": indices[i], "rows": int(columns[i].sum()), **record, **where})
    return out


def _write_buffers(
    indices: Sequence[int],
    seed: int,
    staging_name: str,
    fields: dict[str, list[int]],
    columns: Sequence[np.ndarray],
    pieces: Sequence[Sequence[tuple[Sequence[int], dict[str, np.ndarray]]]],
    types: dict[str, np.dtype[Any]] | None = None,
) -> list[dict[str, Any]]:
    """Write buffers' fetched rows, each shuffled, into the local vineyardd in one round."""
    rows = [int(column.sum()) for column in columns]

    def scatter(b: int, out: dict[str, np.ndarray]) -> None:
        where = buffer_positions(seed, indices[b], rows[b])
        offsets = np.cumsum(columns[b]) - columns[b]  # where each partition's rows begin
        for parts, piece in pieces[b]:
            dest = slice_positions(columns[b], offsets, where, parts)
            for field, buffer in out.items():
                buffer[dest] = piece[field]

    kinds = types or {}
    specs = [
        {
            field: ((n, *shape), kinds.get(field, np.dtype(np.float32)))
            for field, shape in fields.items()
        }
        for n in rows
    ]
    try:
        return write_buffers(specs, scatter, staging_name=staging_name)
    except VineyardMemoryError:
        if len(specs) == 1:
            raise

    # No room for all of them at once: one at a time, so that those that fit are written and
    # the error names the one buffer that does not fit (what buffer_size is about).
    def alone(b: int) -> dict[str, Any]:
        return write_buffers([specs[b]], lambda _, out: scatter(b, out), staging_name)[0]

    return [alone(b) for b in range(len(specs))]
