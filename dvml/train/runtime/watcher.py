"""The one failure watcher of every training job: a departed worker or host, named in bounds.

When a host dies or is cut off during a job, the first error the client sees usually comes
from a SURVIVING trainer (TensorFlow's ``UnavailableError`` in a collective op), which names
the wrong worker, or nothing comes at all (a task pinned to a worker cut off the network
waits until the scheduler's worker TTL, minutes). :func:`watch` waits for a job's tasks and
asks the scheduler and a TCP probe which of the job's workers are gone, every few seconds;
:func:`departed_workers` is that question alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml.cluster.probe import probe_context, reachable

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

__all__ = [
    "PEER_ERRORS",
    "Outcome",
    "departed_workers",
    "describe_departure",
    "looks_like_peer_failure",
    "watch",
]

# What a trainer reports when another trainer (or the network to it) went away.
PEER_ERRORS = ("Unavailable", "Collective", "DeadlineExceeded", "Socket closed", "connect")


def looks_like_peer_failure(message: str) -> bool:
    """Whether a trainer's error text is what a lost peer causes."""
    return any(marker in message for marker in PEER_ERRORS)


def departed_workers(
    client: Client, workers: list[WorkerInfo], wait: float = 5.0, probe_timeout: float = 3.0
) -> list[WorkerInfo]:
    """The trainer workers that are gone: no longer listed by the scheduler, or unreachable.

    A dead host is dropped by the scheduler at once, but a host cut off the network only
    after the scheduler's worker TTL (minutes by default): a worker that does not accept a TCP
    connection within ``probe_timeout`` seconds counts as gone too. A peer's error can reach
    the client a moment before the scheduler has removed a dead worker, hence the short
    ``wait``.
    """
    tls = probe_context(client)
    unreachable = [w for w in workers if not reachable(w.address, probe_timeout, tls)]
    deadline = time.monotonic() + wait
    while True:
        try:
            # Asked of the scheduler itself: client.scheduler_info() returns the client's cache,
            # which its periodic refresh may replace by one without any worker in between.
            identity = client.sync(client.scheduler.identity, n_workers=-1)  # type: ignore[union-attr]
            alive = set(identity["workers"])
        except Exception:  # the scheduler itself is unreachable: the probes must do
            alive = {w.address for w in workers}
        gone = [w for w in workers if w.address not in alive or w in unreachable]
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(0.25)


def describe_departure(gone: list[WorkerInfo]) -> str:
    """``"worker W on host H left the cluster during training ..."`` for the error message."""
    named = ", ".join(f"worker {w.name} on host {w.host}" for w in gone)
    return (
        f"{named} left the cluster during training (the host died, was cut off from the "
        "network, or the worker was killed)"
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How :func:`watch` ended: every task finished (both None), a task failed (``failed``),
    workers of the job are gone (``gone``), or its ``until`` said stop (``stopped``)."""

    failed: Any = None
    gone: list[WorkerInfo] | None = None
    stopped: bool = False


def watch(
    client: Client,
    futures: list[Any],
    workers: list[WorkerInfo],
    *,
    watched: list[Any] | None = None,
    first: bool = False,
    probe_every: float = 2.0,
    poll: float = 0.25,
    until: Callable[[], bool] | None = None,
) -> Outcome:
    """Wait until every one of ``futures`` finished (with ``first``: any one of them), one of
    ``watched`` (default: the same) failed or was cancelled, or a worker of ``workers`` is
    gone (not listed by the scheduler, or not accepting a TCP connection: a host cut off is
    named within ``probe_every`` plus the probe timeout, not after the scheduler's worker
    TTL), or ``until()`` (asked in this thread at every poll) says stop."""
    watched = futures if watched is None else watched
    next_probe = time.monotonic() + probe_every
    while True:
        # a cancelled task never finishes (its input was lost with a worker, or it was
        # cancelled): it ends the wait as a failed one does
        failed = next((f for f in (*watched, *futures) if f.status in ("error", "cancelled")), None)
        if failed is not None:
            return Outcome(failed=failed)
        finished = [f.status == "finished" for f in futures]
        if not finished or (any if first else all)(finished):
            return Outcome()
        if until is not None and until():
            return Outcome(stopped=True)
        if time.monotonic() >= next_probe:
            gone = departed_workers(client, workers, wait=0.0)
            if gone:
                return Outcome(gone=gone)
            next_probe = time.monotonic() + probe_every
        time.sleep(poll)
