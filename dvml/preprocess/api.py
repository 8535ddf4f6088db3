"""``training_preprocessor`` and ``validation_preprocessor``: MADlib's preprocessors on Dask.

They normalize x, one-hot encode y, shuffle, pack rows into buffers and put every buffer into
the vineyardd of the worker that the distribution rules chose, balanced so every worker holds
the same number of rows (within one row).
"""

from __future__ import annotations

import datetime
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
from dvml.preprocess.admission import (
    Planned,
    check_pack_fits,
    is_planning,
    known_x_bytes,
    pack_plan,
    refuse_before_reading,
)
from dvml.preprocess.encode import (
    check_normalizing_const,
    class_values_of,
    label_vartype,
)
from dvml.preprocess.graph import compute_stats, pack_and_publish
from dvml.preprocess.row_format import (
    Output,
    all_row_bytes,
    compact_row_bytes,
    field_dtypes,
    storage_record,
)
from dvml.preprocess.source_info import source_record
from dvml.preprocess.sources import source_parts
from dvml.store.datasets import Dataset, describe, exists
from dvml.store.leases import check_not_leased
from dvml.store.versions import balance_new_rows

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["INTERNAL_PREFIX", "append", "training_preprocessor", "validation_preprocessor"]


def training_preprocessor(
    source: Any,
    y: str | Sequence[str] | None = None,
    x: str | Sequence[Any] | None = None,
    buffer_size: int | None = None,
    normalizing_const: float = 1.0,
    num_classes: int | list[int] | None = None,
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
    source_files: Sequence[str] | None = None,
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
    y : str or list of str
        The label column (for images: ignored, labels come from folders or ``.cls`` files).
        Its cells are class values (int, str, bool; NULL is a class of its own, as in
        MADlib), or arrays already one-hot encoded (``class_values`` is then None). Several
        columns (MADlib's ``'class_text, class_text2'``) make one output each, for a
        multi-output model: each is encoded with its own ``class_values``, and the summary
        holds one entry per output in ``dependent_varname``, ``class_values``,
        ``num_classes``...
    x : str or list
        One column (scalar or array-valued cells); a list of columns, one model input each;
        or ``[["a", "b", "c"]]`` for one input made of several numeric columns.
    buffer_size : int, optional
        Rows per packed buffer. When None, rows are spread evenly over the target workers
        (as MADlib does), bounded by ``dvml.preprocess.max-buffer-bytes`` per buffer.
    normalizing_const : float
        x is divided by this (e.g. 255 for 8-bit images). Must be positive.
    num_classes : int or list of int, optional
        Length of the one-hot encoding; pads for classes not yet seen. One per label
        column for several.
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
        uint8 x stays uint8 and y is stored as class indices (a quarter of the float32
        format; readers normalize and one-hot encode on the fly). Default: config
        ``dvml.preprocess.compact`` (true). False: x normalized and y one-hot, float32 (for
        plain-vineyard readers). The summary's ``storage`` records the format.
    source_files : list of str, optional
        The files ``source``'s rows were read from, when ``source`` is a DataFrame of them
        (e.g. one part of a split): the version's source records these files (sizes, times)
        instead of the DataFrame.
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
        recorded_source=list(source_files) if source_files else None,
    )


def validation_preprocessor(
    source: Any,
    y: str | Sequence[str] | None = None,
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
    source_files: Sequence[str] | None = None,
    client: Client | None = None,
) -> Dataset:
    """Preprocess a validation set with the class values and normalization of ``training``.

    The training set's class values, ``num_classes``, ``normalizing_const``, image size,
    shard extensions (unless ``image_ext``/``label_ext`` are given) and (unless
    ``distribution_rules`` is given) distribution rules are reused; labels that the training
    set never saw are refused.

    Parameters
    ----------
    source, y, x : as for training_preprocessor
        The rows to pack and their label and feature columns.
    training : str or Dataset
        The training set (or its name) whose settings are reused.
    buffer_size, distribution_rules : optional
        As for :func:`training_preprocessor`; the rules default to the training set's.
    name, overwrite, force, on_invalid, seed, progress : as for training_preprocessor
        The dataset's name and how to pack it.
    storage_options, image_ext, label_ext, source_files, client : optional
        As for :func:`training_preprocessor`; the extensions default to the training set's.

    Returns
    -------
    Dataset
        The published validation set; ``.summary`` holds MADlib's summary fields.
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
        recorded_source=list(source_files) if source_files else None,
    )


def append(
    name: str,
    source: Any,
    *,
    on_invalid: str = "raise",
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_files: Sequence[str] | None = None,
    client: Client | None = None,
) -> Dataset:
    """Pack only ``source``'s rows and publish them as the next version of dataset ``name``.

    The new rows are read, normalized and encoded as the dataset's first version was (its
    ``x``, ``y``, class values, ``normalizing_const``, ``num_classes``, storage format, image
    size, buffer size and distribution rules), and placed on the rules' workers where they
    keep the workers' rows equal (:func:`dvml.store.versions.balance_new_rows`). Version n+1
    is version n's buffers plus the new ones: no byte of version n is copied or moved, and a
    job reading version n (``describe(name, version=n)``, or a fit that started before) keeps
    reading it.

    Parameters
    ----------
    name : str
        A dataset made by :func:`training_preprocessor` or :func:`validation_preprocessor`.
    source : DataFrame, dict of arrays, str or list of str
        The new rows, in any form the preprocessors take, with the same columns.
    on_invalid, progress, storage_options : optional
        As for :func:`training_preprocessor`.
    source_files : list of str, optional
        The files ``source``'s rows were read from, when ``source`` is a DataFrame of them
        (e.g. the training part of a split): the version's source records these files
        (sizes, times) instead of the DataFrame.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    Dataset
        The new version (``.version``, ``.versions``).

    Raises
    ------
    DataError
        When the new rows hold a label outside the dataset's class values (fixed by its first
        version) or x of another shape: nothing is written.
    DatasetNotFoundError
        For an unknown name.
    """
    client = current_client(client)
    old = describe(name, client)
    s = old.summary
    if old.kind != "dataset" or s.get("kind") not in ("training", "validation"):
        raise ArgumentError(
            f"Rows are appended to datasets made by training_preprocessor or "
            f"validation_preprocessor. Received: {name!r}, a {old.kind} "
            f"({s.get('kind')!r})."
        )
    image = s.get("image_size")
    return _preprocess(
        kind=s["kind"],
        source=source,
        y=s["dependent_varname"],
        x=s["independent_varname"],
        buffer_size=int(s["buffer_size"]),
        normalizing_const=s["normalizing_const"],
        num_classes=s["num_classes"],
        distribution_rules=s["distribution_rules"]["given"],
        name=name,
        overwrite=False,
        force=False,
        on_invalid=on_invalid,
        image_size=tuple(image) if image else None,
        channels=s.get("channels"),
        # each version draws its own shuffle
        seed=int(s.get("seed", 0)) + old.version,
        progress=progress,
        client=client,
        training=old,
        files=_files_options(storage_options, s.get("image_ext"), s.get("label_ext")),
        compact=bool((s.get("storage") or {}).get("compact", False)),
        append_to=old,
        recorded_source=list(source_files) if source_files else None,
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
    y: str | Sequence[str] | None,
    x: Any,
    buffer_size: int | None,
    normalizing_const: float,
    num_classes: int | list[int] | None,
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
    append_to: Dataset | None = None,
    recorded_source: Any = None,
) -> Dataset:
    name = _check_arguments(name, buffer_size, normalizing_const, num_classes, channels)
    client = current_client(client)
    seed = int(config.get("preprocess.seed", seed))
    rules = DistributionRules.parse(distribution_rules)
    targets = resolve_rules(rules, discover_workers(client))
    if append_to is None and not overwrite and exists(name, client):
        raise DatasetExistsError(
            f"A dataset named {name!r} already exists. Pass overwrite=True to replace it, or "
            "choose another name."
        )
    if overwrite and append_to is None:
        # A fit reading it holds a lease (dvml.store.leases): refuse before packing anything;
        # the replacement itself checks again.
        check_not_leased(name, "overwrite", force, client)

    if training is None and not is_planning():
        # A training set: its workers run the next fit's trainers. Their standby trainers
        # import TensorFlow now, at a low priority, while the data packs.
        warm_trainers(client, targets)
    bound = known_x_bytes(source, x, compact)
    if bound is not None and append_to is None and not is_planning():
        refuse_before_reading(client, bound, targets, name, name if overwrite else None, compact)
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
            append_to=append_to,
            source=source_record(
                source if recorded_source is None else recorded_source,
                _source_params(
                    buffer_size,
                    normalizing_const,
                    num_classes,
                    x,
                    y,
                    seed,
                    on_invalid,
                    image_size,
                    channels,
                    compact,
                ),
                files["storage_options"],
            ),
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
    num_classes: int | list[int] | None,
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
    append_to: Dataset | None = None,
    source: dict[str, Any] | None = None,
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
    outputs = _outputs(stats, src.y, num_classes, training, x_shapes, append_to is not None)
    class_values, n_classes, _ = outputs[0]
    dtypes = field_dtypes(stats, outputs, compact)
    row_bytes = all_row_bytes(x_shapes, outputs, dtypes)
    max_bytes = _max_buffer_bytes()
    addresses = [t.address for t in targets]
    if kind == "validation":
        # Validation rows are only evaluated (MADlib evaluates any validation table): a
        # worker may hold none, so a set smaller than the cluster goes on the first workers.
        addresses = addresses[: max(1, sum(rows))]
    per_worker = None
    if append_to is not None:  # new rows go where they keep the workers equal
        held = {t.address: 0 for t in targets if t.address in addresses}
        by_name = {t.name: t.address for t in targets}
        for b in append_to.layout["buffers"]:
            if b["worker_name"] in by_name and by_name[b["worker_name"]] in held:
                held[by_name[b["worker_name"]]] += int(b["rows"])
        per_worker = balance_new_rows(held, sum(rows))
    layout = plan_layout(rows, addresses, buffer_size, row_bytes, max_bytes, seed, per_worker)
    by_address = {t.address: t for t in targets}
    buffer_targets = [by_address[b.worker] for b in layout.buffers]
    # Admission: refused here, before a split or pack task exists, when it cannot fit.
    plan = pack_plan(
        client, layout.rows_per_worker, targets, row_bytes,
        name if overwrite and append_to is None else None,  # an append frees nothing
        None if compact else compact_row_bytes(stats, x_shapes, outputs),
    )  # fmt: skip
    if is_planning():  # dvml.plan.pack: the plan is all it asked for
        raise Planned(plan, n_classes)
    check_pack_fits(plan, name, sum(rows), compact, label_values=n_classes)

    summary = {
        "kind": kind,
        "dataset_id": uuid.uuid4().hex,
        "source_table": src.description,
        "output_table": name,
        **_label_summary(src.y, outputs),
        "independent_varname": src.x_names,
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
        "storage": storage_record(dtypes, len(outputs)),
        **({"image_ext": shard_exts[0], "label_ext": shard_exts[1]} if shard_exts else {}),
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dvml_version": __version__,
    }
    if source is not None:
        # A version records the parameters it applied, as an append does (it passes version
        # 1's): the buffer size and class count dvml chose where the call left them None.
        chosen = {"buffer_size": layout.buffer_size, "num_classes": summary["num_classes"]}
        params = source["params"]
        source = {**source, "params": {**params, **{k: v for k, v in chosen.items()
                                                    if params.get(k) is None}}}  # fmt: skip
    if append_to is not None:
        summary = _appended_summary(append_to.summary, summary)
    elif training is not None:
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
    if len(outputs) > 1:
        split_args["more_outputs"] = [(values, width) for values, width, _ in outputs[1:]]
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
        append_to=append_to,
        source=source,
    )


def _appended_summary(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The summary of a dataset after an append: the first version's, with the totals of
    every version (placement keys are recomputed from the whole layout at publication)."""
    invalid = dict(old.get("invalid_counts") or {})
    for key, n in (new.get("invalid_counts") or {}).items():
        invalid[key] = invalid.get(key, 0) + n
    return {
        **old,
        "rows": int(old["rows"]) + int(new["rows"]),
        "dropped_rows": int(old.get("dropped_rows", 0)) + int(new["dropped_rows"]),
        "invalid_counts": invalid,
        "appended_at": new["created_at"],
        "dvml_version": new["dvml_version"],
    }


