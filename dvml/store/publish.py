"""Publish buffers as one named dataset, atomically, or leave nothing behind.

Used by the pack graph (:mod:`dvml.preprocess.graph`) and the feature cache: every buffer is
staged under a staging name of this run (:mod:`dvml.store.staging`); the dataset's name
appears last, in one step; on any failure (an exception, a Ctrl-C) every staged object of the
run is deleted, and on success every staged object that did not make it into the dataset (an
attempt whose worker died) is deleted too.

What goes through etcd, the cost that grew with buffers before (each write takes vineyard's
cluster-wide metadata lock): staging a buffer writes nothing; publication persists each
instance's buffers in one transaction (one task per instance, in parallel), then one
GlobalTensor per field, the root and its name; cleanup deletes each instance's staged
wrappers in one call. So a run costs O(instances + fields) locked writes, whatever the number
of buffers.

Risks kept in view:

- a run whose publication succeeded but whose result was lost on its way back (the worker
  died after naming the dataset, a Ctrl-C while waiting) is cleaned up as failed: the
  cleanup keeps the tensors of a named dataset that records this run, so it never deletes a
  published dataset;
- a Ctrl-C while the publication task still runs: the cleanup waits for that task first, so
  that the task cannot name a dataset whose tensors the cleanup is deleting;
- an attempt whose worker died leaves its staged objects on its (surviving) vineyardd: they
  carry the run's id and are deleted by the run's cleanup, published or not;
- an attempt killed after sealing a blob but before its staged wrapper referenced it leaves a
  blob that no staging name leads to: every cleanup sweeps its instance for sealed blobs that
  no object references, under the vineyardd's allocation lock, which writers hold over that
  window (:func:`dvml.store.staging.sweep_orphans`);
- the client itself dies: the staged objects stay until ``dvml.jobs``' cleanup
  (:func:`staged_objects` by run, :func:`cleanup_run`) deletes them.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml.cluster.health import wait_watched
from dvml.exceptions import DaemonDiedError, StoreError
from dvml.store import catalog, staging
from dvml.store.datasets import Dataset, delete_layout, run_on, vineyard_workers
from dvml.store.events import log_published
from dvml.store.leases import unleased
from dvml.store.tensors import STAGING_PREFIX
from dvml.store.versions import buffer_version, placement_summary

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

logger = logging.getLogger("dvml.store")

__all__ = [
    "LAYOUT_KEYS",
    "appended_layout",
    "cleanup_run",
    "layout_of",
    "placement_summary",
    "publish_run",
    "staged_objects",
    "staging_name",
]

LAYOUT_KEYS = ("index", "rows", "instance_id", "worker", "worker_name", "host", "fields")
# "version": the version that added a buffer (dvml.store.versions), set at publication.
_OPTIONAL_KEYS = ("version",)


def staging_name(run_id: str, index: int, attempt: int) -> str:
    """The staging name of one attempt at buffer ``index`` (carried by its staged wrappers).

    A pack task that writes several buffers stages them all under the name of its first.
    """
    return f"{STAGING_PREFIX}{run_id}/{index}/{attempt}-{uuid.uuid4().hex[:8]}"


def layout_of(buffers: list[dict[str, Any]]) -> dict[str, Any]:
    """The catalog layout of buffers in index order: total field shapes and buffer records."""
    ordered = sorted(buffers, key=lambda b: b["index"])
    fields = {}
    for field, spec in ordered[0]["fields"].items():
        shape = list(spec["shape"])
        shape[0] = sum(b["fields"][field]["shape"][0] for b in ordered)
        fields[field] = {"shape": shape}
    keys = LAYOUT_KEYS + _OPTIONAL_KEYS
    return {"fields": fields, "buffers": [{k: b[k] for k in keys if k in b} for b in ordered]}


def appended_layout(base: dict[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
    """The layout of ``base``'s buffers followed by ``new`` ones (indexed after them).

    The base buffers keep their objects and record the version that added them; the new
    ones carry no version yet (:func:`dvml.store.catalog.publish` gives them the next).
    """
    old = [{**b, "version": buffer_version(b)} for b in base["buffers"]]
    offset = len(old)
    return layout_of([*old, *({**b, "index": offset + b["index"]} for b in new)])


def publish_run(
    client: Client,
    name: str,
    kind: str,
    summary: dict[str, Any],
    produce: Callable[[str], list[dict[str, Any]]],
    finish: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]] | None = None,
    overwrite: bool = True,
    force: bool = False,
    append_to: Dataset | None = None,
    source: dict[str, Any] | None = None,
) -> Dataset:
    """Produce the buffers of a run, publish them under ``name`` (replacing it), clean up.

    Parameters
    ----------
    produce : callable
        ``produce(run_id) -> buffer records``; puts objects under :func:`staging_name`.
    finish : callable, optional
        ``finish(summary, buffers) -> summary``: last additions to the summary.
    append_to : Dataset, optional
        Publish the produced buffers as the next version of this dataset: its buffers plus
        the new ones, none copied (:mod:`dvml.store.versions`). Nothing is freed, so no lease
        is needed; the name must still point at ``append_to`` when the version is published.
    source : dict, optional
        The source description recorded in the new version.
    """
    run_id = uuid.uuid4().hex[:16]
    publishing = None
    # Held from the replacement of the name to the deletion of the replaced tensors: a job
    # reading the old dataset holds a lease (dvml.store.leases), and none starts meanwhile.
    guard = contextlib.ExitStack()
    try:
        buffers = produce(run_id)
        fresh = layout_of(buffers)
        layout = fresh if append_to is None else appended_layout(append_to.layout, buffers)
        summary = {**summary, **placement_summary(layout)}
        if finish is not None:
            summary = finish(summary, buffers)
        by_instance = _ids_by_instance(fresh)  # an append's old buffers are persisted
        workers = vineyard_workers(client)  # asks every worker: once for the whole publication
        lost = sorted(set(by_instance) - set(workers))
        if lost:
            raise StoreError(
                f"Buffers of this run were written to vineyard instances {lost}, which no "
                "live worker serves now: that data is lost with its daemon. Nothing was "
                "published; check `dvml cluster status` and run again."
            )
        _on_instances(client, workers, staging.persist_staged, by_instance, run_id)
        if overwrite and append_to is None:  # an append frees nothing: readers keep theirs
            guard.enter_context(unleased(name, "overwrite", force, client))
        publishing = client.submit(
            catalog.publish, name, kind, summary, layout, overwrite or append_to is not None,
            run_id, None if append_to is None else append_to.id, source,
            workers=[workers[min(workers)].address], allow_other_workers=False, pure=False,
        )  # fmt: skip
        wait_watched(client, [publishing], f"publishing {name!r}")
        published = publishing.result()
    except BaseException:
        if publishing is not None and not publishing.done():
            _wait_quietly(publishing)
        cleanup_run(client, run_id, keep=None)
        guard.close()
        raise
    with guard:
        layout = published["layout"]
        cleanup_run(client, run_id, keep=layout, workers=workers)
        replaced = published["replaced"]
        if replaced is not None:
            # Only the buffers the new version does not share (all of them after an overwrite,
            # none after an append).
            delete_layout(client, _without(replaced["layout"], layout))
            run_on(client, None, catalog.drop_metadata, replaced, False)
    log_published(client, name, kind, layout)
    return Dataset(name=name, id=published["id"], kind=kind, summary=summary, layout=layout,
                   global_tensors=published["global_tensors"], versions=published["versions"],
                   version=published["version"])  # fmt: skip


def _without(layout: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    """``layout`` less the buffers whose objects ``kept`` holds too."""
    ids = {f["id"] for b in kept["buffers"] for f in b["fields"].values()}
    buffers = [b for b in layout["buffers"]
               if not any(f["id"] in ids for f in b["fields"].values())]  # fmt: skip
    return {**layout, "buffers": buffers}


def cleanup_run(
    client: Client,
    run_id: str,
    keep: dict[str, Any] | None,
    workers: dict[int, WorkerInfo] | None = None,
) -> None:
    """Delete every staged object of ``run_id`` except the tensors of ``keep`` (a layout).

    One task per vineyard worker, in parallel, each on its own instance
    (:func:`dvml.store.staging.discard_staged`); the tensors of a dataset that this run
    published and named are kept even when ``keep`` is None. Failures are logged, not raised:
    this runs while another error propagates. ``workers``: :func:`vineyard_workers`, when
    the caller has it.
    """
    kept = _ids_by_instance(keep) if keep is not None else {}
    try:
        # The live vineyardds only: a pack that failed because ANOTHER worker's daemon died
        # must still delete what it staged on the live ones (etcd is still required).
        workers = vineyard_workers(client, all_vineyardds=False) if workers is None else workers
        futures = [
            client.submit(staging.discard_staged, run_id, kept.get(iid, []),
                          workers=[w.address], allow_other_workers=False, pure=False)
            for iid, w in workers.items()
        ]  # fmt: skip
        wait_watched(client, futures)
        client.gather(futures)
    except DaemonDiedError:  # the caller's own error names the daemon
        return
    except Exception:  # the cluster itself is failing: nothing more can be cleaned
        logger.warning("could not clean up the staged objects of run %s", run_id, exc_info=True)


def staged_objects(client: Client, run_id: str | None = None) -> list[tuple[str, int, int]]:
    """Staged objects of every vineyard instance: ``(staging name, object id, instance id)``.

    Objects of ``run_id`` only, when given; the run of each is
    :func:`dvml.store.staging.run_of` its staging name. Objects on an instance that no live
    worker serves are lost with their daemon and not listed.
    """
    found: list[tuple[str, int, int]] = []
    live = vineyard_workers(client, all_vineyardds=False)  # a dead daemon's objects are lost
    for part in _on_instances(client, live, staging.staged_objects, None, run_id):
        found.extend((str(n), int(o), int(i)) for n, o, i in part)
    return sorted(found)


def _ids_by_instance(layout: dict[str, Any]) -> dict[int, list[int]]:
    ids: dict[int, list[int]] = {}
    for b in layout["buffers"]:
        ids.setdefault(b["instance_id"], []).extend(f["id"] for f in b["fields"].values())
    return ids


def _on_instances(
    client: Client,
    workers: dict[int, WorkerInfo],
    fn: Any,
    per_instance: dict[int, Any] | None,
    *args: Any,
) -> list[Any]:
    """``fn(*args)`` on every vineyard worker, in parallel, and their results.

    With ``per_instance``, only on the instances it names, as ``fn(*args, per_instance[i])``.
    """
    futures = []
    for iid, worker in workers.items():
        if per_instance is not None and iid not in per_instance:
            continue
        extra = () if per_instance is None else (per_instance[iid],)
        futures.append(client.submit(fn, *args, *extra, workers=[worker.address],
                                     allow_other_workers=False, pure=False))  # fmt: skip
    # A task blocked in a vineyardd whose etcd died never ends: check the daemons while waiting.
    wait_watched(client, futures)
    return list(client.gather(futures))


def _wait_quietly(future: Any, timeout: float = 60) -> None:
    from distributed import wait

    try:
        wait([future], timeout=timeout)
    except BaseException:  # a second Ctrl-C, a timeout: clean up anyway
        pass
