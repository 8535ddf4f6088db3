"""A job's data: resolve ``data.source`` to the newest matching input and preprocess it.

``source`` is ``sklearn:digits`` (embedded, no download), a path or any fsspec URL
(``s3://bucket/day-*.parquet``, read with the configuration's ``dvml.storage-options``), or a
glob whose NEWEST match (by modification time) is used: a Parquet/CSV file, a directory read
by what it holds (a Parquet data set with hive partitions, CSV files, tar shards, class folders
of images), one shard, or a set of shards as a brace pattern
(``shards/train-{0000..0003}.tar``) or webdataset's ``shards/train-%06d.tar``, used as a
whole. Relative paths are relative to the job file's directory, so a job works whatever the
working directory of cron or systemd is.

Only file names and their sizes and times are read here; the data is read by Dask tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.examples import digits_frame
from dvml.exceptions import DataError
from dvml.jobs.schemas import SKLEARN_SOURCES
from dvml.preprocess.api import training_preprocessor, validation_preprocessor
from dvml.preprocess.locations import (
    TABLE_KINDS,
    Location,
    is_url,
    locate,
    missing_credentials,
    read_table,
    store_error,
)

if TYPE_CHECKING:
    from distributed import Client

    from dvml.store.datasets import Dataset

__all__ = [
    "Source",
    "dataset_names",
    "list_files",
    "prepare_datasets",
    "read_rows",
    "resolve_source",
    "storage_options",
    "validation_fraction",
    "validation_split",
]

_KIND_NAMES = {
    "sklearn": "embedded data set",
    "table": "table",
    "images": "image folder",
    "shards": "tar shards",
}
_FORMAT_NAMES = {"parquet": "Parquet", "csv": "CSV"}
_GLOB_CHARS = "*?["
_PRINTF = re.compile(r"%0?\d*d")
# The columns of sklearn:digits (dvml.examples.digits_frame), used when x/y/id are not given.
_SKLEARN_COLUMNS = {"sklearn:digits": {"x": "pixels", "y": "label", "id": "id"}}


@dataclasses.dataclass(frozen=True)
class Source:
    """A resolved data source.

    Attributes
    ----------
    spec : str
        As written in the job file.
    kind : {"sklearn", "table", "images", "shards"}
    location : str
        What the preprocessor receives: the newest matching path, a shard pattern, or the
        ``sklearn:`` name.
    fingerprint : str
        sha256 over the names, sizes and modification times (or ETags) of the files: it
        changes when new data arrives.
    format : {"parquet", "csv", "shards", "images"} or None
        What the files hold (None for ``sklearn:``).
    paths : tuple of str or None
        The files read instead of ``location`` (``data.append: true``: every file of a
        directory or glob, :func:`list_files`), None otherwise.
    """

    spec: str
    kind: str
    location: str
    fingerprint: str
    format: str | None = None
    paths: tuple[str, ...] | None = None

    def describe(self) -> str:
        what = _KIND_NAMES[self.kind]
        if self.format in _FORMAT_NAMES:
            what = f"{_FORMAT_NAMES[self.format]} {what}"
        if self.paths is not None:
            return f"{what}: {len(self.paths)} file(s) of {self.spec}"
        if self.location == self.spec:
            return f"{what} {self.location}"
        return f"{what} {self.location} (newest match of {self.spec})"


def dataset_names(name: str) -> tuple[str, str]:
    """The datasets of job ``name``: ``(<name>-train, <name>-val)``."""
    return f"{name}-train", f"{name}-val"


def _absolute(spec: str, base_dir: str | os.PathLike[str] | None) -> str:
    if is_url(spec):
        return spec  # a store URL: nothing to expand, nothing relative
    path = os.path.expandvars(os.path.expanduser(spec))
    if path.lower().startswith("file://"):
        path = path[len("file://") :]
    if not os.path.isabs(path) and base_dir is not None:
        path = os.path.join(os.fspath(base_dir), path)
    return path


def storage_options() -> dict[str, Any]:
    """The fsspec options of job files' URLs: configuration ``dvml.storage-options``."""
    return dict(config.get("storage-options") or {})


def _digest(found: Location) -> str:
    h = hashlib.sha256()
    for path, size, stamp in sorted(zip(found.paths, found.sizes, found.stamps, strict=True)):
        h.update(f"{path}\0{size}\0{stamp}\n".encode())
    return h.hexdigest()


