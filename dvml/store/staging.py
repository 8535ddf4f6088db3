"""Staged buffers of unpublished runs, on the worker that owns them: list, persist, discard.

Buffers written by :func:`dvml.store.tensors.write_buffers` under a staging name are a few
*transient* tensors each (known to their own vineyardd only), wrapped in one
:data:`~dvml.store.tensors.STAGED_TYPENAME` object per call that carries the staging name
``<STAGING_PREFIX><run id>/<buffer>/<attempt>``. Nothing of it has gone through etcd. Each
function here runs on the worker of one vineyard instance (one task per instance, all of them
in parallel, from :mod:`dvml.store.publish`) and touches that instance's objects only:

- :func:`persist_staged` persists the buffers a run publishes, all of this instance's at once:
  one transient object whose members are those tensors is persisted, and vineyard persists a
  transient object's members with it, in one etcd transaction under one metadata lock. The
  object is tagged with the run, so that cleanup finds it too.
- :func:`discard_staged` deletes every staged object of a run except the tensors to keep and
  those of a dataset of that run that is already named: a run whose publication succeeded but
  whose result never reached the client is cleaned up without deleting the dataset.
- :func:`staged_objects` lists them (for the cleanup of runs whose client died).
- :func:`sweep_orphans`, part of every :func:`discard_staged`, deletes the blobs and
  dvml's transient tensors that no object references: what a writer killed between sealing
  its blobs and staging them left (no staging name reaches those).

The wrappers themselves are never published: the dataset references the tensors.
"""

from __future__ import annotations

import json
from typing import Any

from dvml.cluster.connection import local_client
from dvml.store.tensors import (
    STAGED_TYPENAME,
    STAGING_PREFIX,
    WRITER_KEY,
    allocation_lock,
    clear_writer_markers,
    writers_died,
)

__all__ = [
    "PERSISTED_TYPENAME",
    "discard_staged",
    "persist_staged",
    "published_tensors",
    "run_of",
    "staged_objects",
    "sweep_orphans",
]

# The object through which one instance's buffers of a run are persisted (members: tensors).
PERSISTED_TYPENAME = "dvml::StagedPersist"
_LIMIT = 1 << 30  # list everything: vineyard's default limit is 5
_BLOB = "vineyard::Blob"


def run_of(staging_name: str) -> str:
    """The run id in a staging name ``<STAGING_PREFIX><run id>/...``."""
    return staging_name[len(STAGING_PREFIX) :].split("/", 1)[0]


def _local_staged(client: Any, run_id: str | None) -> list[Any]:
    """This instance's staged objects (of one run, or of all runs), as metadata."""
    prefix = STAGING_PREFIX + (f"{run_id}/" if run_id else "")
    me = int(client.instance_id)
    found = []
    for pattern in (STAGED_TYPENAME, PERSISTED_TYPENAME):
        for meta in client.ipc_client.list_metadatas(pattern, limit=_LIMIT, nobuffer=True):
            if int(meta.instance_id) != me:
                continue  # persisted on another instance: listed by that instance's worker
            tag = meta.get("dvml_staging", "")
            if isinstance(tag, str) and tag.startswith(prefix):
                found.append(meta)
    return found


def staged_objects(run_id: str | None = None) -> list[tuple[str, int, int]]:
    """This instance's staged objects: ``(staging name, object id, instance id)``.

    Only local metadata is read (no etcd request).
    """
    client = local_client()
    return [(str(m["dvml_staging"]), int(m.id), int(m.instance_id))
            for m in _local_staged(client, run_id)]  # fmt: skip


def persist_staged(run_id: str, ids: list[int]) -> int:
    """Persist this instance's tensors ``ids`` of run ``run_id`` in one etcd transaction.

    Returns the id of the (persisted) object that carried them, tagged with the run; the
    run's :func:`discard_staged` deletes it.
    """
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    client = local_client()
    if not ids:
        return 0
    metas = client.ipc_client.get_metas([vineyard.ObjectID(int(i)) for i in ids])
    carrier = vineyard.ObjectMeta()
    carrier["typename"] = PERSISTED_TYPENAME
    carrier["dvml_staging"] = f"{STAGING_PREFIX}{run_id}/persist-{int(client.instance_id)}"
    for i, meta in enumerate(metas):
        carrier.add_member(f"tensor_-{i}", meta)  # full metas: no remote sync needed
    oid = client.create_metadata(carrier).id
    client.persist(oid)
    return int(oid)


