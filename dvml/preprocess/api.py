"""``training_preprocessor`` and ``validation_preprocessor``: MADlib's preprocessors on Dask.

They normalize x, one-hot encode y, shuffle, pack rows into buffers and put every buffer into
the vineyardd of the worker that the distribution rules chose, balanced so every worker holds
the same number of rows (within one row).
"""

from __future__ import annotations

import datetime
import math
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml._version import __version__
from dvml.cluster.pinned import NannyWatch
from dvml.cluster.spec import parse_memory
from dvml.cluster.standby import warm_trainers
from dvml.cluster.workers import current_client, discover_workers
from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError, DatasetExistsError
from dvml.names import INTERNAL_PREFIX, check_name
from dvml.placement.planner import plan_layout
from dvml.placement.rules import DistributionRules, describe_resolution, resolve_rules
from dvml.preprocess.encode import check_normalizing_const, class_values_of
from dvml.preprocess.graph import compute_stats, pack_and_publish
from dvml.preprocess.sources import source_parts
from dvml.preprocess.tasks import storage_dtypes
from dvml.store.datasets import Dataset, describe, exists
from dvml.store.leases import check_not_leased

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["INTERNAL_PREFIX", "training_preprocessor", "validation_preprocessor"]


def training_preprocessor(
    source: Any,
    y: str | None = None,
    x: str | Sequence[Any] | None = None,
    buffer_size: int | None = None,
    normalizing_const: float = 1.0,
    num_classes: int | None = None,
    distribution_rules: Any = "all_workers",
    *,
    name: str,
    overwrite: bool = False,
    force: bool = False,
    on_invalid: str = "raise",
    image_size: tuple[int, int] | None = None,
    channels: int | None = None,
    seed: int | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] | None = None,
    compact: bool | None = None,
    client: Client | None = None,
) -> Dataset:
    """Preprocess ``source`` into a placed, balanced, named dataset in vineyard.

    Parameters
    ----------
    source : Dask/pandas DataFrame, dict of arrays, str, or list of str
        A DataFrame; a dict of Dask or numpy arrays (``{"image": x, "label": y}``); or data in
        files, at a local path or any fsspec URL (``s3://``, ``gs://``, ``az://``,
        ``https://``, ``file://``): Parquet or CSV files (globs allowed), a Parquet data set
        directory (hive partition columns kept), a folder of CSV files, a folder of images
        with one sub-folder per label, or WebDataset tar shards (``.tar``, ``.tar.gz``,
        ``.tgz``) as a brace pattern (``"shards/train-{0000..0147}.tar"``), a glob, a list,
        or webdataset's ``ShardWriter`` pattern (``"shard-%06d.tar"``). A directory is read
        by what it holds. Each worker reads its own files straight from the store.
    y : str
        The label column (for images: ignored, labels come from folders or ``.cls`` files).
    x : str or list
        One column (scalar or array-valued cells); a list of columns, one model input each;
        or ``[["a", "b", "c"]]`` for one input made of several numeric columns.
    buffer_size : int, optional
        Rows per packed buffer. When None, rows are spread evenly over the target workers
        (as MADlib does), bounded by ``dvml.preprocess.max-buffer-bytes`` per buffer.
    normalizing_const : float
        x is divided by this (e.g. 255 for 8-bit images). Must be positive.
    num_classes : int, optional
        Length of the one-hot encoding; pads for classes not yet seen.
    distribution_rules : str, list, DataFrame or DistributionRules
        ``"all_workers"`` (default), ``"gpu_workers"``, worker addresses or names, host names,
        a DataFrame with a ``worker`` or ``host`` column, or one worker.
    name : str
        Name of the dataset in vineyard (required, keyword only: MADlib's ``output_table``),
        e.g. ``name="digits_train"``.
    overwrite : bool
        Replace an existing dataset of the same name (atomically, after the new one is
        complete). Until then both are in vineyard: replacing needs room for the old and the
        new dataset at once (drop the old one first to avoid it). Refused with
        DatasetInUseError while a job (a fit) reads it (:mod:`dvml.store.leases`).
    force : bool
        Overwrite even a dataset a running job reads: stop that job first, or its trainers
        read freed memory.
    on_invalid : {"raise", "drop"}
        What to do with rows whose x holds NaN or inf.
    image_size : (int, int), optional
        Height and width images are resized to (required for image sources).
    channels : {1, 3}, optional
        1 (grey) or 3 (RGB) for image sources. Default: the first image's (1 when it is grey,
        else 3), so a grey data set is not stored three times over; the summary's
        ``channels`` records the choice. Pass it when the images mix grey and colour.
    seed : int, optional
        Shuffle seed (config ``dvml.preprocess.seed``).
    progress : bool
        Show Dask's progress bar while the source is read, decoded and validated.
    storage_options : dict, optional
        For fsspec, where ``source`` is a URL: credentials, endpoint
        (``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}`` for an
        S3-compatible store). Default: config ``dvml.storage-options``. Sent to the workers
        with the tasks; never recorded in the summary.
    image_ext : str or list of str, optional
        Tar shards: the extension of each sample's image (``"jpg"``, ``"seg.png"``). Default:
        the sample's one image member; a sample with several is refused.
    label_ext : str or list of str, optional
        Tar shards: the extension of the label (default ``"cls"``, decoded as an int as
        webdataset does). A ``txt`` member is a caption and is used only when asked for.
    compact : bool, optional
        Store uint8 x as uint8 (not normalized) and y as class indices (the smallest unsigned
        type), about a quarter of the float32 format; readers normalize and one-hot encode on
        the fly (:mod:`dvml.resolve`). Default: config ``dvml.preprocess.compact`` (false).
        The summary's ``storage`` records the format.
    client : distributed.Client, optional
        Default: the current default client.

    Returns
    -------
    Dataset
        The published dataset; ``.summary`` holds MADlib's summary fields and the placement.

    Notes
    -----
    While the data packs, each target worker without a GPU starts its standby trainer (a
    process that imports TensorFlow at a low priority), so that the first :func:`dvml.fit`
    on this set does not pay for it; ``dvml.train.standby-trainer: false`` turns it off.
    """
    return _preprocess(
        kind="training",
        source=source,
        y=y,
        x=x,
        buffer_size=buffer_size,
        normalizing_const=normalizing_const,
        num_classes=num_classes,
        distribution_rules=distribution_rules,
        name=name,
        overwrite=overwrite,
        force=force,
        on_invalid=on_invalid,
        image_size=image_size,
        channels=channels,
        seed=seed,
        progress=progress,
        client=client,
        training=None,
        files=_files_options(storage_options, image_ext, label_ext),
        compact=bool(config.get("preprocess.compact", compact)),
    )


