"""Rows from worker to worker outside the task graph: each pack task fetches its own slices.

A split-group task's laid-out rows stay in its worker's memory under the task's key. A pack
task needs one contiguous slice of every group; as a Dask dependency it would receive the
whole group (or need one task per group and target: P x W tasks). Instead it asks the
scheduler which worker holds each group (``who_has``) and asks those workers for its slices,
one request per worker, through a handler that the split tasks install on their workers.
This is how Dask's own peer-to-peer shuffle moves data (``distributed.shuffle``), with the
data's lifetime still Dask's: the client holds the split futures until the buffers are packed,
and should a worker die, Dask recomputes the groups it held (from the source if need be)
while the pack tasks that wait for them step out of their worker's thread pool
(``secede``), so that the recomputation can run there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dvml.exceptions import ClusterError, StoreError

__all__ = ["HANDLER", "LOST_ROWS_TIMEOUT", "coalesce", "fetch_slices", "serve_slices_here"]

logger = logging.getLogger("dvml.preprocess")

HANDLER = "dvml_pack_slices"
# How long a pack task waits for rows whose worker died to be recomputed elsewhere.
LOST_ROWS_TIMEOUT = 300.0
# A holder that the scheduler still lists but that fails this many requests in a row is broken,
# not dying: the pack fails instead of waiting.
_FAILURES = 5


def _slice(value: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {field: values[start:stop] for field, values in value.items()}


def coalesce(
    requests: Sequence[tuple[str, int, int]],
) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, int]]]:
    """Requests for adjacent rows of the same key merged into one request.

    A split group lays out its rows buffer after buffer, so the slices that the buffers of one
    pack task need from a group usually follow each other: one slice, sent as one frame, costs
    its holder one serialisation instead of one per buffer.

    Returns
    -------
    merged : list of (str, int, int)
        The requests to send.
    spans : list of (int, int, int)
        Per request, ``(m, start, stop)``: its rows are rows ``start:stop`` of ``merged[m]``.
    """
    merged: list[tuple[str, int, int]] = []
    spans: list[tuple[int, int, int]] = []
    latest: dict[str, int] = {}  # key -> its last merged request
    for key, start, stop in requests:
        m = latest.get(key)
        if m is not None and merged[m][2] == start:
            merged[m] = (key, merged[m][1], stop)
        else:
            m = latest[key] = len(merged)
            merged.append((key, start, stop))
        first = merged[m][1]
        spans.append((m, start - first, stop - first))
    return merged, spans


def _serve(worker: Any, requests: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
    """The handler: the requested slices of keys this worker holds (None for the others)."""
    from distributed.protocol import to_serialize

    data: Any = worker.data
    slices = [
        to_serialize(_slice(data[key], start, stop)) if key in data else None
        for key, start, stop in requests
    ]
    return {"status": "OK", "slices": slices}


def serve_slices_here(worker: Any = None) -> None:
    """Install the slice handler on this worker (idempotent; runs inside a task)."""
    if worker is None:
        from distributed import get_worker

        worker = get_worker()
    if HANDLER not in worker.handlers:

        def dvml_pack_slices(requests: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
            return _serve(worker, requests)

        worker.handlers[HANDLER] = dvml_pack_slices


def _aborted(abort_event: str | None) -> bool:
    if abort_event is None:
        return False
    from distributed import Event

    return bool(Event(abort_event).is_set())


def fetch_slices(
    requests: Sequence[tuple[str, int, int]],
    abort_event: str | None = None,
    timeout: float = LOST_ROWS_TIMEOUT,
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Yield ``(i, rows start:stop of the value under key)`` for every request, as they come.

    Runs inside a task. Keys held by this worker are sliced in place (views, no copy); the
    others are fetched from their holders, one request per holder, adjacent slices of a key
    as one (:func:`coalesce`). A key that no live worker holds (its worker died) is waited
    for while Dask recomputes it, out of the worker's thread pool, up to ``timeout`` seconds,
    or until the Dask event ``abort_event`` is set.

    Raises
    ------
    ClusterError
        When rows stay unavailable for ``timeout`` seconds.
    StoreError
        When the run was abandoned (``abort_event`` set) while this waited.
    """
    from distributed import get_worker, rejoin, secede
    from distributed.utils import sync

    worker = get_worker()
    serve_slices_here(worker)
    merged, spans = coalesce(requests)
    users: list[list[int]] = [[] for _ in merged]  # merged request -> the requests it serves
    for r, (m, _, _) in enumerate(spans):
        users[m].append(r)
    pending = set(range(len(merged)))
    deadline = time.monotonic() + timeout
    delay, seceded, last_error = 0.05, False, "none"
    failures: dict[str, int] = {}
    try:
        while pending:
            keys = sorted({merged[i][0] for i in pending})
            who_has = sync(worker.loop, worker.scheduler.who_has, keys=keys)
            by_holder: dict[str, list[int]] = {}
            for i in sorted(pending):
                holders = list(who_has.get(merged[i][0]) or ())
                if holders:
                    holder = worker.address if worker.address in holders else holders[0]
                    by_holder.setdefault(holder, []).append(i)
            for holder, chosen in by_holder.items():
                asked = [merged[i] for i in chosen]
                got: list[Any]
                if holder == worker.address:
                    data: Any = worker.data
                    got = [_slice(data[k], a, b) if k in data else None for k, a, b in asked]
                else:
                    try:
                        reply = sync(worker.loop, getattr(worker.rpc(holder), HANDLER),
                                     requests=asked)  # fmt: skip
                        got = list(reply["slices"])
                    except Exception as exc:  # the holder died or left: ask again below
                        last_error = f"{type(exc).__name__}: {exc}"
                        logger.info("fetching rows from %s failed: %s", holder, last_error)
                        failures[holder] = failures.get(holder, 0) + 1
                        if failures[holder] >= _FAILURES:
                            raise ClusterError(
                                f"Worker {holder} failed {failures[holder]} requests for "
                                f"packed rows and is still in the cluster. Last error: "
                                f"{last_error}. Check that worker's logs, then run the call "
                                "again."
                            ) from exc
                        got = [None] * len(asked)
                for m, piece in zip(chosen, got, strict=True):
                    if piece is not None:
                        pending.discard(m)
                        for r in users[m]:
                            yield r, _slice(piece, spans[r][1], spans[r][2])
            if not pending:
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"Rows of {len(pending)} split group(s) stayed unavailable for "
                    f"{timeout:.0f}s: their worker left the cluster and Dask did not recompute "
                    f"them. Last error: {last_error}. Check the workers' logs, then run the "
                    "call again."
                )
            if _aborted(abort_event):
                raise StoreError(
                    "The run this pack belongs to failed elsewhere and was abandoned while it "
                    "waited for rows; nothing was published. (Expected after another failure.)"
                )
            if not seceded:  # let the recomputation use this worker's thread
                secede()
                seceded = True
            time.sleep(delay)
            delay = min(1.0, delay * 2)
    finally:
        if seceded:
            rejoin()
