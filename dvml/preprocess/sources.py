"""Turn what the user gives into a list of Dask delayed *prepared parts*.

Accepted sources: a Dask or pandas DataFrame, a dict of Dask/numpy arrays, and data in files
at any path or fsspec URL (:mod:`dvml.preprocess.locations`): Parquet (a data set directory
too, hive partitions kept), CSV, a folder of images (labels from sub-folder names), and
WebDataset tar shards (``shards-{0000..0147}.tar``, globs, lists, ``shard-%06d.tar``). Only
file names and small metadata are read on the client; every worker reads its own files from
the store, and decoding happens in the Dask tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError
from dvml.placement.routes import batch_sizes
from dvml.preprocess.fusion import one_task_per_block
from dvml.preprocess.images import channels_of_image, list_image_folder
from dvml.preprocess.locations import Location, locate, open_binary, read_table
from dvml.preprocess.shards import first_image_member
from dvml.preprocess.string_cells import restore_array_cells
from dvml.preprocess.tasks import (
    ClientPart,
    labels_of,
    prepare_arrays,
    prepare_batch,
    prepare_image_files,
    prepare_table,
    prepare_tar_shard,
)

# More x inputs than this, each a single column, is most likely one input meant as a list.
MANY_INPUTS = 16

__all__ = ["SourceParts", "describe_source", "is_file_source", "normalize_x", "source_parts"]

IMAGE_CHUNK = 256  # images decoded per task


@dataclasses.dataclass
class SourceParts:
    """The delayed prepared parts of a source and the names the summary records.

    Each of ``parts`` computes a batch: a list of the prepared parts of one or more
    consecutive partitions (:func:`~dvml.preprocess.tasks.prepare_batch`).
    """

    parts: list[Any]
    x_names: list[list[str]]
    y: str | list[str]  # several label columns: a multi-output model
    description: str
    image_size: tuple[int, int] | None = None
    shards: bool = False
    channels: int | None = None  # an image source's, given or taken from its first image


def normalize_x(x: str | Sequence[str | Sequence[str]]) -> list[list[str]]:
    """x as input groups: ``"px"`` → ``[["px"]]``; ``["a", "b"]`` → two inputs ``[["a"],
    ["b"]]`` (a multi-input model); ``[["a", "b"]]`` → one input made of columns a and b."""
    if isinstance(x, str):
        return [[x]]
    if not isinstance(x, Sequence) or not x:
        raise ArgumentTypeError(
            f"x must be a column name, a list of names (one input each) or a list of lists "
            f"(columns of one input). Received: x={x!r}."
        )
    groups = []
    for item in x:
        group = [item] if isinstance(item, str) else list(item)
        if not group or not all(isinstance(c, str) for c in group):
            raise ArgumentTypeError(f"x entries must be column names. Received: x={x!r}.")
        groups.append(group)
    return groups


def describe_source(source: Any) -> str:
    """A short text for the summary's ``source_table``."""
    import pandas as pd

    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    if is_file_source(source):
        return ", ".join(os.fspath(s) for s in source)
    if isinstance(source, pd.DataFrame):
        return f"pandas.DataFrame({len(source)} rows)"
    if isinstance(source, dict):
        return "arrays(" + ", ".join(sorted(source)) + ")"
    name = type(source).__module__.split(".")[0] + "." + type(source).__name__
    n = getattr(source, "npartitions", None)
    return f"{name}({n} partitions)" if n else name


def is_file_source(source: Any) -> bool:
    """Whether ``source`` names data in files: a path, a URL, a pattern or a list of them."""
    if isinstance(source, str | os.PathLike):
        return True
    return (
        isinstance(source, list | tuple)
        and bool(source)
        and all(isinstance(s, str | os.PathLike) for s in source)
    )


