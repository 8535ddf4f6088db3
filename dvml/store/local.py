"""Vineyard access from inside a worker or trainer: the LOCAL instance only.

Everything here runs in a process whose ``VINEYARD_IPC_SOCKET`` points at its own vineyardd.
Puts go through vineyard's builder directly, never through ``Client.put``: on a full daemon
``Client.put`` silently re-puts the object on another instance, which would break placement.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np

from dvml.exceptions import DaemonDiedError, StoreError, VineyardMemoryError

__all__ = [
    "STAGING_PREFIX",
    "delete_objects",
    "local_client",
    "put_arrays",
    "this_worker_name",
]

# Objects are named `<STAGING_PREFIX><run id>/<buffer>/<field>` between their put and the
# publication of the dataset, so that objects of a failed or retried run can be found and
# deleted: no orphan stays in any vineyardd.
STAGING_PREFIX = "__dvml_staging__/"


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
        client = _connect(sock, who)
        _CLIENTS[sock] = client
        return client


def _connect(sock: str, who: str) -> Any:
    import vineyard

    # A dead daemon must fail at once rather than after vineyard's ten 1-second retries.
    os.environ.setdefault("VINEYARD_IPC_SKIP_RETRY", "1")
    try:
        return vineyard.connect(sock)
    except Exception as exc:
        raise DaemonDiedError(
            f"Cannot reach the vineyardd of {who} at {sock}: {exc}. Check `dvml cluster "
            "status`; restart the cluster if the daemon died."
        ) from exc


def put_arrays(
    arrays: dict[str, np.ndarray], staging_name: str | None = None, client: Any = None
) -> dict[str, Any]:
    """Put numpy arrays into the LOCAL vineyardd as persisted ``vineyard::Tensor`` objects.

    Parameters
    ----------
    arrays : dict of str to ndarray
        Field name → numeric array (C-contiguous arrays are stored as they are).
    staging_name : str, optional
        When given, each object is named ``f"{staging_name}/{field}"`` until published.
    client : vineyard.Client, optional
        An open client on the local instance. Default: :func:`local_client`.

    Returns
    -------
    dict
        ``{"instance_id": int, "fields": {field: {"id", "shape", "dtype", "nbytes"}}}``.

    Raises
    ------
    VineyardMemoryError
        When the daemon lacks room: names the worker, the bytes needed and free. Objects put
        by this call before the failure are deleted.
    """
    from vineyard._C import NotEnoughMemoryException  # type: ignore[attr-defined]
    from vineyard.core.builder import put as builder_put

    client = local_client() if client is None else client
    needed = sum(int(a.nbytes) for a in arrays.values())
    status = client.status
    free = int(status.memory_limit) - int(status.memory_usage)
    if needed > free:
        raise _memory_error(needed, free, int(status.memory_limit))
    put_ids: list[Any] = []
    fields: dict[str, Any] = {}
    try:
        for field, value in arrays.items():
            arr = np.ascontiguousarray(value)
            if arr.dtype == object:
                raise StoreError(
                    f"Field {field!r} has dtype object; only numeric tensors are stored. "
                    "Encode it first (labels are one-hot encoded by the preprocessor)."
                )
            oid = builder_put(client, arr)
            put_ids.append(oid)
            client.persist(oid)
            meta = client.get_meta(oid)
            if int(meta.instance_id) != int(client.instance_id):  # never expected
                raise StoreError(
                    f"Object {oid} landed on vineyard instance {meta.instance_id}, not on "
                    f"the local one ({client.instance_id}) of {this_worker_name()}."
                )
            if staging_name is not None:
                client.put_name(oid, f"{staging_name}/{field}")
            fields[field] = {
                "id": int(oid),
                "shape": list(arr.shape),
                "dtype": str(arr.dtype),
                "nbytes": int(arr.nbytes),
            }
    except NotEnoughMemoryException:
        _delete_quietly(client, put_ids)
        st = client.status
        raise _memory_error(
            needed, int(st.memory_limit) - int(st.memory_usage), int(st.memory_limit)
        ) from None
    except BaseException:
        _delete_quietly(client, put_ids)
        raise
    return {"instance_id": int(client.instance_id), "fields": fields}


def _memory_error(needed: int, free: int, limit: int) -> VineyardMemoryError:
    return VineyardMemoryError(
        f"The vineyardd of {this_worker_name()} has no room for a buffer: it needs "
        f"{needed} bytes and {free} of {limit} bytes are free. Nothing was put elsewhere. "
        "Use a smaller buffer_size, more target workers, or start the cluster with a larger "
        "vineyard_memory."
    )


def _delete_quietly(client: Any, ids: list[Any]) -> None:
    for oid in ids:
        try:
            client.delete(oid, force=True, deep=True)
        except Exception:  # already gone
            pass


def delete_objects(ids: list[int], names: list[str] | None = None) -> int:
    """Delete local objects (deeply) and drop names; return how many objects were deleted.

    Runs on the worker that owns the objects. Missing objects and names are ignored, so the
    call is idempotent (safe in retried Dask tasks).
    """
    import vineyard

    client = local_client()
    deleted = 0
    for name in names or []:
        try:
            client.drop_name(name)
        except Exception:
            pass
    for raw in ids:
        oid = vineyard.ObjectID(int(raw))
        try:
            if client.exists(oid):
                client.delete(oid, force=True, deep=True)
                deleted += 1
        except Exception:
            pass
    return deleted
