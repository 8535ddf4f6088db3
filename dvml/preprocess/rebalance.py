"""Rebalance a dataset onto workers that joined: copy whole buffers, publish a new version.

The plan is pure (:func:`dvml.placement.move_plan.plan_rebalance`); this module runs it. Each
moved buffer is read on the worker that holds it (a copy of its fields leaves shared memory
as the task's result) and written into the new worker's vineyardd by a task pinned there:
bytes go worker to worker through Dask, as the pack's shuffle sends them; the client sees
none and the source is never read again. The copies are staged under a run id, persisted,
then published as the dataset's next version (same buffers, same digests, new placement; its
version record carries ``"rebalance"``: the moves and the bytes moved). On any failure the
run's staged copies are deleted and the dataset is left as it was.

The moved buffers' old copies are freed at once when no job holds a lease on the dataset.
While a job holds one, its trainers may be reading them through shared-memory views, so
they are kept: the new version's summary lists them (``"rebalance_pending_free"``) and the
next rebalance made while no lease holds the name, or the drop of the name, frees them
(:func:`free_pending`).

Lives in the preprocess layer because it uses both :mod:`dvml.placement` (the plan and the
distribution rules) and :mod:`dvml.store` (buffers, publication, leases), which sit side by
side one layer below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dvml.cluster.health import wait_watched
from dvml.cluster.workers import current_client, discover_workers
from dvml.placement.move_plan import GROWABLE_KINDS, plan_rebalance
from dvml.placement.rules import resolve_rules
from dvml.store import catalog, staging
from dvml.store.datasets import (
    Dataset,
    delete_by_instance,
    delete_layout,
    describe,
    run_on,
    vineyard_workers,
)
from dvml.store.leases import holders, read_leases
from dvml.store.publish import cleanup_run, staging_name
from dvml.store.tensors import put_arrays

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "PENDING",
    "copy_and_publish",
    "free_pending",
    "move_record",
    "read_fields",
    "rebalance",
    "write_fields",
]

PENDING = "rebalance_pending_free"
"""Summary key: old copies of moved buffers kept for leased readers, by vineyard instance."""


def read_fields(ids: dict[str, int], socket: str | None = None) -> dict[str, np.ndarray]:
    """Copies of this worker's tensors ``ids`` (field → object id), to send to another worker;
    with ``socket``, of the tensors of the vineyardd listening there (a re-pin reads a departed
    worker's daemon from another worker of its machine)."""
    from dvml.resolve.by_id import read_buffer

    return {field: np.array(read_buffer(oid, socket)) for field, oid in ids.items()}


def write_fields(arrays: dict[str, np.ndarray], staged_as: str) -> dict[str, Any]:
    """Put ``arrays`` into this worker's vineyardd, staged under ``staged_as``."""
    return put_arrays(arrays, staging_name=staged_as)


def rebalance(name: str, client: Client | None = None) -> dict[str, Any]:
    """Spread dataset ``name`` onto the workers that joined since it was packed.

    Re-applies the dataset's distribution rules to the current workers (``all_workers`` and
    ``gpu_workers`` grow; a ``gpu_workers`` dataset only onto GPU workers; explicit workers,
    hosts or tables do not move) and moves whole buffers from the most-loaded workers to the
    new ones until rows per worker are as equal as buffers allow, never giving a new worker
    more than its share. The result is the dataset's next version (same digests, new
    placement); jobs started afterwards place a trainer on every worker that holds rows.

    Parameters
    ----------
    name : str
        The dataset.
    client : distributed.Client, optional
        Default: the current client.

    Returns
    -------
    dict
        ``moves`` (``{"buffer", "from", "to", "rows", "nbytes"}`` each), ``bytes_moved``,
        ``share_bytes`` (the new workers' share of the dataset's bytes), ``new_workers``,
        ``rows_per_worker``, ``version`` (the published one, or the current one when nothing
        moved), ``freed`` (old copies freed now) and ``pending_free`` (kept for leased readers).
    """
    client = current_client(client)
    dataset = describe(name, client=client)
    rules = dataset.summary.get("distribution_rules", {})
    kind = str(rules.get("kind", "all_workers"))
    leased = bool(holders(name, read_leases(client)))
    freed = 0 if leased else free_pending(client, dataset)
    workers = discover_workers(client, omit_silent=True)
    targets = resolve_rules(rules.get("given", kind), workers) if kind in GROWABLE_KINDS else []
    buffers = [{"index": b["index"], "worker": b["worker"], "rows": b["rows"],
                "nbytes": sum(int(f["nbytes"]) for f in b["fields"].values())}
               for b in dataset.layout["buffers"]]  # fmt: skip
    plan = plan_rebalance(buffers, [w.address for w in targets], kind)
    result: dict[str, Any] = {
        "moves": [move_record(m) for m in plan.moves],
        "bytes_moved": plan.bytes_moved,
        "share_bytes": plan.share_bytes,
        "new_workers": list(plan.new_workers),
        "rows_per_worker": plan.rows_per_worker,
        "version": dataset.version,
        "freed": freed,
        "pending_free": 0,
    }
    if not plan.moves:
        return result
    by_address = {w.address: w for w in workers}
    published, old = copy_and_publish(client, dataset, plan.moves, by_address, result, leased)
    if leased:  # readers may hold views on the old copies: freed by a later rebalance or drop
        result["pending_free"] = sum(len(b["fields"]) for b in old["buffers"])
    else:
        delete_layout(client, old)
    result["version"] = published["version"]
    return result


def copy_and_publish(
    client: Client,
    dataset: Dataset,
    moves: Any,
    by_address: dict[str, Any],
    result: dict[str, Any],
    leased: bool,
    readers: dict[str, tuple[str, str | None]] | None = None,
    kind: str = "rebalance",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Copy the moved buffers, publish the next version; return it and the old copies' layout.

    ``readers``: for a move's source that is no live worker (a re-pin's departed one), the
    worker that reads its buffers and the socket of the vineyardd it reads them from. ``kind``
    names the publication in the version record's source (``"rebalance"``, ``"repin"``).
    """
    import uuid

    run_id = uuid.uuid4().hex[:16]
    layout = {**dataset.layout, "buffers": [dict(b) for b in dataset.layout["buffers"]]}
    by_index = {b["index"]: b for b in layout["buffers"]}
    try:
        futures = []
        for m in moves:
            ids = {f: int(v["id"]) for f, v in by_index[m.buffer]["fields"].items()}
            reader, socket = (readers or {}).get(m.source, (m.source, None))
            read = client.submit(read_fields, ids, socket, workers=[reader],
                                 allow_other_workers=False, pure=False)  # fmt: skip
            futures.append(client.submit(
                write_fields, read, staging_name(run_id, m.buffer, 0), workers=[m.target],
                allow_other_workers=False, pure=False))  # fmt: skip
        wait_watched(client, futures, f"rebalancing {dataset.name!r}")
        written = client.gather(futures)
        old_buffers = []
        for m, w in zip(moves, written, strict=True):
            buf, target = by_index[m.buffer], by_address[m.target]
            old_buffers.append(dict(buf))
            fields = {f: {**spec, "id": w["fields"][f]["id"]} for f, spec in buf["fields"].items()}
            buf.update(fields=fields, instance_id=int(w["instance_id"]), worker=target.address,
                       worker_name=target.name, host=target.host)  # fmt: skip
        new_ids: dict[int, list[int]] = {}
        for w in written:
            new_ids.setdefault(int(w["instance_id"]), []).extend(
                int(f["id"]) for f in w["fields"].values()
            )
        live = vineyard_workers(client)
        for iid, tensor_ids in new_ids.items():
            run_on(client, live[iid], staging.persist_staged, run_id, tensor_ids)
        summary = _summary(dataset.summary, layout)
        kept: dict[str, list[int]] = {} if not leased else dict(summary.get(PENDING) or {})
        for b in old_buffers if leased else []:
            kept.setdefault(str(b["instance_id"]), []).extend(
                int(f["id"]) for f in b["fields"].values()
            )
        summary[PENDING] = kept
        source = {kind: {"moves": result["moves"], "bytes_moved": result["bytes_moved"]}}
        published = run_on(client, None, catalog.publish, dataset.name, dataset.kind, summary,
                           layout, True, run_id, dataset.id, source)  # fmt: skip
    except BaseException:
        cleanup_run(client, run_id, keep=None)
        raise
    cleanup_run(client, run_id, keep=published["layout"])
    if published["replaced"] is not None:
        run_on(client, None, catalog.drop_metadata, published["replaced"], False)
    return published, {**layout, "buffers": old_buffers}


def move_record(m: Any) -> dict[str, Any]:
    """A :class:`~dvml.placement.move_plan.Move` as results and version records list it."""
    return {"buffer": m.buffer, "from": m.source, "to": m.target, "rows": m.rows,
            "nbytes": m.nbytes}  # fmt: skip


def _summary(summary: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    from dvml.store.versions import placement_summary

    return {**summary, **placement_summary(layout)}


def free_pending(client: Client, dataset: Dataset) -> int:
    """Free the old copies an earlier rebalance kept for leased readers; return how many.

    Call only when no lease holds the dataset. Idempotent: objects already gone are skipped,
    so the summary's list may outlive them until the next publication rewrites it.
    """
    kept = dataset.summary.get(PENDING) or {}
    if not kept:
        return 0
    return delete_by_instance(client, {int(i): list(ids) for i, ids in kept.items()}, {})
