"""Read one buffer's tensor by object id from this process's vineyardd, or say who holds it.

``dataset.placement()`` lists the object id of every buffer and field. Read on another
instance, vineyard's own ``get`` fails with "Failed to connect to the vineyard instance 0 at
0.0.0.0:0" (RPC is off between dvml's daemons): :func:`read_buffer` reads local tensors
zero-copy and names the instance, worker and host of any other one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dvml.cluster.connection import local_client, this_worker_name
from dvml.exceptions import StoreError
from dvml.store import catalog

__all__ = ["holder_of", "read_buffer"]


def holder_of(object_id: int, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The dataset, buffer and field of ``object_id`` among catalog ``records``, or None.

    Pure: returns ``{"dataset", "buffer", "field", "instance_id", "worker_name", "host"}``.
    """
    for record in records:
        for buf in record["layout"]["buffers"]:
            for field, obj in buf["fields"].items():
                if int(obj["id"]) == int(object_id):
                    return {
                        "dataset": record["name"],
                        "buffer": buf["index"],
                        "field": field,
                        "instance_id": buf["instance_id"],
                        "worker_name": buf.get("worker_name"),
                        "host": buf.get("host"),
                    }
    return None


def read_buffer(object_id: int, socket: str | None = None) -> np.ndarray:
    """The tensor ``object_id`` (a ``*_id`` of ``placement()``), as a read-only shared-memory view.

    Run it on the worker that holds the buffer (``client.submit(..., workers=[address])``).

    Raises
    ------
    StoreError
        The object lives on another vineyard instance (names that instance, its worker and
        host, and the dataset's buffer), or exists nowhere.
    """
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    client = local_client(socket)
    ipc = client.ipc_client
    oid = vineyard.ObjectID(int(object_id))
    me = int(client.instance_id)
    try:
        meta = ipc.get_meta(oid)
    except Exception as exc:  # vineyard's ObjectNotExistsException and kin
        raise StoreError(
            f"No vineyard object {int(object_id)} exists (looked up from {this_worker_name()}, "
            f"vineyard instance {me}): {exc}. Take ids from dataset.placement() of a dataset "
            "that still exists."
        ) from None
    if meta.islocal:
        return np.asarray(ipc.get(oid))
    where = holder_of(int(object_id), catalog.list_records())
    held = f"vineyard instance {meta.instance_id}"
    if where is not None:
        held = (
            f"vineyard instance {where['instance_id']} of worker {where['worker_name']} (host "
            f"{where['host']}): buffer {where['buffer']}, field {where['field']} of dataset "
            f"{where['dataset']!r}"
        )
    raise StoreError(
        f"Object {int(object_id)} is not in this process's vineyardd ({this_worker_name()}, "
        f"vineyard instance {me}); it is held by {held}. Read it on that worker, e.g. "
        "client.submit(dvml.resolve.read_buffer, object_id, workers=[its address]); a buffer "
        "is never fetched across workers."
    )
