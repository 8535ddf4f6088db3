"""What a dataset version was packed from: the source's files (size, modification time or
ETag) and the preprocessing parameters, recorded in the version (:mod:`dvml.store.versions`).

Only file metadata is read (one listing and one ``info`` per file, on the client); never a
byte of the data. In-memory sources (DataFrames, arrays) are described by their type and rows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dvml.preprocess.sources import describe_source, is_file_source

__all__ = ["MAX_FILES", "file_entry", "source_record"]

MAX_FILES = 10000
"""Files listed in one version's source at most (the rest are counted, not listed)."""


def file_entry(path: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """One file of a source from fsspec's ``info``: path, size, and mtime or ETag (pure)."""
    entry: dict[str, Any] = {"path": path, "size": info.get("size")}
    etag = info.get("ETag") or info.get("etag")
    if etag:
        entry["etag"] = str(etag).strip('"')
    for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
        if info.get(key) is not None:
            value = info[key]
            entry["mtime"] = value if isinstance(value, int | float) else str(value)
            break
    return entry


def _files(source: Any, storage_options: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    import fsspec

    items = [source] if isinstance(source, str | os.PathLike) else list(source)
    found: list[dict[str, Any]] = []
    for item in items:
        fs, path = fsspec.core.url_to_fs(os.fspath(item), **dict(storage_options or {}))
        for p in sorted(fs.expand_path(path, recursive=True)):
            if len(found) >= MAX_FILES:
                return found
            info = fs.info(p)
            if info.get("type") == "file":
                found.append(file_entry(fs.unstrip_protocol(p), info))
    return found


def source_record(
    source: Any, params: Mapping[str, Any], storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The source description of a version: ``description``, ``files`` and ``params``.

    ``files`` is None for an in-memory source, or when the files could not be listed (then
    ``files_error`` says why: a version is still published, without them).
    """
    record: dict[str, Any] = {"description": describe_source(source), "files": None,
                              "params": dict(params)}  # fmt: skip
    if is_file_source(source):
        try:
            record["files"] = _files(source, storage_options)
        except Exception as exc:  # listing is best effort: the pack itself read the files
            record["files_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return record
