"""Save a feature cache to disk and load it back into vineyard after a restart.

On disk::

    directory/
      manifest.json              the summary, the layout and one entry per buffer (written last)
      worker-0/buffer-00000.x_0.npy   written by the worker that held buffer 0
      worker-0/buffer-00000.y.npy
      worker-1/buffer-00001.x_0.npy   ...

Every ``.npy`` file is written by the worker that holds the buffer, straight from its shared
memory, into ``directory/<worker name>/``; the client writes only the manifest. On one machine
(a LocalCluster) that is one shared directory. On a real cluster each host writes the files
of its own workers under the same path on its own disk (or on a shared file system), and the
client's host keeps the manifest: load on a cluster whose workers have the same names, or use
a shared file system so that any worker can read any file.

:func:`load` puts every buffer back on the worker of the same name. If some of those workers
are gone, the rows are spread evenly over all workers instead (a rebalanced layout; that needs
every worker to see every file).
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.cluster import current_client
from dvml.cluster.pinned import run_pinned
from dvml.cluster.spec import parse_memory
from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import DatasetExistsError, StoreError
from dvml.features import featurize
from dvml.features.keys import check_cache_name
from dvml.features.lookup import existing, intact, source_workers
from dvml.features.manage import KIND, describe
from dvml.placement import partition_seed, plan_layout, split_partition
from dvml.store.datasets import Dataset, vineyard_workers
from dvml.store.publish import publish_run, staging_name

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["FORMAT", "MANIFEST", "load", "save"]

FORMAT = "dvml-feature-cache"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def save(name: str, directory: str | os.PathLike[str], overwrite: bool = False,
         client: Client | None = None) -> str:  # fmt: skip
    """Write the feature cache ``name`` to ``directory``; return the manifest's path.

    Parameters
    ----------
    name : str
        A feature cache.
    directory : str or path
        Created if missing. Each worker writes its buffers into ``directory/<worker name>/``.
    overwrite : bool
        Replace a cache saved in ``directory`` before.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    str
        The path of the manifest written into ``directory``.

    Raises
    ------
    DatasetExistsError
        ``directory`` holds a saved cache and ``overwrite`` is False.
    """
    client = current_client(client)
    ds = describe(name, client)
    root = os.path.abspath(os.fspath(directory))
    manifest = os.path.join(root, MANIFEST)
    if os.path.exists(manifest):
        if not overwrite:
            raise DatasetExistsError(
                f"{root} holds a saved feature cache already ({MANIFEST}). Pass overwrite=True "
                "to replace it, or choose another directory."
            )
        os.remove(manifest)  # first: a half-done new save must not look complete
    os.makedirs(root, exist_ok=True)
    buffers = ds.layout["buffers"]
    targets = source_workers(client, ds)

    def submit(i: int, address: str, attempt: int) -> Any:
        return client.submit(
            featurize.save_buffer, ds.name, ds.summary["dataset_id"], buffers[i]["index"], root,
            workers=[address], allow_other_workers=False, pure=False, retries=0,
        )  # fmt: skip

    saved = run_pinned(client, submit, targets, "saving")
    content = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": ds.name,
        "kind": ds.kind,
        "summary": ds.summary,
        "layout": ds.layout,
        "buffers": saved,
        "saved_at": _now(),
    }
    with open(manifest + ".tmp", "w") as f:
        json.dump(content, f)
    os.replace(manifest + ".tmp", manifest)
    return manifest


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a saved cache (raises StoreError when there is none or it is foreign)."""
    path = os.path.join(os.path.abspath(os.fspath(directory)), MANIFEST)
    try:
        with open(path) as f:
            content = json.load(f)
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"No saved feature cache in {os.fspath(directory)!r}: cannot read {path} ({exc}). "
            "Save one with dvml.features.save(name, directory); a save that did not finish "
            "has no manifest."
        ) from None
    if content.get("format") != FORMAT or content.get("format_version") != FORMAT_VERSION:
        raise StoreError(
            f"{path} is not a dvml feature cache manifest of version {FORMAT_VERSION}. "
            f"Received: format={content.get('format')!r}, "
            f"format_version={content.get('format_version')!r}."
        )
    return dict(content)


