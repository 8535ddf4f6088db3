"""Feature caches as first-class objects: list, describe, drop, and the backbone call counts.

Like :mod:`dvml.store.datasets`, restricted to datasets of kind ``"feature_cache"``; every call
runs small tasks on the workers and no tensor data reaches the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dvml.cluster import current_client
from dvml.exceptions import DatasetNotFoundError, StoreError
from dvml.features import featurize
from dvml.features.lookup import source_workers
from dvml.store import catalog, datasets
from dvml.store.datasets import Dataset, run_on

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

__all__ = ["KIND", "calls", "describe", "drop", "list", "to_numpy"]

# The kind of dataset a feature cache is: plain datasets and feature caches share one catalog.
KIND = "feature_cache"

COLUMNS = [
    "name", "rows", "feature_shape", "backbone", "layer", "pooling", "source",
    "source_current", "workers", "nbytes", "bytes_per_worker", "created", "cache_key",
]  # fmt: skip


def describe(name: str, client: Client | None = None) -> Dataset:
    """The feature cache ``name``: its key, backbone, source and where its buffers live.

    Parameters
    ----------
    name : str
        The cache's name.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    Dataset
        ``.summary`` holds the cache key and its parts, the backbone's description and the
        source; ``.distribution()`` the rows and bytes per worker.

    Raises
    ------
    DatasetNotFoundError
        When no feature cache has this name (also for a plain dataset).
    """
    ds = datasets.describe(name, current_client(client))
    if ds.kind != KIND:
        raise DatasetNotFoundError(
            f"{name!r} is a {ds.kind}, not a feature cache. Received: name={name!r}. List "
            "feature caches with dvml.features.list(), datasets with dvml.datasets.list()."
        )
    return ds


def _current(now: tuple[Any, int] | None, source: dict[str, Any]) -> bool | None:
    """Whether the cache's source dataset is still what it featurized (None: a raw source)."""
    if not source.get("kept"):
        return None
    if now is None or now[0] != source.get("dataset_id"):
        return False
    return source.get("version") is None or source["version"] == now[1]  # None: before versions


def list(client: Client | None = None) -> pd.DataFrame:
    """Every feature cache: size, backbone, layer, pooling, source and bytes per worker.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    pandas.DataFrame
        One row per cache. ``source_current`` says whether the packed dataset it was
        computed from still exists unchanged, at the version it featurized (False after an
        append: ask for the cache again and only the new rows are featurized), None when the
        source was raw images, packed only for the cache.
    """
    import pandas as pd

    records = run_on(current_client(client), None, catalog.list_records)
    # a dataset's identity and its latest version: an append keeps the id and adds rows
    current = {
        r["name"]: (r["summary"].get("dataset_id"), Dataset.from_record(r).version) for r in records
    }
    rows = []
    for r in records:
        if r["kind"] != KIND:
            continue
        ds = Dataset.from_record(r)
        s = ds.summary
        source = s.get("source") or {}
        rows.append({
            "name": ds.name,
            "rows": ds.rows,
            "feature_shape": tuple(s["x_shapes"][0]),
            "backbone": (s.get("backbone") or {}).get("description"),
            "layer": (s.get("backbone") or {}).get("output_layer"),
            "pooling": (s.get("backbone") or {}).get("pooling"),
            "source": source.get("description"),
            "source_current": _current(current.get(source["name"]), source),
            "workers": len({b["worker_name"] for b in ds.layout["buffers"]}),
            "nbytes": ds.nbytes,
            "bytes_per_worker": dict(s.get("bytes_per_worker") or {}),
            "created": s.get("created_at"),
            "cache_key": s.get("cache_key"),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def drop(name: str, client: Client | None = None, force: bool = False) -> None:
    """Free the cache's vineyard memory on every worker and remove its name.

    Parameters
    ----------
    name : str
        The cache's name.
    client : distributed.Client, optional
        The cluster's client (default: the current one).
    force : bool
        Drop it even while a job (a fit on the features) reads it; by default that is
        refused (:func:`dvml.datasets.drop`).
    """
    client = current_client(client)
    describe(name, client)
    datasets.drop(name, client=client, force=force)


def calls(client: Client | None = None) -> dict[str, int]:
    """Extractors built, backbone batches run and rows featurized, summed over the workers.

    Counts live in the worker processes (:data:`dvml.features.featurize.CALLS`) and restart from
    zero when a worker restarts: compare two readings to see whether a call ran the backbone.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    dict of str to int
        Each count of :data:`dvml.features.featurize.CALLS`, summed.
    """
    per_worker = current_client(client).run(featurize.calls)
    total = dict.fromkeys(featurize.CALLS, 0)
    for counts in per_worker.values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def to_numpy(name: str, max_bytes: int = 256 * 2**20,
             client: Client | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Copy a (small) feature cache to the client, for inspection, plots and tests.

    Parameters
    ----------
    name : str
        The cache's name.
    max_bytes : int
        Larger caches are refused (StoreError): training never needs this copy.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    dict of str to numpy.ndarray
        ``{"x_0": features, "y": one-hot labels}``, rows in buffer order.
    """
    client = current_client(client)
    ds = describe(name, client)
    if ds.nbytes > max_bytes:
        raise StoreError(
            f"Feature cache {name!r} holds {ds.nbytes} bytes, more than max_bytes={max_bytes}. "
            "Train on it where it lives (dvml.fit), or raise max_bytes."
        )
    workers = {w.address: w for w in source_workers(client, ds)}
    futures = [client.submit(featurize.read_buffers, name, workers=[a], allow_other_workers=False,
                             pure=False) for a in workers]  # fmt: skip
    buffers: dict[int, dict[str, np.ndarray]] = {}
    for part in client.gather(futures):
        buffers.update(part)
    fields = ds.layout["fields"]
    return {f: np.concatenate([buffers[b["index"]][f] for b in ds.layout["buffers"]])
            for f in fields}  # fmt: skip