def source_parts(
    source: Any,
    y: str | Sequence[str] | None,
    x: Any,
    n_targets: int,
    on_invalid: str,
    image_size: tuple[int, int] | None,
    channels: int | None,
    normalizing_const: float = 1.0,
    threads: int = 1,
    *,
    storage_options: dict[str, Any] | None = None,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] = "cls",
) -> SourceParts:
    """Build the delayed prepared parts of ``source`` (nothing is computed here).

    ``normalizing_const`` lets the parts count values that overflow float32 once normalized.
    ``threads`` (of the cluster) bounds how many small partitions one task prepares.
    ``storage_options`` go to fsspec where files are listed and read; ``image_ext`` and
    ``label_ext`` pick the members of tar shard samples. ``channels=None`` takes an image
    source's from its first image (:func:`source_channels`).
    """
    import pandas as pd

    if on_invalid not in ("raise", "drop"):
        raise ArgumentError(f"on_invalid must be 'raise' or 'drop'. Received: {on_invalid!r}.")
    desc = describe_source(source)
    if is_file_source(source):
        where = locate(source, storage_options)
        if where.kind == "images":
            return _image_folder(where, image_size, channels, desc)
        if where.kind == "shards":
            return _tar_shards(where, image_size, channels, desc, (image_ext, label_ext))
        source = read_table(where)
    if isinstance(source, pd.DataFrame):
        if len(source) == 0:
            raise DataError("The source DataFrame is empty: there is nothing to preprocess.")
        invalid = (on_invalid, normalizing_const)
        found = _pandas_array_cells(source, y, x, invalid, desc, 2 * n_targets)
        if found is not None:
            return found
        import dask
        import dask.dataframe as dd

        # Dask would turn object columns (array-valued cells) into strings.
        with dask.config.set({"dataframe.convert-string": False}):
            source = dd.from_pandas(source, npartitions=max(1, min(2 * n_targets, len(source))))
    if _is_dask_frame(source):
        return _table(source, y, x, (on_invalid, normalizing_const), desc)
    if isinstance(source, dict):
        return _arrays(source, y, x, (on_invalid, normalizing_const), desc, threads)
    raise ArgumentTypeError(
        "source must be a Dask or pandas DataFrame, a dict of arrays, or a path or URL (or a "
        "list of them) of Parquet/CSV data, an image folder or tar shards. Received: "
        f"{type(source).__name__}."
    )


def _is_dask_frame(source: Any) -> bool:
    """Whether ``source`` is a Dask DataFrame, without importing dask.dataframe (~0.5 s of
    the first pack's client time) where nothing made one."""
    dd = sys.modules.get("dask.dataframe")
    return dd is not None and isinstance(source, dd.DataFrame)


def _batch_of_one(fn: Any, *args: Any) -> Any:
    """A Delayed batch of the one prepared part ``fn(*args)``."""
    from dask import delayed

    return delayed(prepare_batch)(fn, len(args), *args)


def _need(value: Any, what: str) -> Any:
    if value is None:
        raise ArgumentError(f"{what} is required for this kind of source. Received: None.")
    return value


def _table(ddf: Any, y: Any, x: Any, invalid: tuple[str, float], desc: str) -> SourceParts:
    y, groups = _check_table(list(ddf.columns), y, x)
    ddf = restore_array_cells(ddf, [c for g in groups for c in g])
    if len(groups) > MANY_INPUTS and all(len(g) == 1 for g in groups):
        # Each input is its own tensor per buffer: hundreds of inputs pack and train far
        # slower than one input of hundreds of columns, which is what a flat list of numeric
        # columns usually means.
        warnings.warn(
            f"x names {len(groups)} columns, each its own model input (a multi-input model). "
            f"For ONE input made of these columns pass x=[[{groups[0][0]!r}, ...]] (a list "
            "inside the list).",
            UserWarning,
            stacklevel=5,  # the caller of training_preprocessor
        )
    prepare = functools.partial(
        prepare_table, x_groups=groups, y=y, on_invalid=invalid[0], normalizing_const=invalid[1]
    )
    parts = one_task_per_block("prepare_table", prepare, [[p] for p in ddf.to_delayed()])
    return SourceParts(parts, groups, y, desc)