def validation_preprocessor(
    source: Any,
    y: str | None = None,
    x: str | Sequence[Any] | None = None,
    training: str | Dataset | None = None,
    buffer_size: int | None = None,
    distribution_rules: Any = None,
    *,
    name: str,
    overwrite: bool = False,
    force: bool = False,
    on_invalid: str = "raise",
    seed: int | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] | None = None,
    client: Client | None = None,
) -> Dataset:
    """Preprocess a validation set with the class values and normalization of ``training``.

    The training set's class values, ``num_classes``, ``normalizing_const``, image size,
    shard extensions (unless ``image_ext``/``label_ext`` are given) and (unless
    ``distribution_rules`` is given) distribution rules are reused; labels that the training
    set never saw are refused. ``source`` and ``storage_options`` are as for
    :func:`training_preprocessor`.
    """
    if training is None:
        raise ArgumentError(
            "training= (the training dataset or its name) is required. Received: None."
        )
    client = current_client(client)
    train = training if isinstance(training, Dataset) else describe(training, client)
    s = train.summary
    image = s.get("image_size")
    return _preprocess(
        kind="validation",
        source=source,
        y=y,
        x=x,
        buffer_size=buffer_size,
        normalizing_const=s["normalizing_const"],
        num_classes=s["num_classes"],
        distribution_rules=distribution_rules or s["distribution_rules"]["given"],
        name=name,
        overwrite=overwrite,
        force=force,
        on_invalid=on_invalid,
        image_size=tuple(image) if image else None,
        channels=s.get("channels"),
        seed=seed,
        progress=progress,
        client=client,
        training=train,
        files=_files_options(
            storage_options,
            image_ext if image_ext is not None else s.get("image_ext"),
            label_ext if label_ext is not None else s.get("label_ext"),
        ),
        # a validation set is stored as its training set is
        compact=bool((s.get("storage") or {}).get("compact", False)),
    )


