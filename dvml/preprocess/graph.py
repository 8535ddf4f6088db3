"""The pack graph: prepared parts → split groups → buffers pinned to their target workers.

::

    prepare(batch p) ─┐                                    fetch (worker to worker,
    prepare(batch q) ─┴─► split_group(g) on the worker  ─────── outside the graph) ─► pack(w, t)
                          that holds p and q                         thread t of target worker w

Its task count grows with partitions plus targets, not with their product: one prepare task per
source partition, or per batch of small consecutive partitions, fused with the source's own
tasks for them (:mod:`dvml.preprocess.fusion`); one stats and one split task per group of
batches that live on the same worker (:func:`~dvml.placement.routes.group_parts`: at least one
per thread, about 128 MiB each), and one pack task per thread of each target worker
(:func:`~dvml.placement.routes.pack_chunks`), which packs its buffers one after another. A
split lays out its group's rows buffer after buffer, buffers grouped by target, so the rows a
buffer needs from a group are ONE contiguous slice; a pack task fetches the slices of many
buffers at once straight from the workers that hold the groups
(:mod:`dvml.preprocess.exchange`) and writes its rows, shuffled, straight into vineyard shared
memory. Data moves worker to worker, each row once; the client sees only row counts, label sets
and object ids. A buffer holds the same rows in the same order as when every partition had its
own split task: the seeded shuffle does not depend on the grouping.
Every put is staged under a per-attempt name, so objects of a failed or retried pack are
found and deleted: a failed run leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dvml.cluster.pinned import NannyWatch, run_pinned, wait_while_targets_live
from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import ClusterError
from dvml.placement.planner import partition_seed
from dvml.placement.routes import group_parts, pack_chunks, plan_routes
from dvml.preprocess import tasks
from dvml.store.datasets import Dataset
from dvml.store.publish import publish_run, staging_name

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["compute_stats", "pack_and_publish"]


def _raise_first_error(futures: Sequence[Future]) -> None:
    for future in futures:
        if future.status in ("error", "cancelled"):
            future.result()  # raises the task's own error


def _holder_groups(client: Client, futures: Sequence[Future]) -> list[tuple[str, list[int]]]:
    """Groups of the parts (by position) that live on the same worker."""
    keys = [f.key for f in futures]
    who_has = client.who_has(list(futures))
    nbytes = client.nbytes(keys=keys, summary=False)
    holders = [min(who_has.get(k) or [""]) for k in keys]
    return group_parts(holders, [int(nbytes.get(k) or 0) for k in keys], client.nthreads())


def _submit_groups(
    client: Client,
    fn: Any,
    futures: Sequence[Future],
    groups: Sequence[tuple[str, list[int]]],
    per_group: Sequence[tuple[Any, ...]] | None = None,
    **kwargs: Any,
) -> list[Future]:
    """One task per group, where its parts are (another worker only if that one is gone)."""
    out = []
    for g, (holder, parts) in enumerate(groups):
        extra = per_group[g] if per_group is not None else ()
        where = {"workers": [holder], "allow_other_workers": True} if holder else {}
        out.append(client.submit(fn, [futures[p] for p in parts], *extra, pure=False,
                                 **where, **kwargs))  # fmt: skip
    return out


RESEND_TRIES = 3
"""Times a part of an in-memory frame is sent again when the worker holding it died."""


def _submit_parts(client: Client, parts: Sequence[Any]) -> list[Future]:
    """Start computing ``parts`` (Delayed batches, or :class:`~dvml.preprocess.tasks.
    ClientPart`, whose inputs go client to worker with ``scatter``); futures in their order."""
    held = [i for i, p in enumerate(parts) if isinstance(p, tasks.ClientPart)]
    graph = [i for i, p in enumerate(parts) if not isinstance(p, tasks.ClientPart)]
    futures: list[Any] = [None] * len(parts)
    for i, future in zip(graph, client.compute([parts[i] for i in graph]), strict=True):
        futures[i] = future
    for i, future in zip(held, _scatter_parts(client, [parts[i] for i in held]), strict=True):
        futures[i] = future
    return futures


def _scatter_parts(client: Client, parts: Sequence[tasks.ClientPart]) -> list[Future]:
    if not parts:
        return []
    # Round-robin over the workers, each part in one message straight to its worker.
    data = client.scatter([p.args for p in parts], direct=True, hash=False)
    return [
        client.submit(tasks.prepare_scattered, p.fn, d, pure=False, key=f"prepare-{d.key}")
        for p, d in zip(parts, data, strict=True)
    ]


def _wait_for_parts(
    client: Client, parts: Sequence[Any], futures: list[Future], watch: NannyWatch | None
) -> None:
    """Wait until every part is prepared. A worker that dies holding a part of an in-memory
    frame takes the only copy of its inputs with it (Dask cannot recompute scattered data):
    the client still has the rows and sends them again, to the workers alive, up to
    :data:`RESEND_TRIES` times. A target that left for good fails the wait (``watch``)."""
    from distributed.client import FuturesCancelledError

    for attempt in range(RESEND_TRIES + 1):
        try:
            wait_while_targets_live(client, futures, "packing", watch)
            return
        except FuturesCancelledError as exc:
            lost = [
                i
                for i, p in enumerate(parts)
                if isinstance(p, tasks.ClientPart) and futures[i].status == "cancelled"
            ]
            if not lost or attempt == RESEND_TRIES:
                raise ClusterError(
                    f"Parts of the data lost their worker while being prepared ({exc}). "
                    f"Received: {len(lost)} of {len(parts)} parts lost after {attempt} resends. "
                    "Nothing was published; check the workers (dvml cluster status) and run "
                    "the same call again."
                ) from None
            for i, future in zip(lost, _scatter_parts(client, [parts[i] for i in lost]),
                                 strict=True):  # fmt: skip
                futures[i] = future


def compute_stats(
    client: Client, parts: Sequence[Any], progress: bool = False, watch: NannyWatch | None = None
) -> tuple[list[Future], list[dict], list[int]]:
    """Prepare every part on the workers.

    ``parts`` compute batches (lists) of prepared parts (:class:`~dvml.preprocess.sources.
    SourceParts`). Returns the batches' futures, the small stats of every part in order, and
    the number of parts in each batch. With ``progress``, Dask's text progress bar follows the
    read/decode/validate tasks (they are not pinned, so Dask reruns them elsewhere if a worker
    dies and the bar always ends). The stats are computed by one task per group of batches
    that live on the same worker. ``watch``: the pack's targets (a target that left for good
    fails the wait at once).
    """

    futures = _submit_parts(client, parts)
    stats_futures: list[Future] = []
    try:
        if progress:
            from distributed import progress as progress_bar

            with client.as_current():
                progress_bar(futures, notebook=False)
            print(flush=True)
        _wait_for_parts(client, parts, futures, watch)
        _raise_first_error(futures)
        groups = _holder_groups(client, futures)
        stats_futures = _submit_groups(client, tasks.group_stats, futures, groups)
        by_batch: list[list[dict]] = [[] for _ in futures]
        for (_, members), found in zip(groups, client.gather(stats_futures), strict=True):
            for i, batch_stats in zip(members, found, strict=True):
                by_batch[i] = batch_stats
        return futures, [s for batch in by_batch for s in batch], [len(b) for b in by_batch]
    except BaseException:
        # Free the prepared parts on the workers now, not when the traceback is collected.
        client.cancel([*futures, *stats_futures])
        raise


def pack_and_publish(
    client: Client,
    prepared: list[Future],
    sizes: Sequence[int],
    counts: Any,
    buffer_targets: Sequence[WorkerInfo],
    split_args: dict[str, Any],
    seed: int,
    name: str,
    kind: str,
    summary: dict[str, Any],
    overwrite: bool,
    force: bool = False,
    watch: NannyWatch | None = None,
    append_to: Dataset | None = None,
    source: dict[str, Any] | None = None,
) -> Dataset:
    """Split, pack and publish; on any failure delete every object this run put.

    ``prepared`` are the batches of :func:`compute_stats`, ``sizes`` their numbers of parts.
    Takes ownership of ``prepared``: the list is emptied once every batch has its split task,
    so that each prepared part is freed on its worker as soon as its group is split, not when
    the whole run ends. Should a split result be lost with a worker, Dask recomputes it (and
    the parts, from their source). ``watch`` follows the targets (:class:`~dvml.cluster.
    pinned.NannyWatch`): one that left for good fails the pack at once. ``append_to`` and
    ``source``: as :func:`~dvml.store.publish.publish_run`.
    """

    def produce(run_id: str) -> list[dict[str, Any]]:
        return _pack(
            client, prepared, sizes, counts, buffer_targets, split_args, seed, run_id, watch
        )

    return publish_run(client, name, kind, summary, produce, overwrite=overwrite, force=force,
                       append_to=append_to, source=source)  # fmt: skip


def _pack(
    client: Client,
    prepared: list[Future],
    sizes: Sequence[int],
    counts: Any,
    buffer_targets: Sequence[WorkerInfo],
    split_args: dict[str, Any],
    seed: int,
    run_id: str,
    watch: NannyWatch | None,
) -> list[dict[str, Any]]:
    from distributed import Event

    counts = np.asarray(counts)
    groups = _holder_groups(client, prepared)  # of batches
    first = np.cumsum(sizes) - np.asarray(sizes, dtype=np.int64)
    group_parts = [[p for i in batches for p in range(first[i], first[i] + sizes[i])]
                   for _, batches in groups]  # fmt: skip
    routes = plan_routes(counts, [w.address for w in buffer_targets], group_parts)
    per_group = [
        (routes.group_counts[g], routes.starts[g], [partition_seed(seed, p) for p in parts])
        for g, parts in enumerate(routes.groups)
    ]
    encode = {k: v for k, v in split_args.items() if k != "x_shapes"}
    splits = _submit_groups(client, tasks.split_group, prepared, groups, per_group, **encode)
    prepared.clear()  # the splits hold the parts now (see pack_and_publish)
    try:
        # The packs read the splits' results outside the graph: they start once all exist.
        # A target whose host died meanwhile fails the pack now, not after its share of the
        # splits was recomputed elsewhere.
        wait_while_targets_live(client, splits, "packing", watch)
        _raise_first_error(splits)
        fields = {f"x_{i}": list(s) for i, s in enumerate(split_args["x_shapes"])}
        dtypes = split_args.get("field_dtypes")
        # class indices (the compact format) are one value a row; one-hot rows num_classes.
        # A multi-output set's other outputs are y_1, y_2, ...
        widths = [int(split_args["num_classes"])]
        widths += [int(w) for _, w in split_args.get("more_outputs") or []]
        for k, width in enumerate(widths):
            field = "y" if k == 0 else f"y_{k}"
            indices = dtypes is not None and np.dtype(dtypes[field]).kind in "iu"
            fields[field] = [] if indices else [width]
        keys = [f.key for f in splits]
        sources = [
            [(keys[g], start, stop, routes.groups[g]) for g, start, stop in routes.fetches[b]]
            for b in range(counts.shape[1])
        ]
        abort_name = f"dvml-pack-abort-{run_id}"
        addresses = [w.address for w in buffer_targets]
        chunks = pack_chunks(addresses, client.nthreads())

        def submit(c: int, address: str, attempt: int) -> Future:
            chosen = chunks[c]
            return client.submit(
                tasks.pack_buffers, chosen, seed,
                staging_name(run_id, chosen[0], attempt), fields,
                [counts[:, b] for b in chosen], [sources[b] for b in chosen], abort_name,
                dtypes, workers=[address], allow_other_workers=False, pure=False, retries=0,
            )  # fmt: skip

        abort = Event(abort_name, client=client)
        try:
            # A pack whose worker died is resubmitted to the restarted worker of the same
            # name: its vineyardd, and so the placement, is unchanged.
            targets = [buffer_targets[chunk[0]] for chunk in chunks]
            packed = run_pinned(client, submit, targets, "packing", abort=abort.set, watch=watch)
            return sorted((r for records in packed for r in records), key=lambda r: r["index"])
        finally:
            abort.clear()  # events live on the scheduler until cleared
    finally:
        client.cancel(splits)  # the packed rows live in vineyard now; free the groups
