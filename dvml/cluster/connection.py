"""This process's one connection to its own vineyardd, and the name of the process.

Everything that talks to vineyard from inside a worker or trainer goes through
:func:`local_client`: the cluster (probing a worker's daemon), the store (putting and deleting
objects), the resolvers and the feature cache. It sits in :mod:`dvml.cluster`, the lowest layer
that needs it, so that nothing below :mod:`dvml.store` must import the store.
"""

from __future__ import annotations

import os
import socket as pysocket
import sys
import threading
from typing import Any

from dvml.exceptions import DaemonDiedError

__all__ = ["local_client", "this_worker_name", "unix_socket_answers"]


def this_worker_name() -> str:
    """The Dask worker's name, or the process id outside a worker (for messages)."""
    # A Dask worker has distributed loaded already. A trainer process has not, and importing
    # it just to learn that this is no worker cost ~0.5 s and ~19 MiB of private memory per
    # trainer on every open_local (benchmarks B1/B7).
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return str(distributed.get_worker().name)
        except (AttributeError, ValueError):
            pass
    return f"process {os.getpid()}"


def unix_socket_answers(path: str, timeout: float = 1.0) -> bool:
    """Whether a process accepts connections on the Unix socket ``path``.

    A plain connect, made before any ``vineyard.connect``: a vineyardd killed by a signal
    leaves its socket file behind, and vineyard 0.24.2's client, asked to connect to it, prints
    ``[info] Connection to IPC socket failed for pathname ... retrying 10 more times.`` on fd 2
    and sleeps a second, even with ``VINEYARD_IPC_SKIP_RETRY=1``.
    """
    with pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


_LOCK = threading.Lock()
_CLIENTS: dict[str, Any] = {}


def local_client(socket: str | None = None) -> Any:
    """This process's connection to its own vineyardd (``VINEYARD_IPC_SOCKET``), shared.

    vineyard 0.24.2 gives every ``vineyard.connect(socket)`` in a process the SAME IPC
    connection, so closing any client disconnects all the others, including those other
    tasks of the same worker are using at that moment. dvml therefore opens one connection per
    process and socket, probes it before handing it out, and never closes it: callers must not
    call ``close()`` on it. Keeping it open also keeps the shared memory mapped, so a put does
    not page-fault through a fresh mapping (about 6x slower for 256 MiB, benchmarks/b2_put.py).

    Raises
    ------
    DaemonDiedError
        Naming the worker and the socket when the daemon cannot be reached.
    """
    sock = socket or os.environ.get("VINEYARD_IPC_SOCKET")
    who = this_worker_name()
    if not sock:
        raise DaemonDiedError(
            f"{who} has no vineyardd: VINEYARD_IPC_SOCKET is not set. Start workers with "
            "dvml.LocalCluster or the cluster/ recipes, which set it."
        )
    if not os.path.exists(sock):
        raise DaemonDiedError(
            f"The vineyardd of {who} is not running: its socket {sock} does not exist. "
            "Check `dvml cluster status`; restart the cluster if the daemon died."
        )
    with _LOCK:
        cached = _CLIENTS.get(sock)
        if cached is not None:
            try:
                if cached.connected:
                    cached.status  # noqa: B018 (one round trip: the daemon answers)
                    return cached
            except Exception:
                pass
            _CLIENTS.pop(sock, None)
        if not unix_socket_answers(sock):
            # Before vineyard's client, which would print its retry line (see above).
            raise DaemonDiedError(
                f"The vineyardd of {who} is not running: nothing accepts connections on its "
                f"socket {sock} (a killed daemon leaves its socket file behind). Check `dvml "
                "cluster status`; restart the cluster if the daemon died."
            )
        client = _connect(sock, who)
        _CLIENTS[sock] = client
        return client


def _connect(sock: str, who: str) -> Any:
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    # A dead daemon must fail at once rather than after vineyard's ten 1-second retries.
    os.environ.setdefault("VINEYARD_IPC_SKIP_RETRY", "1")
    try:
        return vineyard.connect(sock)
    except Exception as exc:
        raise DaemonDiedError(
            f"Cannot reach the vineyardd of {who} at {sock}: {exc}. Check `dvml cluster "
            "status`; restart the cluster if the daemon died."
        ) from exc