def _files_options(
    storage_options: dict[str, Any] | None, image_ext: Any, label_ext: Any
) -> dict[str, Any]:
    """How files are read: fsspec options (config ``dvml.storage-options`` by default) and
    the members of shard samples."""
    options = config.get("storage-options", storage_options)
    if options is not None and not isinstance(options, dict):
        raise ArgumentTypeError(
            "storage_options must be a dict of fsspec options, such as {'key': ..., 'secret': "
            f"...}}. Received: {type(options).__name__}."
        )
    return {
        "storage_options": dict(options or {}),
        "image_ext": image_ext,
        "label_ext": label_ext if label_ext is not None else "cls",
    }


def _preprocess(
    *,
    kind: str,
    source: Any,
    y: str | None,
    x: Any,
    buffer_size: int | None,
    normalizing_const: float,
    num_classes: int | None,
    distribution_rules: Any,
    name: str | None,
    overwrite: bool,
    force: bool,
    on_invalid: str,
    image_size: tuple[int, int] | None,
    channels: int | None,
    seed: int | None,
    progress: bool,
    client: Client | None,
    training: Dataset | None,
    files: dict[str, Any],
    compact: bool = False,
) -> Dataset:
    name = _check_arguments(name, buffer_size, normalizing_const, num_classes, channels)
    client = current_client(client)
    seed = int(config.get("preprocess.seed", seed))
    rules = DistributionRules.parse(distribution_rules)
    targets = resolve_rules(rules, discover_workers(client))
    if not overwrite and exists(name, client):
        raise DatasetExistsError(
            f"A dataset named {name!r} already exists. Pass overwrite=True to replace it, or "
            "choose another name."
        )
    if overwrite:
        # A fit reading it holds a lease (dvml.store.leases): refuse before packing anything;
        # the replacement itself checks again.
        check_not_leased(name, "overwrite", force)

    if training is None:
        # A training set: its workers run the next fit's trainers. Their standby trainers
        # import TensorFlow now, at a low priority, while the data packs.
        warm_trainers(client, targets)
    threads = sum(client.nthreads().values())
    src = source_parts(
        source, y, x, len(targets), on_invalid, image_size, channels, float(normalizing_const),
        threads, **files,
    )  # fmt: skip
    if not src.parts:
        raise DataError("The source has no partitions: there is nothing to preprocess.")
    # A target whose host dies while the data packs fails the call in seconds, not after
    # the restart timeout (dvml.cluster.pinned).
    watch = NannyWatch(client, targets)
    prepared, stats, sizes = compute_stats(client, src.parts, progress, watch)
    try:
        return _plan_and_pack(
            kind=kind,
            src=src,
            prepared=prepared,
            sizes=sizes,
            stats=stats,
            buffer_size=buffer_size,
            normalizing_const=normalizing_const,
            num_classes=num_classes,
            rules=rules,
            targets=targets,
            name=name,
            overwrite=overwrite,
            force=force,
            on_invalid=on_invalid,
            channels=src.channels,
            seed=seed,
            client=client,
            training=training,
            shard_exts=(files["image_ext"], files["label_ext"]) if src.shards else None,
            compact=compact,
            watch=watch,
        )
    finally:
        # Parts not yet handed to the pack graph (which empties the list) are freed here.
        client.cancel(prepared)