def _when(info: Mapping[str, Any]) -> float:
    for name in ("mtime", "LastModified", "updated", "last_modified", "created"):
        stamp = info.get(name)
        if stamp is not None:
            return float(stamp.timestamp() if hasattr(stamp, "timestamp") else stamp)
    return 0.0


def _newest(path: str, spec: str, key: str, options: dict[str, Any]) -> str:
    """The newest match of a glob (by modification time), local or in a store."""
    from fsspec.core import url_to_fs

    fs, inner = url_to_fs(path, **(options if is_url(path) else {}))
    try:
        matches = fs.glob(inner, detail=True)
    except Exception as e:
        if not isinstance(e, OSError) and not missing_credentials(e):
            raise
        raise store_error(e, spec, options) from e
    if not matches:
        raise DataError(
            f"Nothing matches the data source. Received: {key}={spec!r} (looked for "
            f"{path}). Check the path; the newest match is used."
        )
    newest = max(matches, key=lambda name: (_when(matches[name]), name))
    return fs.unstrip_protocol(newest) if is_url(path) else newest


def resolve_source(
    spec: str, base_dir: str | os.PathLike[str] | None = None, key: str = "data.source"
) -> Source:
    """Resolve ``spec`` to the input a preprocessor reads now (the newest match of a glob).

    ``spec`` is a path (relative to ``base_dir``) or any fsspec URL (``s3://...``), read with
    the configuration's ``dvml.storage-options``. A brace pattern or webdataset's
    ``shard-%06d.tar`` names a set of shards, used as a whole; a directory is read by what it
    holds.

    Raises
    ------
    DataError
        Nothing matches, the store refuses access or has no such bucket, or the match is of a
        kind dvml cannot read (the message names ``key`` and what was found).
    """
    if spec.startswith("sklearn:"):
        if spec not in SKLEARN_SOURCES:
            raise DataError(
                f"Unknown embedded data set. Received: {key}={spec!r}. Known: "
                f"{', '.join(SKLEARN_SOURCES)}."
            )
        return Source(spec, "sklearn", spec, hashlib.sha256(spec.encode()).hexdigest())
    path = _absolute(spec, base_dir)
    options = storage_options()
    pattern = "{" in path or bool(_PRINTF.search(path))
    if not pattern and any(c in path for c in _GLOB_CHARS):
        path = _newest(path, spec, key, options)
    found = locate(path, options, key)
    kind = "table" if found.kind in TABLE_KINDS else found.kind
    return Source(spec, kind, path, _digest(found), found.kind)


def list_files(
    spec: str, base_dir: str | os.PathLike[str] | None = None, key: str = "data.source"
) -> tuple[Source, list[dict[str, Any]]]:
    """Every file of a directory or glob (``data.append: true``), and the source of them all.

    Returns
    -------
    (Source, list of dict)
        The source reading all the files (``paths``), and one entry ``{"path", "size",
        "stamp"}`` per file (stamp: ETag, else modification time), sorted by path.
    """
    from dvml.jobs.file_diff import entries

    if spec.startswith("sklearn:"):
        raise DataError(
            f"data.append: true reads a directory or glob of files that grows. Received: "
            f"{key}={spec!r}, an embedded data set. Remove data.append or name files."
        )
    found = locate(_absolute(spec, base_dir), storage_options(), key)
    if found.kind not in TABLE_KINDS:
        raise DataError(
            f"data.append: true appends Parquet or CSV files. Received: {key}={spec!r}, which "
            f"holds {found.kind}. Remove data.append (the whole source is then repacked)."
        )
    files = entries(found.paths, found.sizes or [0] * len(found.paths),
                    found.stamps or [""] * len(found.paths))  # fmt: skip
    paths = tuple(e["path"] for e in files)
    source = Source(spec, "table", spec, _digest(found), found.kind, paths)
    return source, files


def read_rows(source: Source) -> Any:
    """The rows of a table source: pandas for ``sklearn:``, a Dask DataFrame for files."""
    if source.kind == "sklearn":
        return digits_frame()
    if source.kind != "table":
        raise DataError(
            f"Rows can only be read from a table source (Parquet/CSV or sklearn:). Received: "
            f"{source.describe()}."
        )
    return read_table(locate(list(source.paths or [source.location]), storage_options()))


