"""What the vineyardds and the cluster hold: worker-side probes and client-side summaries.

The probes run ON a worker (``client.run`` / ``client.submit``); they are top-level functions so
that they pickle by reference. They use a plain ``vineyard.connect()`` and never close it: in
vineyard 0.24.2 every client of a socket in one process shares one IPC connection, and closing
any of them would cut the worker's own (see ``dvml.cluster.connection.local_client``).

dvml modules are imported inside the functions: importing this package costs nothing and does
not depend on dvml's module layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "batches",
    "dataset_names",
    "object_exists",
    "read_dataset",
    "snapshot",
    "staging_names",
    "vineyard_contents",
    "vineyard_usage",
]


# -- on a worker ------------------------------------------------------------------------------


def vineyard_contents() -> dict[str, Any]:
    """On a worker: its instance id, memory in use, local tensors and staged objects.

    ``staging``: the staging names of this instance's staged objects (unpublished buffers,
    :mod:`dvml.store.staging`), plus any vineyard NAME that starts with the staging prefix
    (dvml no longer puts such names; one would be a leftover).
    """
    import vineyard

    from dvml.store.staging import staged_objects
    from dvml.store.tensors import STAGING_PREFIX

    client = vineyard.connect()  # VINEYARD_IPC_SOCKET names this worker's own vineyardd
    iid = int(client.instance_id)
    metas = client.ipc_client.list_metadatas("vineyard::Tensor*", limit=1_000_000)
    names = client.ipc_client.list_names(STAGING_PREFIX + "*", limit=1_000_000)
    staged = [name for name, _, _ in staged_objects()]
    return {
        "instance_id": iid,
        "memory_usage": int(client.status.memory_usage),
        "tensors": sorted(int(m.id) for m in metas if int(m.instance_id) == iid),
        "staging": sorted([*(str(n) for n in names), *staged]),
    }


def object_exists(ids: Sequence[int]) -> list[bool]:
    """On a worker: whether each object still exists in the vineyard cluster."""
    import vineyard

    client = vineyard.connect()
    return [bool(client.exists(vineyard.ObjectID(int(i)))) for i in ids]


# -- on the client ----------------------------------------------------------------------------


def snapshot(cluster: Any) -> dict[int, dict[str, Any]]:
    """What every vineyardd of ``cluster`` holds, by instance id (:func:`vineyard_contents`)."""
    return {a["instance_id"]: a for a in cluster.client.run(vineyard_contents).values()}


def vineyard_usage(cluster: Any) -> dict[str, int]:
    """Bytes used in each worker's vineyardd, by worker name (from the cluster's status)."""
    cluster.refresh()  # a restarted worker has a new address
    table = cluster.status()
    return {row["name"]: int(row["memory_used"]) for _, row in table.iterrows()}


def staging_names(client: Any) -> list[str]:
    """The staging names (objects of unfinished runs) in every vineyardd."""
    from dvml.store.publish import staged_objects

    return [name for name, _, _ in staged_objects(client)]


def dataset_names(client: Any) -> set[str]:
    """The names of the published datasets and feature caches."""
    import dvml

    return set(dvml.datasets.list(client=client)["name"])


def batches(client: Any) -> int:
    """Backbone batches run so far, summed over the workers."""
    import dvml

    return int(dvml.features.calls(client)["batches"])


def read_dataset(client: Any, name: str) -> dict[int, dict[str, np.ndarray]]:
    """Every buffer of any dataset, by buffer index (copies; small datasets only)."""
    from dvml.features.featurize import read_buffers

    merged: dict[int, dict[str, np.ndarray]] = {}
    for part in client.run(read_buffers, name).values():
        merged.update(part)
    return merged