def _plan_and_pack(
    *,
    kind: str,
    src: Any,
    prepared: list[Any],
    sizes: list[int],
    stats: list[dict[str, Any]],
    buffer_size: int | None,
    normalizing_const: float,
    num_classes: int | None,
    rules: DistributionRules,
    targets: list[Any],
    name: str,
    overwrite: bool,
    force: bool,
    on_invalid: str,
    channels: int | None,
    seed: int,
    client: Client,
    training: Dataset | None,
    shard_exts: tuple[Any, Any] | None = None,
    compact: bool = False,
    watch: NannyWatch | None = None,
) -> Dataset:
    if on_invalid == "raise":
        _raise_if_not_finite(stats)
    rows = [s["rows"] for s in stats]
    if sum(rows) == 0:
        raise DataError(
            "Every row of the source was empty or dropped: there is nothing to preprocess. "
            f"Dropped rows: {sum(s['dropped'] for s in stats)}."
        )
    x_shapes = _common_shapes(stats, src.x_names)
    labels = [v for s in stats for v in s["labels"]]
    if training is None:
        class_values = class_values_of(labels)
    else:
        class_values = training.summary["class_values"]
        _check_like_training(training, labels, x_shapes, class_values)
    n_classes = num_classes if num_classes is not None else len(class_values)
    if n_classes < len(class_values):
        raise DataError(
            f"num_classes={n_classes} is smaller than the {len(class_values)} distinct labels "
            f"found ({class_values[:10]}). Raise num_classes or leave it as None."
        )
    dtypes = storage_dtypes(_common_dtypes(stats), n_classes, compact)
    row_bytes = _row_bytes(x_shapes, n_classes, dtypes)
    max_bytes = _max_buffer_bytes()
    layout = plan_layout(
        rows, [t.address for t in targets], buffer_size, row_bytes, max_bytes, seed
    )
    by_address = {t.address: t for t in targets}
    buffer_targets = [by_address[b.worker] for b in layout.buffers]

    summary = {
        "kind": kind,
        "dataset_id": uuid.uuid4().hex,
        "source_table": src.description,
        "output_table": name,
        "dependent_varname": src.y,
        "independent_varname": src.x_names,
        "dependent_vartype": type(class_values[0]).__name__,
        "class_values": class_values,
        f"{src.y}_class_values": class_values,  # MADlib's name for class_values
        "num_classes": n_classes,
        "buffer_size": layout.buffer_size,
        "normalizing_const": float(normalizing_const),
        "x_shapes": x_shapes,
        "y_shape": [n_classes],
        "rows": sum(rows),
        "dropped_rows": sum(s["dropped"] for s in stats),
        "invalid_counts": _sum_invalid(stats),
        "distribution_rules": describe_resolution(rules, targets),
        # MADlib records where the data went as __internal_gpu_config__: 'all_segments' or
        # the segments; dvml's segments are workers.
        "__internal_gpu_config__": "all_segments"
        if rules.kind == "all_workers"
        else [t.name for t in targets],
        "image_size": list(src.image_size) if src.image_size else None,
        "channels": channels,
        "seed": seed,
        "storage": _storage(dtypes),
        **({"image_ext": shard_exts[0], "label_ext": shard_exts[1]} if shard_exts else {}),
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dvml_version": __version__,
    }
    if training is not None:
        summary["training_dataset"] = {
            "name": training.name,
            "dataset_id": training.summary["dataset_id"],
        }
    split_args = {
        "class_values": class_values,
        "num_classes": n_classes,
        "normalizing_const": float(normalizing_const),
        "x_shapes": x_shapes,
        "field_dtypes": dtypes,
    }
    return pack_and_publish(
        client,
        prepared,
        sizes,
        layout.counts,
        buffer_targets,
        split_args,
        seed,
        name,
        "dataset",
        summary,
        overwrite,
        force,
        watch,
    )


def _common_dtypes(stats: list[dict[str, Any]]) -> list[str]:
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


def _row_bytes(x_shapes: list[list[int]], n_classes: int, dtypes: dict[str, str] | None) -> int:
    import numpy as np

    if dtypes is None:
        return 4 * (sum(math.prod(s) for s in x_shapes) + n_classes)
    x = sum(math.prod(s) * np.dtype(dtypes[f"x_{k}"]).itemsize for k, s in enumerate(x_shapes))
    return int(x + np.dtype(dtypes["y"]).itemsize)


