"""The retrain workflow's appends (``data.append: true``): pack only the files that are new.

``data.source`` is a directory or glob of Parquet/CSV files that grows (daily drops, a Parquet
directory written to). The first run packs every file as version 1 of ``<name>-train`` and
``<name>-val``; each later run lists the files, compares them with those the workflow state
records (:mod:`dvml.jobs.file_diff`: path, size, ETag or modification time) and appends only
the new ones with :func:`dvml.datasets.append` (version n+1, sharing every buffer of version
n). Before anything is written, one task per new file reads its feature and label columns on
a worker and returns its columns, labels and per-feature bin counts: a file with another
schema or a class value the first version did not have is refused, naming the file; the
counts give the drift of the new rows against the old (:mod:`dvml.jobs.drift`), from a
summary the state keeps, so the old rows are never read again.

Validation: with ``validation.split``, the new files' rows are split with the job's seed and
their held-out rows appended to ``<name>-val``: old rows never move between the two sets, so
the candidate and production are compared on the same old validation rows plus the new ones.
With ``validation.source``, ``<name>-val`` stays as the first run packed it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dvml.exceptions import DataError
from dvml.jobs import drift
from dvml.jobs.data import (
    Source,
    columns,
    dataset_names,
    read_rows,
    storage_options,
    validation_fraction,
    validation_split,
)

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "EDGE_FILES",
    "SAMPLE_ROWS",
    "already_appended",
    "append_new_files",
    "features",
    "first_summary",
    "inspect_file",
    "inspect_files",
    "refuse_incompatible",
    "update_datasets",
]

SAMPLE_ROWS = 20000
"""Rows (over the sampled files) whose quantiles fix the drift bins of the first version."""
EDGE_FILES = 3
"""Files of the first version sampled for the drift bins."""


def features(frame: Any, x: Any, y: Any) -> tuple[np.ndarray, list[str]]:
    """The feature matrix (rows by features) of a pandas frame and the features' names.

    ``x`` is one column (of numbers or of arrays, one feature per element), a list of
    columns, or None (every column but ``y``).
    """
    names = [x] if isinstance(x, str) else list(x) if x else [c for c in frame if c != y]
    parts, labels = [], []
    for name in names:
        column = frame[name]
        if column.dtype == object:
            block = np.stack([np.asarray(v, dtype=np.float64).ravel() for v in column])
            labels += [f"{name}[{j}]" for j in range(block.shape[1])]
        else:
            block = column.to_numpy(dtype=np.float64)[:, None]
            labels.append(str(name))
        parts.append(block.reshape(len(frame), -1))
    return (np.hstack(parts) if parts else np.empty((len(frame), 0))), labels


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def inspect_file(
    path: str,
    kind: str,
    options: Mapping[str, Any] | None,
    x: Any,
    y: str | None,
    edges: Sequence[Sequence[float]] | None,
    sample: int,
) -> dict[str, Any]:
    """One file's columns, labels and drift counts (or a sample of features): a worker task."""
    import pandas as pd

    opts = dict(options) if options else None
    if kind == "parquet":
        from dvml.preprocess.locations import hive_partitions

        frame = pd.read_parquet(path, storage_options=opts)
        # pandas reads one file without its hive columns (label=3/...): add them, as the
        # Dask read that packs these files does, so a partition column is not "missing"
        hive = {k: v for k, v in hive_partitions(path).items() if k not in frame.columns}
        frame = frame.assign(**hive)
    else:
        frame = pd.read_csv(path, storage_options=opts)
    out: dict[str, Any] = {
        "path": path,
        "rows": len(frame),
        "columns": {str(c): str(t) for c, t in frame.dtypes.items()},
    }
    wanted = ([x] if isinstance(x, str) else list(x or [])) + ([y] if y else [])
    out["missing"] = [c for c in wanted if c not in frame.columns]
    if out["missing"]:
        return out
    out["labels"] = sorted({_plain(v) for v in frame[y].unique()}, key=repr) if y else []
    matrix, out["names"] = features(frame, x, y)
    if edges is None:
        rng = np.random.default_rng(0)
        take = rng.choice(len(matrix), size=min(len(matrix), sample), replace=False)
        out["sample"] = matrix[np.sort(take)]
    else:
        out["summary"] = drift.summarize(matrix, edges)
    return out


