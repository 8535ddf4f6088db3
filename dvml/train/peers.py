"""Which trainer's host went away: turn a peer's collective error into one naming the host.

When a host dies or is cut off during ``fit``, the first error the client sees usually comes
from a SURVIVING trainer (TensorFlow's ``UnavailableError`` in a collective op), which names
the wrong worker. The Dask scheduler knows which worker left: this module asks it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

__all__ = ["PEER_ERRORS", "departed_workers", "describe_departure", "looks_like_peer_failure"]

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
    unreachable = [w for w in workers if not _accepts(w.address, probe_timeout)]
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


def _accepts(address: str, timeout: float) -> bool:
    """Whether a worker's ``tcp://host:port`` (or ``tls://``) accepts a TCP connection."""
    import socket

    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def describe_departure(gone: list[WorkerInfo]) -> str:
    """``"worker W on host H left the cluster during training ..."`` for the error message."""
    named = ", ".join(f"worker {w.name} on host {w.host}" for w in gone)
    return (
        f"{named} left the cluster during training (the host died, was cut off from the "
        "network, or the worker was killed)"
    )