def load(directory: str | os.PathLike[str], name: str | None = None, overwrite: bool = False,
         client: Client | None = None) -> Dataset:  # fmt: skip
    """Put a saved feature cache back into vineyard and return it.

    Parameters
    ----------
    directory : str or path
        Where :func:`save` wrote it.
    name : str, optional
        The name to load it under (default: the saved name).
    overwrite : bool
        Replace another dataset of that name. The same cache, loaded already, is returned
        as it is.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    Dataset
        The feature cache: each buffer on the worker of the same name as when it was saved,
        or, when one of those workers is gone, the rows spread evenly over every worker.
    """
    client = current_client(client)
    root = os.path.abspath(os.fspath(directory))
    manifest = read_manifest(root)
    name = check_cache_name(name) or manifest["name"]
    summary = manifest["summary"]
    found = existing(client, name)
    if found is not None:
        same = (found.kind == KIND
                and found.summary.get("cache_key") == summary.get("cache_key")
                and found.summary.get("dataset_id") == summary.get("dataset_id"))  # fmt: skip
        if same and intact(client, found):
            return found
        if not overwrite:
            raise DatasetExistsError(
                f"A dataset named {name!r} exists and is not this saved cache. Pass "
                "overwrite=True to replace it, or load under another name=."
            )
    saved = sorted(manifest["buffers"], key=lambda b: b["index"])
    by_name = {w.name: w for w in vineyard_workers(client).values()}
    if all(b["worker_name"] in by_name for b in saved):
        targets = [by_name[b["worker_name"]] for b in saved]
        pieces: list[list[tuple[dict[str, Any], Any]]] = [[(b["files"], None)] for b in saved]
        rebalanced = False
    else:
        targets, pieces = _rebalance(saved, summary, sorted(by_name.values(),
                                                            key=lambda w: w.name))  # fmt: skip
        rebalanced = True

    def produce(run_id: str) -> list[dict[str, Any]]:
        def submit(j: int, address: str, attempt: int) -> Any:
            return client.submit(
                featurize.load_buffer, root, pieces[j], j, staging_name(run_id, j, attempt),
                workers=[address], allow_other_workers=False, pure=False, retries=0,
            )  # fmt: skip

        return list(run_pinned(client, submit, targets, "loading"))

    summary = {**summary, "output_table": name, "loaded_from": root, "loaded_at": _now(),
               "rebalanced": rebalanced}  # fmt: skip
    return publish_run(client, name, KIND, summary, produce)


def _rebalance(
    saved: list[dict[str, Any]], summary: dict[str, Any], workers: list[WorkerInfo]
) -> tuple[list[WorkerInfo], list[list[tuple[dict[str, Any], Any]]]]:
    """Spread the saved rows evenly over ``workers``: which rows of which file go where."""
    if not workers:
        raise StoreError("No worker has a reachable vineyardd to load the cache into.")
    rows = [int(b["rows"]) for b in saved]
    row_bytes = 4 * (math.prod(summary["x_shapes"][0]) + int(summary["num_classes"]))
    max_bytes = parse_memory(config.get("preprocess.max-buffer-bytes"),
                             "dvml.preprocess.max-buffer-bytes")  # fmt: skip
    seed = int(summary.get("seed") or 0)
    by_address = {w.address: w for w in workers}
    layout = plan_layout(rows, list(by_address), None, row_bytes, max_bytes, seed)
    splits = [split_partition(n, layout.counts[p], partition_seed(seed, p))
              for p, n in enumerate(rows)]  # fmt: skip
    targets = [by_address[b.worker] for b in layout.buffers]
    pieces = [
        [(saved[p]["files"], splits[p][j]) for p in range(len(saved)) if len(splits[p][j])]
        for j in range(layout.n_buffers)
    ]
    return targets, pieces


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