def inspect_files(
    client: Client,
    paths: Sequence[str],
    kind: str,
    x: Any,
    y: str | None,
    edges: Sequence[Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """:func:`inspect_file` for every path, on the workers (one task a file)."""
    sample = max(1, SAMPLE_ROWS // max(1, len(paths)))
    futures = client.map(
        inspect_file, list(paths), kind=kind, options=storage_options(), x=x, y=y,
        edges=edges, sample=sample, pure=False,
    )  # fmt: skip
    return list(client.gather(futures))


def refuse_incompatible(
    found: Sequence[Mapping[str, Any]],
    schema: Mapping[str, str],
    class_values: Sequence[Any] | None,
    spec: str,
) -> None:
    """Raise :class:`DataError` naming the first new file of another schema or with a class
    value version 1 does not have (pure)."""
    allowed = None if class_values is None else {repr(_plain(v)) for v in class_values}
    for info in found:
        path = info["path"]
        if info["missing"]:
            what = f"has no column(s) {info['missing']}"
        elif schema and info["columns"] != dict(schema):
            what = f"has the columns {info['columns']}, not {dict(schema)}"
        elif allowed is not None and any(repr(v) not in allowed for v in info["labels"]):
            extra = [v for v in info["labels"] if repr(v) not in allowed]
            what = (
                f"holds class value(s) {extra[:10]} that version 1 does not have "
                f"({sorted(allowed)})"
            )
        else:
            continue
        raise DataError(
            f"A new file of the source cannot be appended: {path} {what}. Received: "
            f"data.source={spec!r} with data.append: true. Nothing was written. Fix or move "
            "the file, or repack everything with --force (a new class needs a new model)."
        )


def first_summary(
    client: Client, source: Source, data: Mapping[str, Any], bins: int
) -> tuple[dict[str, str], dict[str, Any]]:
    """The schema of the first version's files and the drift summary of its rows.

    On the first run only: a sample of the first :data:`EDGE_FILES` files fixes the bins
    (those files are read twice), then every file is read once, checked against the first
    file's schema and counted in the bins.
    """
    x, y = columns(source, data)
    paths = list(source.paths or [])
    kind = source.format or "parquet"
    head = inspect_files(client, paths[:EDGE_FILES], kind, x, y)
    refuse_incompatible(head, head[0]["columns"], None, source.spec)
    edges = drift.bin_edges(np.vstack([f["sample"] for f in head]), bins)
    counted = inspect_files(client, paths, kind, x, y, edges)
    refuse_incompatible(counted, head[0]["columns"], None, source.spec)
    summary = functools.reduce(drift.merge, [info["summary"] for info in counted])
    return head[0]["columns"], {**summary, "names": head[0]["names"]}


def already_appended(dataset: Any, paths: Sequence[str]) -> bool:
    """Whether the dataset's latest version was appended from exactly these files (a run
    killed after that append: the next run must not append them twice)."""
    latest = dataset.versions[-1] if dataset.versions else {}
    files = (latest.get("source") or {}).get("files") or []
    recorded = sorted(_local_path(f["path"]) for f in files)
    return latest.get("parent") is not None and recorded == sorted(map(_local_path, paths))


def _local_path(path: str) -> str:
    # version records name local files as fsspec does (file:///...), listings as paths
    return path[len("file://") :] if path.startswith("file://") else path


def append_new_files(
    job: Mapping[str, Any],
    client: Client,
    new: Source,
    prepared: Mapping[str, Any],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Check the new files, measure their drift and append them to ``<name>-train`` (and
    ``<name>-val`` with a split). ``prepared`` is the state's record of the first version
    (``schema``, ``drift``).

    Returns
    -------
    dict
        ``drift`` (a :func:`dvml.jobs.drift.compare` result), ``summary`` (the drift summary
        with the new rows), ``versions`` (``{"train": n, "validation": m}``).

    Raises
    ------
    DataError
        A new file has another schema or a new class value, or the drift is above
        ``drift.fail_above``: nothing is written.
    """
    from dvml.preprocess.api import append
    from dvml.store.datasets import describe

    data = job["data"]
    x, y = columns(new, data)
    paths = list(new.paths or [])
    train_name, val_name = dataset_names(job["name"])
    train = describe(train_name, client)
    old = prepared["drift"]
    found = inspect_files(client, paths, new.format or "parquet", x, y, old["edges"])
    refuse_incompatible(found, prepared["schema"], train.summary.get("class_values"), new.spec)
    added = functools.reduce(drift.merge, [info["summary"] for info in found])
    limit = (job.get("drift") or {}).get("fail_above")
    threshold = limit if limit is not None else drift.DEFAULT_THRESHOLD
    result = drift.compare(old, added, threshold, old.get("names"))
    log(drift.describe_drift(result))
    if limit is not None and result["max_psi"] > limit:
        raise DataError(
            f"The new rows drifted: PSI {result['max_psi']:.4f} of {result['feature']} is above "
            f"drift.fail_above. Received: drift.fail_above={limit}, {len(paths)} new file(s) "
            f"({paths[0]}...). Nothing was written. Check the new files, or raise the limit."
        )
    split = validation_fraction(job, new)
    versions = {"train": train.version, "validation": describe(val_name, client).version}
    if split is None:
        train_rows, val_rows = paths, None
    else:
        train_rows, val_rows = validation_split(read_rows(new), split, data["seed"])
    targets = [("train", train_name, train_rows), ("validation", val_name, val_rows)]
    for key, name, rows in targets:
        if rows is None:
            continue
        if already_appended(describe(name, client), paths):
            log(f"{name} already holds these files (an earlier run appended them)")
            versions[key] = describe(name, client).version
            continue
        ds = append(name, rows, on_invalid=data["on_invalid"], source_files=paths, client=client)
        versions[key] = ds.version
    return {"drift": result, "summary": {**drift.merge(old, added), "names": old.get("names")},
            "versions": versions}  # fmt: skip


def _datasets_exist(job: Mapping[str, Any], client: Client) -> bool:
    from dvml.store.datasets import exists

    return all(exists(name, client) for name in dataset_names(job["name"]))


def _config_key(job: Mapping[str, Any]) -> str:
    """What makes the packed rows comparable: the data and validation sections (another
    preprocessing of the same files is a repack)."""
    import hashlib
    import json

    text = json.dumps([job["data"], job["validation"], (job.get("drift") or {}).get("bins")],
                      sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _pack_all(
    job: Mapping[str, Any],
    client: Client,
    ctx: Any,
    source: Source,
    files: list[dict[str, Any]],
    why: str,
) -> dict[str, Any]:
    """:func:`update_datasets` of a first run (or a forced or changed one): every file packed
    as version 1, and the appends record started."""
    from dvml.jobs.data import prepare_datasets

    data, log = job["data"], ctx.log
    log.info("packing all %d file(s) of %s as a new dataset (%s)", len(files),
             data["source"], why)  # fmt: skip
    ctx.journal("preprocessing")
    bins = int((job.get("drift") or {}).get("bins") or drift.DEFAULT_BINS)
    schema, summary = first_summary(client, source, data, bins)
    train, val = prepare_datasets(job, client, ctx.base_dir, source)
    state = ctx.read_state()
    state["appended"] = {"key": _config_key(job), "files": files, "schema": schema,
                         "drift": summary, "trained": False}  # fmt: skip
    state.pop("prepared", None)  # the whole-source reuse record does not apply
    ctx.write_state(state)
    ctx.journal("preprocessed")
    log.info("packed %s (%d rows, version %d) and %s (%d rows, version %d)", train.name,
             train.rows, train.version, val.name, val.rows, val.version)  # fmt: skip
    return {"files": [f["path"] for f in files], "drift": None,
            "versions": {"train": train.version, "validation": val.version}}  # fmt: skip


def update_datasets(
    job: Mapping[str, Any], client: Client, ctx: Any, force: bool = False
) -> dict[str, Any] | None:
    """Bring ``<name>-train``/``<name>-val`` up to date with the source's files.

    ``ctx`` is the workflow's run context (``read_state``, ``write_state``, ``journal``,
    ``log``, ``base_dir``). The first run (or ``force``, or a changed data section, or a
    dataset dropped since) packs every file as a new version 1; later runs append only the
    new files (:func:`append_new_files`). The state's ``"appended"`` record keeps the files
    seen, the first files' schema and the drift summary.

    Returns
    -------
    dict or None
        None when no file is new and a run has trained on the rows (nothing was done); else
        ``files`` (the paths packed by this run: none when a run that wrote the latest
        versions failed before its model was saved, so this run trains on them), ``versions``
        (``{"train": n, "validation": m}``) and ``drift`` (None on a first pack).

    Raises
    ------
    DataError
        A file seen before was rewritten, or a new file has another schema or class value,
        or drifted above ``drift.fail_above``: nothing was written.
    """
    from dvml.jobs.data import list_files
    from dvml.jobs.file_diff import diff_files, refuse_changed
    from dvml.store.datasets import describe

    data, log = job["data"], ctx.log
    source, files = list_files(data["source"], ctx.base_dir)
    state = ctx.read_state()
    record = state.get("appended") or {}
    key = _config_key(job)
    if force or record.get("key") != key or not _datasets_exist(job, client):
        why = (
            "--force" if force else "first run" if not record
            else "the data section changed" if record.get("key") != key
            else "the datasets were dropped"
        )  # fmt: skip
        return _pack_all(job, client, ctx, source, files, why)
    diff = diff_files(record["files"], files)
    refuse_changed(diff, data["source"])
    if diff.removed:
        log.warning("%d file(s) seen before are gone (their rows stay packed), e.g. %s",
                    len(diff.removed), diff.removed[0]["path"])  # fmt: skip
    if not diff.new and record.get("trained", True):
        log.info("nothing new: no new file in %s (%d seen); --force repacks everything",
                 data["source"], len(record["files"]))  # fmt: skip
        return None
    if not diff.new:  # packed or appended by a run that failed before its model was saved
        train_name, val_name = dataset_names(job["name"])
        versions = {"train": describe(train_name, client).version,
                    "validation": describe(val_name, client).version}  # fmt: skip
        log.info("no new file in %s, but no run has trained on version %d of the training "
                 "set yet (the run that wrote it failed): training now", data["source"],
                 versions["train"])  # fmt: skip
        return {"files": [], "versions": versions, "drift": None}
    paths = [f["path"] for f in diff.new]
    log.info("%d new file(s) in %s: %s", len(paths), data["source"], ", ".join(paths[:5]))
    ctx.journal("appending", files=paths)
    new = dataclasses.replace(source, paths=tuple(paths))
    result = append_new_files(job, client, new, record, lambda line: log.info("%s", line))
    record.update(files=sorted(record["files"] + diff.new, key=lambda e: e["path"]),
                  drift=result["summary"], trained=False)  # fmt: skip
    state["appended"] = record
    ctx.write_state(state)
    ctx.journal("preprocessed")
    versions = result["versions"]
    train_name, val_name = dataset_names(job["name"])
    log.info("appended: %s version %d, %s version %d", train_name, versions["train"],
             val_name, versions["validation"])  # fmt: skip
    return {"files": paths, "versions": versions, "drift": result["drift"]}


def append_plan(
    job: Mapping[str, Any], base_dir: Any, state: Mapping[str, Any], force: bool
) -> tuple[Source, str, str]:
    """For ``--dry-run``: the source of every file, and the data and skip lines of the plan
    (files are only listed and stat'ed)."""
    from dvml.jobs.data import list_files
    from dvml.jobs.file_diff import diff_files

    source, files = list_files(job["data"]["source"], base_dir)
    record = state.get("appended") or {}
    data = f"data: {source.describe()} (data.append: only files not seen are packed)"
    if force or record.get("key") != _config_key(job):
        return source, data, f"pack all {len(files)} file(s) as a new dataset, then train"
    diff = diff_files(record["files"], files)
    if diff.changed:
        return source, data, f"refuse: {diff.changed[0][1]['path']} changed since it was packed"
    if not diff.new and not record.get("trained", True):
        return source, data, "no new file; train on the rows the last (failed) run wrote"
    if not diff.new:
        return source, data, f"skip: no new file ({len(files)} seen); --force repacks everything"
    limit = (job.get("drift") or {}).get("fail_above")
    refused = f", refused above {limit:g}" if limit is not None else ", reported"
    step = (
        f"append {len(diff.new)} new file(s) ({diff.new[0]['path']}...) after checking their "
        f"schema, class values and drift (PSI{refused}), then train"
    )
    return source, data, step
