"""Incremental feature caches: after an append, the backbone runs on the new buffers only.

A dataset's append publishes version n+1 as version n's buffers plus new ones, none copied
(:mod:`dvml.store.versions`), so the features of version n's buffers are still right. A
cache records the source version it covers and the content digest of every source buffer it
featurized; a request for the features of a later version of the SAME dataset (same
``dataset_id``, i.e. not preprocessed again) with the same backbone, layer, pooling and
preprocessing (the *lineage key*: the cache key without the version) extends that cache with
the features of the buffers added since, published as the cache's next version (its old
feature buffers shared, not copied). Anything else (another backbone, a dataset packed
again, a buffer whose digest changed) computes the features anew.

Plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dvml.store.versions import buffer_version

__all__ = ["covered_buffers", "new_buffers", "source_digests"]


def source_digests(versions: Sequence[Mapping[str, Any]], version: int) -> dict[str, str | None]:
    """The content digest of every buffer of ``version`` (buffer index as text → digest)."""
    digests: dict[str, str | None] = {}
    for record in versions:
        if int(record["version"]) <= version:
            digests.update(record.get("digests") or {})
    return digests


def covered_buffers(
    cache_summary: Mapping[str, Any], lineage_key: str, digests: Mapping[str, str | None]
) -> int | None:
    """The source version an existing cache covers, when it can be extended; else None.

    It can be when it was computed under ``lineage_key`` and every source buffer it
    featurized still has the digest it had then (``digests``: the source's buffers now).
    """
    if cache_summary.get("lineage_key") != lineage_key:
        return None
    source = cache_summary.get("source") or {}
    covered = source.get("version")
    had = source.get("digests")
    if covered is None or not had:
        return None
    if any(digest is None or digests.get(i) != digest for i, digest in had.items()):
        return None
    return int(covered)


def new_buffers(layout: Mapping[str, Any], covered: int) -> list[int]:
    """Positions in ``layout["buffers"]`` of the buffers added after version ``covered``."""
    return [i for i, b in enumerate(layout["buffers"]) if buffer_version(b) > covered]