def published_tensors(client: Any, run_id: str) -> set[int]:
    """Tensor ids of every NAMED dataset published by run ``run_id`` (after a metadata sync)."""
    from dvml.store.catalog import DATASET_TYPENAME

    client.sync_meta()  # a dataset named from another instance a moment ago must be seen
    kept: set[int] = set()
    for meta in client.ipc_client.list_metadatas(DATASET_TYPENAME, limit=_LIMIT, nobuffer=True):
        if meta.get("dvml_run", None) != run_id or not meta.get("__name", None):
            continue
        layout = json.loads(meta["dvml_layout"])
        kept.update(int(f["id"]) for b in layout["buffers"] for f in b["fields"].values())
    return kept


def discard_staged(run_id: str, keep: list[int]) -> int:
    """Delete this instance's staged objects of ``run_id``; keep the tensors in ``keep``.

    Tensors of a dataset of this run that is already named are kept as well, whatever
    ``keep`` says. The wrappers go in every case (the tensors they hold stay). Idempotent;
    returns how many staged objects were found. With nothing staged here, no request reaches
    etcd; otherwise at most one metadata sync and two deletes, whatever the number of buffers.
    """
    client = local_client()
    found = _discard(client, run_id, keep)
    sweep_orphans(client)
    return found


def _discard(client: Any, run_id: str, keep: list[int]) -> int:
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    staged = _local_staged(client, run_id)
    found = len(staged)
    if not found:
        return 0
    members = {int(i) for m in staged if m.typename == STAGED_TYPENAME
               for i in json.loads(m["dvml_members"])}  # fmt: skip
    doomed = members - {int(i) for i in keep}
    if doomed:
        doomed -= published_tensors(client, run_id)
    if doomed:
        # force: also the objects built on them (the run's persist carrier, a dataset of this
        # run that was created but never named); deep: their blobs. No existence check (each
        # costs vineyardd a round trip to etcd): vineyardd skips the ids that are gone, such
        # as those of a wrapper whose cleanup was interrupted between these two deletes.
        client.delete([vineyard.ObjectID(i) for i in sorted(doomed)], force=True, deep=True)
        staged = _local_staged(client, run_id)  # local metadata only
    if staged:
        # Not deep: the kept tensors stay; not force: nothing is built on a wrapper.
        client.delete([m.id for m in staged], force=False, deep=False)
    return found


def sweep_orphans(client: Any = None) -> int:
    """Delete this instance's blobs and tensors that a killed writer left; return how many.

    A writer killed after sealing a blob and before its staged wrapper (or a persist) referenced
    it leaves a sealed blob, or a transient tensor of dvml's (one with
    :data:`~dvml.store.tensors.WRITER_KEY`), that no object references and no staging name leads
    to (:func:`dvml.store.tensors.write_buffers`). Under the vineyardd's allocation lock, held
    exclusively, no live writer is in that window, so such objects are leftovers. Every dataset
    and feature cache references its tensors, every staged wrapper lists its tensors' ids, and
    every tensor references its blob, so they are never touched; nor is a transient tensor that
    dvml did not write. Local metadata only: no etcd request (the leftovers are transient). Does
    nothing where the lock cannot be had, nor when no writer died inside its window (it left no
    marker: :func:`~dvml.store.tensors.writers_died`), so most cleanups list nothing.
    """
    client = local_client() if client is None else client
    with allocation_lock(client, exclusive=True) as held:
        markers = writers_died(client) if held else []
        if not markers:  # no writer died inside its window: nothing can be orphaned
            return 0
        me = int(client.instance_id)
        blobs: list[Any] = []
        tensors: list[Any] = []
        referenced: set[int] = set()
        for meta in client.ipc_client.list_metadatas("*", limit=_LIMIT, nobuffer=True):
            for _, member in meta.items():  # members are ObjectMeta, the rest plain values
                if hasattr(member, "typename") and hasattr(member, "id"):
                    referenced.add(int(member.id))
            if meta.typename == STAGED_TYPENAME:  # a wrapper names its tensors by id
                referenced.update(int(i) for i in json.loads(meta["dvml_members"]))
            if int(meta.instance_id) != me:
                continue
            if meta.typename == _BLOB:
                blobs.append(meta.id)
            elif WRITER_KEY in meta and meta.get("transient", False) is True:
                tensors.append(meta.id)
        tensors = [t for t in tensors if int(t) not in referenced]
        blobs = [b for b in blobs if int(b) not in referenced]
        if tensors:  # deep: their blobs too
            client.delete(tensors, force=False, deep=True)
        if blobs:
            client.delete(blobs, force=False, deep=False)
        clear_writer_markers(markers)
    return len(tensors) + len(blobs)
