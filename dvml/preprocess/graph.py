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

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import ClusterError
from dvml.placement.planner import plan_pieces
from dvml.preprocess import tasks
from dvml.store.datasets import Dataset
from dvml.store.publish import publish_run, staging_name

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["compute_stats", "pack_and_publish"]

logger = logging.getLogger("dvml.preprocess")

PACK_ATTEMPTS = 3  # a pack whose worker died is resubmitted to the restarted worker


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
            seed + 7919 * (p + 1),
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
    packs = []
    for b in range(n_buffers):
        sources = [p for p in range(n_parts) if counts[p, b] > 0]
        pieces = [taken[p, int(plan.target_of[b])] for p in sources]
        ranges = [
            (int(plan.buffer_ranges[p, b, 0]), int(plan.buffer_ranges[p, b, 1])) for p in sources
        ]
        packs.append(_PackInputs(pieces, ranges))
    return _run_packs(client, packs, buffer_targets, seed, run_id)


@dataclasses.dataclass(frozen=True)
class _PackInputs:
    """What the pack task of one buffer reads: ``pieces[i][start:stop]`` for ``ranges[i]``."""

    pieces: list[Future]
    ranges: list[tuple[int, int]]


def _submit_pack(
    client: Client, b: int, worker: str, inputs: _PackInputs, seed: int, run_id: str, attempt: int
) -> Future:
    return client.submit(
        tasks.pack_buffer,
        b,
        seed,
        staging_name(run_id, b, attempt),
        inputs.ranges,
        *inputs.pieces,
        workers=[worker],
        allow_other_workers=False,
        pure=False,
        retries=0,
    )


def _run_packs(
    client: Client,
    packs: list[_PackInputs],
    buffer_targets: Sequence[WorkerInfo],
    seed: int,
    run_id: str,
) -> list[dict[str, Any]]:
    """Run the pinned pack tasks; resubmit those whose worker died to its restarted self.

    A task pinned to a worker that left would wait for the scheduler's no-workers timeout;
    instead, a pack whose target address is gone is resubmitted to the worker of the same name
    once the Nanny has restarted it (its vineyardd, and so the placement, is unchanged).
    On a failure, the packs still running are awaited before the error propagates, so that
    the caller's cleanup sees every object they put.
    """
    addresses = [w.address for w in buffer_targets]
    futures = {
        b: _submit_pack(client, b, addresses[b], packs[b], seed, run_id, attempt=1)
        for b in range(len(packs))
    }
    attempts = dict.fromkeys(futures, 1)
    results: dict[int, dict[str, Any]] = {}
    try:
        while len(results) < len(futures):
            pending = [f for b, f in futures.items() if b not in results and f.status == "pending"]
            if pending:
                _wait_any(client, pending, timeout=1.0)
            live = set(_live_workers(client).values())
            for b, fut in futures.items():
                if b in results:
                    continue
                if fut.status == "finished":
                    results[b] = fut.result()
                    continue
                if addresses[b] in live:
                    if fut.status == "pending":
                        continue
                    if fut.status == "error":
                        raise fut.exception()  # a real failure (bad data, no room)
                # The target worker is gone (or lost the result): wait for it to come back
                # under the same name, and pack again there.
                name = buffer_targets[b].name
                if attempts[b] >= PACK_ATTEMPTS:
                    error = fut.exception() if fut.status == "error" else fut.status
                    raise ClusterError(
                        f"Packing buffer {b} failed {attempts[b]} times because its worker "
                        f"{name} left the cluster (last error: {error!r}). Check the worker's "
                        "logs and memory, then run the preprocessor again."
                    )
                new_address = _wait_for_worker(client, name, timeout=60)
                fut.cancel()
                logger.warning(
                    "worker %s restarted as %s: repacking buffer %d", name, new_address, b
                )
                addresses[b] = new_address
                attempts[b] += 1
                futures[b] = _submit_pack(
                    client, b, new_address, packs[b], seed, run_id, attempt=attempts[b]
                )
    except BaseException:
        _settle(client, [(f, addresses[b]) for b, f in futures.items() if b not in results])
        raise
    return [results[b] for b in range(len(futures))]


def _wait_any(client: Client, futures: list[Future], timeout: float) -> None:
    """Wait until one of ``futures`` is done or ``timeout`` passes (never raises for either)."""
    from distributed import wait

    try:
        # distributed.wait looks up the default client; ours may not be the default one.
        with client.as_current():
            wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
    except Exception:  # TimeoutError, cancelled futures: the caller reads every status next
        pass


def _settle(client: Client, packs: list[tuple[Future, str]], timeout: float = 120) -> None:
    """Let pack tasks that may still put a buffer finish, then cancel them all.

    Cancelling does not stop a task that a worker is running: a pack running when the run
    fails would put its buffer after the cleanup listed the staged objects, an orphan. Packs
    pinned to a worker that is gone never run again.
    """
    futures = [f for f, _ in packs]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            live = set(_live_workers(client).values())
            running = [f for f, address in packs if f.status == "pending" and address in live]
            if not running:
                break
            _wait_any(client, running, timeout=1.0)
    except Exception:  # the cluster is failing: the caller cleans up what it can
        logger.warning("could not wait for the running pack tasks", exc_info=True)
    client.cancel(futures)


def _live_workers(client: Client) -> dict[str, str]:
    """Worker name → address of the workers connected right now."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {str(w["name"]): addr for addr, w in info.items()}


def _wait_for_worker(client: Client, name: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        address = _live_workers(client).get(name)
        if address is not None:
            return address
        time.sleep(0.5)
    raise ClusterError(
        f"Worker {name} left the cluster during packing and did not come back within "
        f"{timeout:.0f}s. Its buffers cannot be placed as the rules require; check the worker "
        "and run the preprocessor again."
    )