def _source_params(
    buffer_size: Any, normalizing_const: Any, num_classes: Any, x: Any, y: Any, seed: int,
    on_invalid: str, image_size: Any, channels: Any, compact: bool,
) -> dict[str, Any]:  # fmt: skip
    """The preprocessing parameters a version records with its source (JSON values)."""
    return {
        "x": x, "y": y, "buffer_size": buffer_size, "normalizing_const": float(normalizing_const),
        "num_classes": num_classes, "seed": seed, "on_invalid": on_invalid,
        "image_size": list(image_size) if image_size else None, "channels": channels,
        "compact": bool(compact),
    }  # fmt: skip


def _outputs(
    stats: list[dict[str, Any]],
    y: str | list[str],
    num_classes: int | list[int] | None,
    training: Dataset | None,
    x_shapes: list[list[int]],
    appending: bool = False,
) -> list[Output]:
    """Each output's class values (None for labels already one-hot encoded), one-hot width
    and array dtype: one output per label column (MADlib's several dependent variables)."""
    names = [y] if isinstance(y, str) else list(y)
    widths = num_classes if isinstance(num_classes, list) else [num_classes] * len(names)
    if len(widths) != len(names):
        raise ArgumentError(
            f"num_classes must give one width per label column. Received: num_classes="
            f"{num_classes!r} for the {len(names)} columns {names}."
        )
    if training is not None and len(_as_list(training.summary["dependent_varname"])) != len(names):
        raise DataError(
            f"The {'appended rows have' if appending else 'validation set has'} {len(names)} "
            f"label columns {names} but the training set "
            f"{training.name!r} has {training.summary['dependent_varname']}. Give both the "
            "same outputs."
        )
    outputs: list[Output] = []
    for k in range(len(names)):
        part = [s if k == 0 else {**s["more_outputs"][k - 1], "rows": s["rows"]} for s in stats]
        labels = _labels_found(part)
        array_dtype = _array_labels(part)
        if training is None:
            values = None if array_dtype else class_values_of(labels)
        else:
            values = _per_output(training.summary["class_values"], len(names))[k]
            _check_like_training(training, labels, x_shapes, values, array_dtype, appending)
        outputs.append((values, _num_classes(widths[k], values, part), array_dtype))
    return outputs


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _per_output(value: Any, n_outputs: int) -> list[Any]:
    """A summary field of a single-output dataset as a list of one, else as it is (one
    entry per output)."""
    return [value] if n_outputs == 1 else list(value)


