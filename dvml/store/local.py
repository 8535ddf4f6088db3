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


def local_client(socket: str | None = None) -> Any:
    """Connect to this process's own vineyardd (``VINEYARD_IPC_SOCKET``).

    Raises
    ------
    DaemonDiedError
        Naming the worker and the socket when the daemon cannot be reached.
    """
    import vineyard

    sock = socket or os.environ.get("VINEYARD_IPC_SOCKET")
    who = this_worker_name()
    if not sock:
        raise DaemonDiedError(
            f"{who} has no vineyardd: VINEYARD_IPC_SOCKET is not set. Start workers with "
            "dvml.LocalCluster or the cluster/ recipes, which set it."
        )
    # A dead daemon must fail at once rather than after vineyard's ten 1-second retries.
    os.environ.setdefault("VINEYARD_IPC_SKIP_RETRY", "1")
    if not os.path.exists(sock):
        raise DaemonDiedError(
            f"The vineyardd of {who} is not running: its socket {sock} does not exist. "
            "Check `dvml cluster status`; restart the cluster if the daemon died."
        )
    try:
        return vineyard.connect(sock)
    except Exception as exc:
        raise DaemonDiedError(
            f"Cannot reach the vineyardd of {who} at {sock}: {exc}. Check `dvml cluster "
            "status`; restart the cluster if the daemon died."
        ) from exc


_THREAD = threading.local()


def _thread_client() -> Any:
    """This thread's connection to the local vineyardd, kept open from one put to the next.

    A new connection maps vineyard's shared memory afresh, so the first write to every page of
    a buffer takes a page fault: putting 256 MiB through a new connection took ~6x as long as
    through one that had mapped the memory before (benchmarks/b2_put.py). A cached connection
    whose daemon stopped answering is dropped, and :func:`local_client` reports why.
    """
    sock = os.environ.get("VINEYARD_IPC_SOCKET")
    cached = getattr(_THREAD, "client", None)
    if cached is not None:
        if _THREAD.socket == sock and sock and os.path.exists(sock):
            try:
                if cached.connected:
                    cached.status  # noqa: B018 (one round trip: the daemon answers)
                    return cached
            except Exception:
                pass
        _THREAD.client = None
        try:
            cached.close()
        except Exception:
            pass
    client = local_client()
    _THREAD.client, _THREAD.socket = client, sock
    return client


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
        An open client on the local instance. Default: this thread's cached connection
        (kept open, so the shared memory stays mapped between puts).

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

    client = _thread_client() if client is None else client
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

    Runs on the worker that owns the objects, through the thread's cached connection (the one
    puts use: memory freed through another connection made the next put of the same size
    ~4x slower). Missing objects and names are ignored, so the call is idempotent (safe in
    retried Dask tasks).
    """
    import vineyard

    client = _thread_client()
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
