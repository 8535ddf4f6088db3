"""A real LocalCluster: the worker ↔ vineyard mapping, names, GPUs, worker table, shutdown."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

import dvml
from dvml.cluster.gpu import COLUMNS as GPU_COLUMNS
from tests.helpers import assert_no_new_processes, child_processes, on_worker, pid_gone

pytestmark = pytest.mark.cluster


# Task functions are top-level, so that they pickle by reference. They never close their
# vineyard client: every vineyard.connect() in a worker process shares the worker's one IPC
# connection, and closing it would cut dvml's own (see tests.helpers.vineyard_probes).


def put_local_array(seed: int) -> tuple[int, int]:
    """On a worker: put an array into this worker's vineyardd; return (object id, instance id).

    ``vineyard.core.builder.put`` puts through this client only; ``client.put`` would re-put
    elsewhere on OOM, hiding a placement error.
    """
    import numpy as np
    import vineyard
    from vineyard.core.builder import put

    client = vineyard.connect()  # VINEYARD_IPC_SOCKET names this worker's daemon
    oid = put(client, np.full((16, 4), seed, dtype="int64"), persist=True)
    return int(oid), int(client.instance_id)


def meta_of(oid: int) -> dict[str, Any]:
    """On a worker: the metadata of ``oid`` as this worker's vineyardd sees it."""
    import vineyard

    client = vineyard.connect()
    meta = client.get_meta(vineyard.ObjectID(oid), sync_remote=True)
    return {
        "instance_id": int(meta.instance_id),
        "typename": meta.typename,
        "reader_instance_id": int(client.instance_id),
    }


def delete_objects(oids: list[int], names: list[str]) -> bool:
    """On a worker: drop names and delete objects; return whether all are gone."""
    import vineyard

    client = vineyard.connect()
    for name in names:
        client.drop_name(name)
    ids = [vineyard.ObjectID(o) for o in oids]
    client.delete(ids)
    return not any(client.exists(i) for i in ids)


def put_name(oid: int, name: str) -> None:
    import vineyard

    vineyard.connect().put_name(vineyard.ObjectID(oid), name)


def get_name(name: str) -> int | None:
    import vineyard

    try:
        return int(vineyard.connect().get_name(name, wait=False))
    except Exception:  # not (yet) visible here
        return None


def test_each_worker_puts_into_its_own_instance(cluster4: dvml.LocalCluster) -> None:
    workers = cluster4.workers
    ids = [w.vineyard_instance_id for w in workers]
    assert None not in ids and len(set(ids)) == 4  # one vineyardd per worker

    placed = {w.name: on_worker(cluster4, w, put_local_array, i) for i, w in enumerate(workers)}
    try:
        for i, w in enumerate(workers):
            oid, instance = placed[w.name]
            assert instance == w.vineyard_instance_id
            reader = workers[(i + 1) % len(workers)]  # another worker's instance
            meta = on_worker(cluster4, reader, meta_of, oid)
            assert meta["reader_instance_id"] == reader.vineyard_instance_id != instance
            assert meta["instance_id"] == w.vineyard_instance_id
            assert meta["typename"].startswith("vineyard::Tensor")
    finally:
        for w in workers:
            assert on_worker(cluster4, w, delete_objects, [placed[w.name][0]], [])


def test_name_is_visible_from_another_instance(cluster4: dvml.LocalCluster) -> None:
    first, other = cluster4.workers[0], cluster4.workers[3]
    oid, _ = on_worker(cluster4, first, put_local_array, 7)
    name = f"dvml-test-{os.getpid()}"
    try:
        on_worker(cluster4, first, put_name, oid, name)
        assert on_worker(cluster4, other, get_name, name) == oid
    finally:
        assert on_worker(cluster4, first, delete_objects, [oid], [name])
    assert on_worker(cluster4, other, get_name, name) is None


def test_gpu_configuration(cluster4: dvml.LocalCluster, cluster2: dvml.LocalCluster) -> None:
    gpus = dvml.gpu_configuration(cluster4.client)
    assert list(gpus.columns) == GPU_COLUMNS
    assert len(gpus) == 2
    assert list(gpus.hostname) == ["host-0", "host-0"]
    assert list(gpus.worker_name) == ["worker-0", "worker-1"]
    by_name = {w.name: w.address for w in cluster4.workers}
    assert list(gpus.worker) == [by_name["worker-0"], by_name["worker-1"]]
    assert all("Declared GPU" in d for d in gpus.gpu_descr)

    empty = dvml.gpu_configuration(cluster2.client)
    assert empty.empty and list(empty.columns) == GPU_COLUMNS


def test_worker_table_and_resources(cluster4: dvml.LocalCluster) -> None:
    table = cluster4.worker_table()
    assert list(table.name) == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert list(table.host) == ["host-0", "host-0", "host-1", "host-1"]
    assert list(table.gpus) == [1, 1, 0, 0]

    info = cluster4.client.scheduler_info(n_workers=-1)["workers"]
    resources = {w["name"]: w.get("resources", {}) for w in info.values()}
    assert resources["worker-0"] == {"GPU": 1} == resources["worker-1"]
    assert "GPU" not in resources["worker-2"] and "GPU" not in resources["worker-3"]

    status = cluster4.status()
    assert set(status.vineyardd) == {"running"}
    assert set(status.vineyardd_process) == {"running"}
    assert (status.memory_limit == 256 * 2**20).all()


def test_close_stops_everything(local_cluster: Callable[..., dvml.LocalCluster]) -> None:
    before = child_processes()
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    try:
        pids = cluster.processes()
        directory = cluster.directory
        sockets = [w.vineyard_socket for w in cluster.workers]
        assert len(pids) == 5  # etcd, 2 vineyardd, 2 Dask workers
        assert all(not pid_gone(p) for p in pids.values())
        assert all(s and os.path.exists(s) for s in sockets)
        assert (os.stat(directory).st_mode & 0o777) == 0o700
    finally:
        cluster.close()
    assert [name for name, pid in pids.items() if not pid_gone(pid)] == []
    assert not os.path.exists(directory)
    assert not any(os.path.exists(s) for s in sockets if s)
    assert cluster.client.status == "closed"
    cluster.close()  # a second close does nothing
    assert_no_new_processes(before)
