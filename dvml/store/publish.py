"""Publish buffers as one named dataset, atomically, or leave nothing behind.

Used by the pack graph (:mod:`dvml.preprocess.graph`) and the feature cache: every object is
put under
a staging name of this run; the dataset's name appears last, in one step; on any failure (an
exception, a Ctrl-C) every staged object of the run is deleted, and on success every staged
object that did not make it into the dataset (an attempt whose worker died) is deleted too.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml.exceptions import DaemonDiedError
from dvml.store import catalog
from dvml.store.datasets import Dataset, delete_by_instance, delete_layout, run_on
from dvml.store.tensors import STAGING_PREFIX, delete_objects

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger("dvml.store")

__all__ = [
    "LAYOUT_KEYS",
    "cleanup_run",
    "layout_of",
    "placement_summary",
    "publish_run",
    "staging_name",
]

LAYOUT_KEYS = ("index", "rows", "instance_id", "worker", "worker_name", "host", "fields")


def staging_name(run_id: str, index: int, attempt: int) -> str:
    """The staging name of one attempt at one buffer (fields are put under ``<name>/<field>``)."""
    return f"{STAGING_PREFIX}{run_id}/{index}/{attempt}-{uuid.uuid4().hex[:8]}"


def layout_of(buffers: list[dict[str, Any]]) -> dict[str, Any]:
    """The catalog layout of buffers in index order: total field shapes and buffer records."""
    ordered = sorted(buffers, key=lambda b: b["index"])
    fields = {}
    for field, spec in ordered[0]["fields"].items():
        shape = list(spec["shape"])
        shape[0] = sum(b["fields"][field]["shape"][0] for b in ordered)
        fields[field] = {"shape": shape}
    return {"fields": fields, "buffers": [{k: b[k] for k in LAYOUT_KEYS} for b in ordered]}


def placement_summary(layout: dict[str, Any]) -> dict[str, Any]:
    """Rows and bytes per worker and one line per buffer (the keys a preprocessor writes)."""
    rows: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for b in layout["buffers"]:
        rows[b["worker_name"]] = rows.get(b["worker_name"], 0) + b["rows"]
        size = sum(f["nbytes"] for f in b["fields"].values())
        nbytes[b["worker_name"]] = nbytes.get(b["worker_name"], 0) + size
    return {
        "rows": sum(rows.values()),
        "rows_per_worker": rows,
        "bytes_per_worker": nbytes,
        "buffer_size": max(b["rows"] for b in layout["buffers"]),
        "buffers": [
            {"buffer": b["index"], "worker": b["worker"], "worker_name": b["worker_name"],
             "host": b["host"], "vineyard_instance_id": b["instance_id"], "rows": b["rows"]}
            for b in layout["buffers"]
        ],
    }  # fmt: skip


def publish_run(
    client: Client,
    name: str,
    kind: str,
    summary: dict[str, Any],
    produce: Callable[[str], list[dict[str, Any]]],
    finish: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]] | None = None,
    overwrite: bool = True,
) -> Dataset:
    """Produce the buffers of a run, publish them under ``name`` (replacing it), clean up.

    Parameters
    ----------
    produce : callable
        ``produce(run_id) -> buffer records``; puts objects under :func:`staging_name`.
    finish : callable, optional
        ``finish(summary, buffers) -> summary``: last additions to the summary.
    """
    run_id = uuid.uuid4().hex[:16]
    try:
        buffers = produce(run_id)
        layout = layout_of(buffers)
        summary = {**summary, **placement_summary(layout)}
        if finish is not None:
            summary = finish(summary, buffers)
        # Only the names of the published buffers are dropped with the publication: an object
        # staged by an attempt whose worker died keeps its name, so that cleanup_run finds
        # and deletes it. Any live worker publishes.
        kept = {f["id"] for b in layout["buffers"] for f in b["fields"].values()}
        staged = [
            n for n, oid, _ in run_on(client, None, catalog.staging_objects, run_id) if oid in kept
        ]
        published = run_on(
            client, None, catalog.publish, name, kind, summary, layout, overwrite, staged
        )
    except BaseException:
        cleanup_run(client, run_id, keep=None)
        raise
    cleanup_run(client, run_id, keep=layout)
    replaced = published["replaced"]
    if replaced is not None:
        delete_layout(client, replaced["layout"])
        run_on(client, None, catalog.drop_metadata, replaced, False)
    return Dataset(name=name, id=published["id"], kind=kind, summary=summary, layout=layout,
                   global_tensors=published["global_tensors"])  # fmt: skip


def cleanup_run(client: Client, run_id: str, keep: dict[str, Any] | None) -> None:
    """Delete every staged object of ``run_id`` that is not in ``keep``; drop staging names."""
    try:
        staged = run_on(client, None, catalog.staging_objects, run_id)
    except DaemonDiedError:  # the caller's own error names the daemon
        return
    except Exception:  # the cluster itself is failing: nothing more can be cleaned
        logger.warning("could not list staged objects of run %s", run_id, exc_info=True)
        return
    kept = set()
    if keep is not None:
        kept = {f["id"] for b in keep["buffers"] for f in b["fields"].values()}
    ids: dict[int, list[int]] = {}
    names: dict[int, list[str]] = {}
    for staging_name, oid, iid in staged:
        names.setdefault(iid, []).append(staging_name)
        if oid not in kept:
            ids.setdefault(iid, []).append(oid)
    delete_by_instance(client, ids, names)
    orphan_names = names.get(-1, [])
    if orphan_names:
        run_on(client, None, _drop_names, orphan_names)


def _drop_names(names: list[str]) -> None:
    delete_objects([], names)
