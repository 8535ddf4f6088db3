"""The pack graph: prepared parts → split pieces → buffers pinned to their target workers.

::

    prepare(part p)  ─► split(p) ─► take(p, target t) ─┐
                                                        ├─► pack(b) for each buffer b of t,
    prepare(part q)  ─► split(q) ─► take(q, target t) ─┘    on t, into t's vineyardd

A split permutes its part once with the buffers of each target laid out together, so a
take is a view and each (part, target) piece moves at most once; a pack writes its rows
straight into vineyard shared memory. Data moves worker to worker; the client sees only row
counts, label sets and object ids.
Every put is staged under a per-attempt name, so objects of a failed or retried pack are
found and deleted: a failed run leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.cluster.pinned import run_pinned
from dvml.cluster.workers import WorkerInfo
from dvml.placement.planner import partition_seed, plan_pieces
from dvml.preprocess import tasks
from dvml.store.datasets import Dataset
from dvml.store.publish import publish_run, staging_name

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["compute_stats", "pack_and_publish"]


def compute_stats(
    client: Client, parts: Sequence[Any], progress: bool = False
) -> tuple[list[Future], list[dict]]:
    """Prepare every part on the workers; return the part futures and their small stats.

    With ``progress``, Dask's text progress bar follows the read/decode/validate tasks (they
    are not pinned, so Dask reruns them elsewhere if a worker dies and the bar always ends).
    """
    futures = client.compute(list(parts))
    stats_futures = client.map(tasks.part_stats, futures, pure=False)
    try:
        if progress:
            from distributed import progress as progress_bar

            with client.as_current():
                progress_bar(stats_futures, notebook=False)
            print(flush=True)
        return futures, client.gather(stats_futures)
    except BaseException:
        # Free the prepared parts on the workers now, not when the traceback is collected.
        client.cancel([*futures, *stats_futures])
        raise


def pack_and_publish(
    client: Client,
    prepared: list[Future],
    counts: Any,
    buffer_targets: Sequence[WorkerInfo],
    split_args: dict[str, Any],
    seed: int,
    name: str,
    kind: str,
    summary: dict[str, Any],
    overwrite: bool,
) -> Dataset:
    """Split, pack and publish; on any failure delete every object this run put.

    Takes ownership of ``prepared``: the list is emptied once every part has its split task,
    so that each prepared part is freed on its worker as soon as it is split, not when the
    whole run ends (a lower peak of worker memory, and a first run after a cluster starts
    about twice as fast). Should a split result be lost with a worker, Dask recomputes the
    part from its source.
    """

    def produce(run_id: str) -> list[dict[str, Any]]:
        return _pack(client, prepared, counts, buffer_targets, split_args, seed, run_id)

    return publish_run(client, name, kind, summary, produce, overwrite=overwrite)


def _pack(
    client: Client,
    prepared: list[Future],
    counts: Any,
    buffer_targets: Sequence[WorkerInfo],
    split_args: dict[str, Any],
    seed: int,
    run_id: str,
) -> list[dict[str, Any]]:
    plan = plan_pieces(counts, [w.address for w in buffer_targets])
    n_parts, n_buffers = counts.shape
    splits = [
        client.submit(
            tasks.split_part,
            prepared[p],
            plan.ordered_counts[p].tolist(),
            partition_seed(seed, p),
            pure=False,
            **split_args,
        )
        for p in range(n_parts)
    ]
    prepared.clear()  # the splits hold the parts now (see pack_and_publish)
    # One piece per (part, target): everything a target needs from a part moves at once.
    taken = {
        (p, t): client.submit(tasks.take_piece, splits[p], int(start), int(stop), pure=False)
        for p in range(n_parts)
        for t, (start, stop) in enumerate(plan.piece_ranges[p])
        if stop > start
    }
    # What the pack of buffer b reads: pieces[i][start:stop] for (start, stop) = ranges[i].
    inputs: list[tuple[list[tuple[int, int]], list[Future]]] = []
    for b in range(n_buffers):
        sources = [p for p in range(n_parts) if counts[p, b] > 0]
        ranges = [
            (int(plan.buffer_ranges[p, b, 0]), int(plan.buffer_ranges[p, b, 1])) for p in sources
        ]
        inputs.append((ranges, [taken[p, int(plan.target_of[b])] for p in sources]))

    def submit(b: int, address: str, attempt: int) -> Future:
        ranges, pieces = inputs[b]
        return client.submit(
            tasks.pack_buffer, b, seed, staging_name(run_id, b, attempt), ranges, *pieces,
            workers=[address], allow_other_workers=False, pure=False, retries=0,
        )  # fmt: skip

    # A pack whose worker died is resubmitted to the restarted worker of the same name: its
    # vineyardd, and so the placement, is unchanged.
    return list(run_pinned(client, submit, buffer_targets, "packing"))
