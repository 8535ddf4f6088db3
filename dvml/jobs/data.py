"""A job's data: resolve ``data.source`` to the newest matching input and preprocess it.

``source`` is ``sklearn:digits`` (embedded, no download), a path, or a glob whose NEWEST match
(by modification time) is used: a Parquet/CSV file, a directory of Parquet files, an image
folder (one sub-folder per label), a directory of ``.tar`` shards, one ``.tar`` shard, or a
brace pattern of shards (``shards/train-{0000..0003}.tar``, used as a whole). Relative paths
are relative to the job file's directory, so a job works whatever the working directory of
cron or systemd is.

Only file names and their sizes and times are read here; the data is read by Dask tasks.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml.examples import digits_frame
from dvml.exceptions import DataError
from dvml.jobs.schemas import SKLEARN_SOURCES
from dvml.preprocess.api import training_preprocessor, validation_preprocessor
from dvml.preprocess.shards import expand_braces

if TYPE_CHECKING:
    from distributed import Client

    from dvml.store.datasets import Dataset

__all__ = [
    "Source",
    "dataset_names",
    "prepare_datasets",
    "read_rows",
    "resolve_source",
    "validation_split",
]

_KIND_NAMES = {
    "sklearn": "embedded data set",
    "table": "table",
    "images": "image folder",
    "shards": "tar shards",
}
_TABLE_SUFFIXES = (".parquet", ".pq", ".csv", ".csv.gz")
_GLOB_CHARS = "*?["
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
        sha256 over the names, sizes and modification times of the files: it changes when
        new data arrives.
    """

    spec: str
    kind: str
    location: str
    fingerprint: str

    def describe(self) -> str:
        what = _KIND_NAMES[self.kind]
        if self.location == self.spec:
            return f"{what} {self.location}"
        return f"{what} {self.location} (newest match of {self.spec})"


def dataset_names(name: str) -> tuple[str, str]:
    """The datasets of job ``name``: ``(<name>-train, <name>-val)``."""
    return f"{name}-train", f"{name}-val"


def _stat_digest(paths: list[str]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _files_under(directory: str) -> list[str]:
    return [os.path.join(root, f) for root, _, files in os.walk(directory) for f in files]


def _absolute(spec: str, base_dir: str | os.PathLike[str] | None) -> str:
    path = os.path.expandvars(os.path.expanduser(spec))
    if not os.path.isabs(path) and base_dir is not None:
        path = os.path.join(os.fspath(base_dir), path)
    return path


def resolve_source(
    spec: str, base_dir: str | os.PathLike[str] | None = None, key: str = "data.source"
) -> Source:
    """Resolve ``spec`` to the input a preprocessor reads now (the newest match of a glob).

    Raises
    ------
    DataError
        Nothing matches, or the match is of a kind dvml cannot read; the message names ``key``.
    """
    if spec.startswith("sklearn:"):
        if spec not in SKLEARN_SOURCES:
            raise DataError(
                f"Unknown embedded data set. Received: {key}={spec!r}. Known: "
                f"{', '.join(SKLEARN_SOURCES)}."
            )
        return Source(spec, "sklearn", spec, hashlib.sha256(spec.encode()).hexdigest())
    path = _absolute(spec, base_dir)
    if "{" in path:
        shards = expand_braces(path)
        missing = [s for s in shards if not os.path.isfile(s)]
        if missing:
            raise DataError(
                f"{len(missing)} of {len(shards)} tar shards do not exist, e.g. {missing[0]}. "
                f"Received: {key}={spec!r}. Check the pattern."
            )
        return Source(spec, "shards", path, _stat_digest(shards))
    if any(c in path for c in _GLOB_CHARS):
        matches = glob.glob(path)
        if not matches:
            raise DataError(
                f"Nothing matches the data source. Received: {key}={spec!r} (looked for "
                f"{path}). Check the path; the newest match is used."
            )
        path = max(matches, key=lambda p: (os.stat(p).st_mtime_ns, p))
    elif not os.path.exists(path):
        raise DataError(
            f"The data source does not exist. Received: {key}={spec!r} (looked for {path}). "
            "Check the path."
        )
    return _classify(spec, path, key)


def _classify(spec: str, path: str, key: str) -> Source:
    lower = path.lower()
    if os.path.isfile(path):
        if lower.endswith(_TABLE_SUFFIXES):
            return Source(spec, "table", path, _stat_digest([path]))
        if lower.endswith(".tar"):
            return Source(spec, "shards", path, _stat_digest([path]))
        raise DataError(
            f"Cannot tell the format of {path}. Received: {key}={spec!r}. Use .parquet or .csv "
            "files, an image folder, or .tar shards."
        )
    entries = sorted(os.listdir(path))
    files = _files_under(path)
    if entries and all(e.lower().endswith(".tar") for e in entries):
        pattern = entries[0] if len(entries) == 1 else "{" + ",".join(entries) + "}"
        return Source(spec, "shards", os.path.join(path, pattern), _stat_digest(files))
    if entries and all(e.lower().endswith((".parquet", ".pq")) for e in entries):
        return Source(spec, "table", path, _stat_digest(files))
    if not files:
        raise DataError(f"The source directory {path} is empty. Received: {key}={spec!r}.")
    return Source(spec, "images", path, _stat_digest(files))


def read_rows(source: Source) -> Any:
    """The rows of a table source: pandas for ``sklearn:``, a Dask DataFrame for files."""
    if source.kind == "sklearn":
        return digits_frame()
    if source.kind != "table":
        raise DataError(
            f"Rows can only be read from a table source (Parquet/CSV or sklearn:). Received: "
            f"{source.describe()}."
        )
    import dask.dataframe as dd

    location = source.location
    if location.lower().endswith((".csv", ".csv.gz")):
        return dd.read_csv(location)
    return dd.read_parquet(location)


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
    if source.kind == "table" and os.path.isdir(source.location):
        return read_rows(source)  # dvml tells formats by suffix; a directory has none
    return source.location


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
    split = valid["split"]
    if valid["source"] is None and split is None:
        if source.kind not in ("sklearn", "table"):
            raise DataError(
                f"Image data needs validation.source: validation.split works for tables only. "
                f"Received: data.source={data['source']!r} ({source.kind}). Add "
                "validation.source with images of the same labels."
            )
        split = 0.2
    x, y = columns(source, data)
    image_size = tuple(data["image_size"]) if data["image_size"] else None
    if split is not None:
        if source.kind not in ("sklearn", "table"):
            raise DataError(
                f"validation.split works for table sources only. Received: data.source="
                f"{data['source']!r} ({source.kind}), validation.split={split}. Use "
                "validation.source instead."
            )
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
        client=client,
    )
    return train, validation


def config_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """The directory relative paths of the job file at ``path`` are resolved against."""
    return pathlib.Path(path).expanduser().resolve().parent