def _label_summary(y: str | list[str], outputs: list[Output]) -> dict[str, Any]:
    """MADlib's label fields: ``dependent_varname``, ``dependent_vartype``,
    ``class_values`` and ``<y>_class_values``, ``num_classes``; for several label columns
    (a multi-output model) each is one entry per output, as in MADlib's summary (arrays),
    and ``dependent_count`` counts them."""
    names = [y] if isinstance(y, str) else list(y)
    types = [label_vartype(values, dtype) for values, _, dtype in outputs]
    fields: dict[str, Any] = {
        "dependent_varname": y if isinstance(y, str) else names,
        "dependent_vartype": types[0] if isinstance(y, str) else types,
    }
    if isinstance(y, str):
        fields["class_values"] = outputs[0][0]
        fields["num_classes"] = outputs[0][1]
    else:
        fields["class_values"] = [values for values, _, _ in outputs]
        fields["num_classes"] = [width for _, width, _ in outputs]
        fields["dependent_count"] = len(names)
        fields["y_shapes"] = [[width] for _, width, _ in outputs]
    for name, (values, _, _) in zip(names, outputs, strict=True):
        fields[f"{name}_class_values"] = values  # MADlib's name for class_values
    return fields


def _labels_found(stats: list[dict[str, Any]]) -> list[Any]:
    """The distinct labels of every part (NULL once, as None)."""
    import pandas as pd

    found: list[Any] = []
    for s in stats:
        found.extend(None if v is not None and pd.isna(v) else v for v in s["labels"])
    return found


