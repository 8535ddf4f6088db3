"""Small lookups shared by the cache and its persistence: what a name holds, where it lives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import StoreError
from dvml.store import catalog
from dvml.store.datasets import Dataset, buffer_workers, lost_buffers, run_on, vineyard_workers

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["by_key", "existing", "intact", "source_workers", "with_summary"]


def existing(client: Client, name: str) -> Dataset | None:
    """The dataset or feature cache called ``name``, or None."""
    record = run_on(client, None, catalog.find_record, name)
    return None if record is None else Dataset.from_record(record)


def with_summary(client: Client, kind: str, field: str, value: str) -> list[Dataset]:
    """Every dataset of ``kind`` whose summary's ``field`` is ``value``, newest first."""
    records = run_on(client, None, catalog.list_records)
    found = [Dataset.from_record(r) for r in records
             if r["kind"] == kind and r["summary"].get(field) == value]  # fmt: skip
    return sorted(found, key=lambda ds: (ds.summary.get("created_at") or "", ds.name),
                  reverse=True)  # fmt: skip


def by_key(client: Client, kind: str, key: str) -> Dataset | None:
    """The newest intact dataset of ``kind`` whose summary's ``cache_key`` is ``key``, or None.

    A cache is found by what it holds, not by what it is called: a request without a name must
    hit a cache stored under another name rather than compute a duplicate.
    """
    return next((ds for ds in with_summary(client, kind, "cache_key", key)
                 if intact(client, ds)), None)  # fmt: skip


def intact(client: Client, ds: Dataset) -> bool:
    """Whether a live worker serves the vineyard instance of every buffer of ``ds``."""
    return not lost_buffers(ds.layout, vineyard_workers(client))


def source_workers(client: Client, dataset: Dataset) -> list[WorkerInfo]:
    """The live worker of every buffer of ``dataset``, in buffer order.

    Raises
    ------
    StoreError
        When a buffer's vineyardd is served by no live worker (its data is lost).
    """
    return buffer_workers(client, dataset, StoreError)
