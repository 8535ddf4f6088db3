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
from dvml.cluster.spec import parse_memory
from dvml.cluster.standby import warm_trainers
from dvml.cluster.workers import current_client, discover_workers
from dvml.exceptions import ArgumentError, DataError, DatasetExistsError
from dvml.names import INTERNAL_PREFIX, check_name
from dvml.placement.planner import plan_layout
from dvml.placement.rules import DistributionRules, describe_resolution, resolve_rules
from dvml.preprocess.encode import check_normalizing_const, class_values_of
from dvml.preprocess.graph import compute_stats, pack_and_publish
from dvml.preprocess.sources import source_parts
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
    name: str | None = None,
    *,
    overwrite: bool = False,
    force: bool = False,
    on_invalid: str = "raise",
    image_size: tuple[int, int] | None = None,
    channels: int = 3,
    seed: int | None = None,
    progress: bool = False,
    client: Client | None = None,
) -> Dataset:
    """Preprocess ``source`` into a placed, balanced, named dataset in vineyard.

    Parameters
    ----------
    source : Dask/pandas DataFrame, str, or dict of arrays
        A DataFrame; a Parquet or CSV path (globs allowed); a dict of Dask or numpy arrays
        (``{"image": x, "label": y}``); a folder of images with one sub-folder per label; or
        WebDataset tar shards (``"shards/train-{0000..0147}.tar"``).
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
        Name of the dataset in vineyard.
    overwrite : bool
        Replace an existing dataset of the same name (atomically, after the new one is
        complete). Refused with DatasetInUseError while a job (a fit) reads it
        (:mod:`dvml.store.leases`).
    force : bool
        Overwrite even a dataset a running job reads: stop that job first, or its trainers
        read freed memory.
    on_invalid : {"raise", "drop"}
        What to do with rows whose x holds NaN or inf.
    image_size : (int, int), optional
        Height and width images are resized to (required for image sources).
    channels : int
        1 (grey) or 3 (RGB) for image sources.
    seed : int, optional
        Shuffle seed (config ``dvml.preprocess.seed``).
    progress : bool
        Show Dask's progress bar while the source is read, decoded and validated.
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
    )


def validation_preprocessor(
    source: Any,
    y: str | None = None,
    x: str | Sequence[Any] | None = None,
    training: str | Dataset | None = None,
    buffer_size: int | None = None,
    distribution_rules: Any = None,
    name: str | None = None,
    *,
    overwrite: bool = False,
    force: bool = False,
    on_invalid: str = "raise",
    seed: int | None = None,
    progress: bool = False,
    client: Client | None = None,
) -> Dataset:
    """Preprocess a validation set with the class values and normalization of ``training``.

    The training set's class values, ``num_classes``, ``normalizing_const``, image size and
    (unless ``distribution_rules`` is given) distribution rules are reused; labels that the
    training set never saw are refused.
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
        channels=s.get("channels") or 3,
        seed=seed,
        progress=progress,
        client=client,
        training=train,
    )


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
    channels: int,
    seed: int | None,
    progress: bool,
    client: Client | None,
    training: Dataset | None,
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
        threads,
    )  # fmt: skip
    if not src.parts:
        raise DataError("The source has no partitions: there is nothing to preprocess.")
    prepared, stats, sizes = compute_stats(client, src.parts, progress)
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
            channels=channels,
            seed=seed,
            client=client,
            training=training,
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
    channels: int,
    seed: int,
    client: Client,
    training: Dataset | None,
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
    row_bytes = 4 * (sum(math.prod(s) for s in x_shapes) + n_classes)
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
        "channels": channels if src.image_size else None,
        "seed": seed,
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
    )


def _check_arguments(
    name: Any, buffer_size: Any, normalizing_const: Any, num_classes: Any, channels: Any
) -> str:
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
    if channels not in (1, 3):
        raise ArgumentError(f"channels must be 1 or 3. Received: {channels!r}.")
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