def _array_labels(stats: list[dict[str, Any]]) -> str | None:
    """The dtype of labels already one-hot encoded (a column of arrays), None for class
    values; parts that disagree are refused."""
    kinds = {s.get("label_width") is not None for s in stats if s["rows"]}
    if kinds == {True, False}:
        raise DataError(
            "The label column mixes arrays (labels already one-hot encoded) with class values "
            "across partitions. Received: both kinds of cells. Give every row the same kind."
        )
    widths = {s["label_width"] for s in stats if s["rows"] and s.get("label_width")}
    if len(widths) > 1:
        raise DataError(
            f"The one-hot label arrays have different lengths across partitions. Received: "
            f"lengths {sorted(widths)}. Every label array must be one value per class."
        )
    dtypes = [s["label_dtype"] for s in stats if s["rows"] and s.get("label_dtype")]
    if not dtypes:
        return None
    import numpy as np

    return str(np.result_type(*dtypes))


def _num_classes(
    num_classes: int | None, class_values: list[Any] | None, stats: list[dict[str, Any]]
) -> int:
    """The width of the one-hot labels: ``num_classes`` (padding), else the number of class
    values, else (labels already one-hot encoded) the length of their arrays."""
    if class_values is None:
        found = next(s["label_width"] for s in stats if s["rows"] and s.get("label_width"))
        n = num_classes if num_classes is not None else found
        if n < found:
            raise DataError(
                f"num_classes={n} is shorter than the one-hot label arrays. Received: arrays of "
                f"length {found}. Raise num_classes or leave it as None."
            )
        return int(n)
    n = num_classes if num_classes is not None else len(class_values)
    if n < len(class_values):
        raise DataError(
            f"num_classes={n} is smaller than the {len(class_values)} distinct labels "
            f"found ({class_values[:10]}). Raise num_classes or leave it as None."
        )
    return int(n)


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
    for n in num_classes if isinstance(num_classes, list) else [num_classes]:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ArgumentError(
                "num_classes must be a positive int, or a list of them (one per label column). "
                f"Received: {num_classes!r}."
            )
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
    training: Dataset,
    labels: list[Any],
    x_shapes: list[list[int]],
    class_values: list[Any] | None,
    array_dtype: str | None = None,
    appending: bool = False,
) -> None:
    what = "appended" if appending else "validation"
    if appending:
        unseen = sorted({v for v in labels if v not in (class_values or [])}, key=repr)
        if class_values is not None and unseen:
            raise DataError(
                f"Cannot append to {training.name!r}: the new rows' labels {unseen[:5]} "
                f"({len(unseen)} values) are not among its class values {class_values}, "
                "fixed by its first version. Remove these rows, or preprocess the grown source "
                "again as a new dataset (training_preprocessor(..., overwrite=True))."
            )
        if x_shapes != training.summary["x_shapes"]:
            raise DataError(
                f"Cannot append to {training.name!r}: the new rows' x shapes {x_shapes} differ "
                f"from the dataset's {training.summary['x_shapes']}. Give the same columns "
                "and shapes, or preprocess the new source as a new dataset."
            )
    if (class_values is None) != (array_dtype is not None):
        raise DataError(
            f"The {what} labels are {'arrays' if array_dtype else 'class values'} but the "
            f"training set {training.name!r} has "
            f"{'labels already one-hot encoded' if class_values is None else 'class values'}. "
            "Give both sets the same kind of label column."
        )
    unseen = sorted({v for v in labels if v not in (class_values or [])}, key=repr)
    if class_values is not None and unseen:
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