def _storage(dtypes: dict[str, str] | None) -> dict[str, Any]:
    """The summary's record of the packed format, read by :mod:`dvml.resolve`."""
    if dtypes is None:
        return {"compact": False, "y": "one_hot"}
    x = [dtypes[f] for f in sorted((f for f in dtypes if f != "y"), key=lambda f: int(f[2:]))]
    return {"compact": True, "x_dtypes": x, "y": "index", "y_dtype": dtypes["y"]}


def _check_arguments(
    name: Any, buffer_size: Any, normalizing_const: Any, num_classes: Any, channels: Any
) -> str:
    if name is None:
        raise ArgumentError(
            "name= is required: the name the dataset gets in vineyard (MADlib's output_table), "
            "by which fit, evaluate and predict find it. Received: name=None. For example "
            "name='digits_train'."
        )
    check_name(name, internal=True)
    if buffer_size is not None and (
        isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0
    ):
        raise ArgumentError(f"buffer_size must be a positive int. Received: {buffer_size!r}.")
    check_normalizing_const(normalizing_const)
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
    ):
        raise ArgumentError(f"num_classes must be a positive int. Received: {num_classes!r}.")
    if channels is not None and (isinstance(channels, bool) or channels not in (1, 3)):
        raise ArgumentError(
            f"channels must be 1 (grey), 3 (RGB) or None (the first image's). Received: "
            f"channels={channels!r}."
        )
    return str(name)


def _common_shapes(stats: list[dict[str, Any]], x_names: list[list[str]]) -> list[list[int]]:
    shapes: list[list[int]] | None = None
    for s in stats:
        if s["rows"] == 0:
            continue
        if shapes is None:
            shapes = s["x_shapes"]
        elif s["x_shapes"] != shapes:
            raise DataError(
                f"x has different shapes across partitions: {shapes} and {s['x_shapes']} "
                f"(inputs {x_names}). Every row must have the same shape; resize or pad first."
            )
    if shapes is None:
        raise DataError("Every partition of the source is empty: there is nothing to preprocess.")
    return shapes


def _check_like_training(
    training: Dataset, labels: list[Any], x_shapes: list[list[int]], class_values: list[Any]
) -> None:
    unseen = sorted({v for v in labels if v not in class_values}, key=repr)
    if unseen:
        raise DataError(
            f"The validation labels {unseen[:5]} ({len(unseen)} values) never appear in the "
            f"training set {training.name!r}, whose class values are {class_values}. "
            "Preprocess the training set with those classes or remove these rows."
        )
    if x_shapes != training.summary["x_shapes"]:
        raise DataError(
            f"Validation x shapes {x_shapes} differ from the training set's "
            f"{training.summary['x_shapes']} ({training.name!r})."
        )


def _raise_if_not_finite(stats: list[dict[str, Any]]) -> None:
    """Raise a DataError with the NaN and inf counts of the whole source, if there are any."""
    totals: dict[str, dict[str, int]] = {}
    for s in stats:
        for column, counts in s.get("nonfinite", {}).items():
            total = totals.setdefault(column, {"rows": 0, "nan": 0, "inf": 0})
            for key in total:
                total[key] += counts[key]
    if not totals:
        return
    rows = sum(s["rows"] for s in stats)
    bad = sum(s.get("invalid_rows", 0) for s in stats)
    columns = "; ".join(
        f"column {column!r}: {t['rows']} rows ({t['nan']} NaN, {t['inf']} inf values)"
        for column, t in totals.items()
    )
    raise DataError(
        f"x holds values that are not finite. Received: {bad} of {rows} rows with NaN or inf "
        f"({columns}). Clean the data, or pass on_invalid='drop' to drop those rows (the "
        "dataset summary counts them)."
    )


def _sum_invalid(stats: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for s in stats:
        for col, n in s["invalid"].items():
            total[col] = total.get(col, 0) + n
    return total


def _max_buffer_bytes() -> int:
    return parse_memory(
        config.get("preprocess.max-buffer-bytes"), "dvml.preprocess.max-buffer-bytes"
    )
