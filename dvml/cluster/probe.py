"""Does a Dask server (a worker, a Nanny) still accept connections? A TCP probe, polite on TLS.

A dead host is dropped by the scheduler at once, but a host cut off the network only after
the scheduler's worker TTL (minutes by default); and a departed worker's Nanny, which would
restart it, is known to nobody but its address. The training watcher
(:mod:`dvml.train.runtime.watcher`) and the pinned tasks of packing and the feature cache
(:mod:`dvml.cluster.pinned`) ask this probe.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["HANDSHAKE_S", "probe_context", "reachable"]

HANDSHAKE_S = 0.5
"""How long the probe waits for a TLS handshake (a live worker answers in milliseconds)."""


def probe_context(client: Client) -> ssl.SSLContext | None:
    """The client's TLS context (a ``tls://`` cluster's), for :func:`reachable`."""
    security = getattr(client, "security", None)
    if security is None:
        return None
    context = security.get_connection_args("client").get("ssl_context")
    return context if isinstance(context, ssl.SSLContext) else None


def reachable(address: str, timeout: float, tls: ssl.SSLContext | None = None) -> bool:
    """Whether a Dask server's ``tcp://host:port`` (or ``tls://``) accepts a connection
    within ``timeout`` seconds.

    On ``tls://`` the probe completes the TLS handshake with the client's certificate before
    it closes: a bare TCP connect and close makes every worker log "TLS handshake failed"
    at each probe.
    """
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except (OSError, ValueError):
        return False
    try:
        if tls is not None and address.startswith("tls://"):
            # Politeness only: the connection answered, which is what the probe asks. A
            # frozen worker accepts but never answers the handshake: do not wait long for it.
            sock.settimeout(min(timeout, HANDSHAKE_S))
            with contextlib.suppress(OSError, ValueError):
                sock = tls.wrap_socket(sock, server_hostname=None)
    finally:
        sock.close()
    return True