def validation_split(rows: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """Split rows into (training, validation) reproducibly; pandas or Dask DataFrames."""
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        validation = rows.sample(frac=fraction, random_state=seed)
        return rows.drop(index=validation.index), validation
    train, validation = rows.random_split([1.0 - fraction, fraction], random_state=seed)
    return train, validation


def columns(source: Source, data: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(x, y)`` from the job's data section, defaulting to the embedded set's columns."""
    defaults = _SKLEARN_COLUMNS.get(source.location, {})
    return data.get("x") or defaults.get("x"), data.get("y") or defaults.get("y")


def default_id(source: Source) -> str | None:
    return _SKLEARN_COLUMNS.get(source.location, {}).get("id")


def _input(source: Source) -> Any:
    if source.kind == "sklearn":
        return read_rows(source)
    # A path, a URL or a pattern: the preprocessor lists it and the workers read it, with
    # the configuration's dvml.storage-options.
    return list(source.paths) if source.paths is not None else source.location


def validation_fraction(job: Mapping[str, Any], source: Source) -> float | None:
    """The fraction of the training rows held out for validation (None: ``validation.source``
    is read instead), or a :class:`DataError` for a job file that cannot work, so that
    ``--dry-run`` refuses it before any cluster starts.

    ``validation.split`` (and its default of 0.2) needs rows to draw from: a table source.
    Image folders and shards are packed straight from their files by the workers, and dvml
    does not split them: a held-out set of files (``validation.source``) keeps the validation
    images fixed across runs and retrains, which a split of a growing folder would not.
    """
    data, valid = job["data"], job["validation"]
    split = valid["split"]
    if valid["source"] is not None:
        return None
    if source.kind in ("sklearn", "table"):
        return 0.2 if split is None else float(split)
    given = "" if split is None else f", validation.split={split}"
    raise DataError(
        f"validation.split works for table sources only (Parquet/CSV or sklearn:), and image "
        f"data has no rows to split. Received: data.source={data['source']!r} ({source.kind})"
        f"{given}. Add validation.source: a held-out image folder or shards with the same "
        "labels (e.g. validation: {source: data/val/})"
        + (", and remove validation.split." if split is not None else ".")
    )


def prepare_datasets(
    job: Mapping[str, Any],
    client: Client,
    base_dir: str | os.PathLike[str] | None = None,
    source: Source | None = None,
) -> tuple[Dataset, Dataset]:
    """Preprocess the job's training and validation data into ``<name>-train``/``<name>-val``.

    Both are replaced atomically (``overwrite=True``): a run that dies half-way leaves the
    previous datasets or the new ones, never a mix under one name.

    Returns
    -------
    (Dataset, Dataset)
        The training and the validation dataset.
    """
    data, valid = job["data"], job["validation"]
    source = source or resolve_source(data["source"], base_dir)
    train_name, val_name = dataset_names(job["name"])
    split = validation_fraction(job, source)
    x, y = columns(source, data)
    image_size = tuple(data["image_size"]) if data["image_size"] else None
    files = list(source.paths) if source.paths is not None else None
    if split is not None:
        train_input, val_input = validation_split(read_rows(source), split, data["seed"])
    else:
        train_input = _input(source)
        val_input = _input(resolve_source(valid["source"], base_dir, "validation.source"))
    train = training_preprocessor(
        train_input,
        y=y,
        x=x,
        buffer_size=data["buffer_size"],
        normalizing_const=data["normalizing_const"],
        num_classes=data["num_classes"],
        distribution_rules=data["distribution_rules"],
        name=train_name,
        overwrite=True,
        on_invalid=data["on_invalid"],
        image_size=image_size,
        channels=data["channels"],
        seed=data["seed"],
        source_files=files,
        client=client,
    )
    validation = validation_preprocessor(
        val_input,
        y=y,
        x=x,
        training=train,
        name=val_name,
        overwrite=True,
        on_invalid=data["on_invalid"],
        seed=data["seed"],
        source_files=files if split is not None else None,
        client=client,
    )
    return train, validation


def config_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """The directory relative paths of the job file at ``path`` are resolved against."""
    return pathlib.Path(path).expanduser().resolve().parent