def normalize_y(y: Any) -> str | list[str]:
    """The label column, or several (a list of names, or MADlib's ``'a, b'``): one output of
    a multi-output model each."""
    y = _need(y, "y (the label column)")
    if isinstance(y, str) and "," in y and not y.startswith(","):
        y = [c.strip() for c in y.split(",")]
    if isinstance(y, str):
        return y
    names = list(y) if isinstance(y, Sequence) else []
    if not names or not all(isinstance(c, str) for c in names) or len(set(names)) < len(names):
        raise ArgumentTypeError(
            f"y must be a column name, or a list of distinct names (one output each). "
            f"Received: y={y!r}."
        )
    return names[0] if len(names) == 1 else names


def _check_table(columns: list[Any], y: Any, x: Any) -> tuple[str | list[str], list[list[str]]]:
    """The label column(s) and the x groups, once every column they name is known."""
    y = normalize_y(y)
    ys = [y] if isinstance(y, str) else y
    groups = normalize_x(_need(x, "x (the feature column or columns)"))
    missing = [c for c in [*ys, *(c for g in groups for c in g)] if c not in columns]
    if missing:
        raise DataError(f"Columns {missing} are missing from the source. Available: {columns}.")
    return y, groups


def _pandas_array_cells(
    frame: Any, y: Any, x: Any, invalid: tuple[str, float], desc: str, n_parts: int
) -> SourceParts | None:
    """A pandas frame whose x includes a column of array cells, stacked here on the client.

    None for any other frame (it goes through ``dd.from_pandas``). Shipping a column of
    hundreds of thousands of small arrays to the workers pickles, hashes and stacks every
    cell one by one; stacked once here into
    one block per x input (one copy, :func:`dvml.preprocess.encode.x_to_array`), the parts
    are plain numpy slices prepared like a dict of arrays, scattered to the workers by the
    pack (:class:`~dvml.preprocess.tasks.ClientPart`): client to worker, one copy, never
    through the scheduler.
    """
    from dvml.preprocess.encode import has_array_cells, x_to_array

    if x is None or y is None:
        return None
    groups = normalize_x(x)
    singles = [g[0] for g in groups if len(g) == 1 and g[0] in frame.columns]
    if not any(frame[c].dtype == object and has_array_cells(frame[c]) for c in singles):
        return None
    y, groups = _check_table(list(frame.columns), y, x)
    xs = [x_to_array(frame, group) for group in groups]
    ys = [labels_of(frame, c) for c in ([y] if isinstance(y, str) else y)]
    labels = ys[0]
    names = [",".join(group) for group in groups]
    n = len(labels)
    k = max(1, min(n_parts, n))  # as many parts as dd.from_pandas would make
    bounds = [n * i // k for i in range(k + 1)]
    # Scattered to the workers by the pack, not embedded in the graph (ClientPart).
    parts: list[Any] = [
        ClientPart(
            prepare_arrays,
            (
                [a[lo:hi] for a in xs],
                labels[lo:hi],
                names,
                str(y),
                *invalid,
                [m[lo:hi] for m in ys[1:]],
            ),
        )
        for lo, hi in itertools.pairwise(bounds)
    ]
    return SourceParts(parts, groups, y, desc)


def _arrays(
    source: dict[str, Any],
    y: Any,
    x: Any,
    invalid: tuple[str, float],
    desc: str,
    threads: int,
) -> SourceParts:
    import dask.array as da

    y = _need(y, "y (the key of the label array)")
    if not isinstance(y, str):
        raise ArgumentTypeError(
            f"For a dict of arrays, y names one label array. Received: y={y!r}. Pass a "
            "DataFrame for several label columns (a multi-output model)."
        )
    groups = normalize_x(_need(x, "x (the key of the feature array)"))
    names = [g[0] for g in groups]
    if any(len(g) != 1 for g in groups):
        raise ArgumentTypeError(
            f"For a dict of arrays, x names arrays, one per input. Received: x={x!r}."
        )
    missing = [k for k in [y, *names] if k not in source]
    if missing:
        raise DataError(f"Arrays {missing} are missing. Available: {sorted(source)}.")
    labels = da.asarray(source[y])
    xs = [da.asarray(source[n]) for n in names]
    for n, arr in zip(names, xs, strict=True):
        if arr.shape[0] != labels.shape[0]:
            raise DataError(f"Array {n!r} has {arr.shape[0]} rows but {y!r} has {labels.shape[0]}.")
    if labels.shape[0] == 0:
        raise DataError("The source arrays are empty: there is nothing to preprocess.")
    chunks = labels.chunks[0]
    xs = [a.rechunk({0: chunks, **{i: -1 for i in range(1, a.ndim)}}) for a in xs]
    x_blocks = [a.to_delayed().reshape(len(chunks), -1)[:, 0] for a in xs]
    y_blocks = labels.rechunk({0: chunks}).to_delayed().ravel()
    prepare = functools.partial(
        _prepare_block_arrays, x_names=names, y=y, on_invalid=invalid[0],
        normalizing_const=invalid[1],
    )  # fmt: skip
    blocks = [[*(xb[i] for xb in x_blocks), y_blocks[i]] for i in range(len(chunks))]
    row_bytes = labels.dtype.itemsize + sum(a.dtype.itemsize * math.prod(a.shape[1:]) for a in xs)
    known = not any(math.isnan(c) for c in chunks)
    sizes = batch_sizes([c * row_bytes for c in chunks] if known else None, len(chunks), threads)
    parts = one_task_per_block("prepare_arrays", prepare, blocks, sizes)
    return SourceParts(parts, groups, y, desc)


def _prepare_block_arrays(*blocks: Any, **kwargs: Any) -> Any:
    """:func:`prepare_arrays` of one block: x blocks, then the labels' block."""
    return prepare_arrays(list(blocks[:-1]), blocks[-1], **kwargs)


def source_channels(
    where: Location, first: str, image_ext: str | Sequence[str] | None = None
) -> int:
    """The channels of an image source whose ``channels`` was not given: its first image's
    (1 when grey, else 3), read on the client (one image's header, or a shard up to its first
    image), so a grey data set is not stored three times over."""
    with open_binary(first, where.storage_options or None) as f:
        if where.kind == "images":
            return channels_of_image(f, first)
        data = first_image_member(f, first, image_ext)
    if data is None:
        raise DataError(
            f"The first shard holds no image to take the channels from. Received: {first!r}. "
            "Pass channels=1 (grey) or channels=3 (RGB), or image_ext= naming the images."
        )
    return channels_of_image(io.BytesIO(data), f"{first} (its first image)")


def _image_folder(
    where: Location, image_size: tuple[int, int] | None, channels: int | None, desc: str
) -> SourceParts:
    size = _need(image_size, "image_size=(height, width)")
    if where.remote:
        paths, labels = where.paths, where.labels
    else:
        # The local listing's own checks and order (Keras' image_dataset_from_directory).
        paths, labels = list_image_folder(where.root or where.paths[0])
    options = where.storage_options or None
    if channels is None and paths:
        channels = source_channels(where, paths[0])
    parts = [
        _batch_of_one(
            prepare_image_files,
            paths[i : i + IMAGE_CHUNK],
            labels[i : i + IMAGE_CHUNK],
            tuple(size),
            channels,
            options,
        )
        for i in range(0, len(paths), IMAGE_CHUNK)
    ]
    return SourceParts(parts, [["image"]], "label", desc, tuple(size), channels=channels)


def _tar_shards(
    where: Location,
    image_size: tuple[int, int] | None,
    channels: int | None,
    desc: str,
    exts: tuple[Any, Any],
) -> SourceParts:
    size = _need(image_size, "image_size=(height, width)")
    options = where.storage_options or None
    if channels is None and where.paths:
        channels = source_channels(where, where.paths[0], exts[0])
    parts = [
        _batch_of_one(prepare_tar_shard, s, tuple(size), channels, exts[0], exts[1], options)
        for s in where.paths
    ]
    return SourceParts(
        parts, [["image"]], "label", desc, tuple(size), shards=True, channels=channels
    )
