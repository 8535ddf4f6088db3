"""Workers that join (issue 37 item 3) on a real LocalCluster: add a worker, rebalance.

A dataset packed on 2 workers is spread onto a third by copying whole buffers between
vineyardds: rows balanced within one buffer, bytes moved within the new worker's share,
digests unchanged, a reader of the old version (a lease taken before) still reads its
buffers, and the next fit runs 3 trainers. A gpu_workers dataset grows only onto a
GPU-tagged worker that joined (not onto a worker without a GPU tag).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dask
import pytest

import dvml
from dvml.resolve.by_id import read_buffer
from dvml.store.leases import holding
from dvml.store.versions import buffer_digest, field_digest
from tests.helpers.clusters import running_cluster
from tests.helpers.data import iris_frame
from tests.helpers.models import iris_mlp

pytestmark = pytest.mark.cluster

COMPILE = "optimizer='sgd', loss='categorical_crossentropy'"


def _read_digest(object_id: int) -> str:
    return field_digest(read_buffer(object_id))


def _digests_on_workers(client: Any, layout: dict[str, Any]) -> dict[int, str]:
    """Buffer index -> digest of the bytes its worker reads back now, by object id."""
    found = {}
    for b in layout["buffers"]:
        fields = {
            f: {"digest": client.submit(_read_digest, spec["id"], workers=[b["worker"]],
                                        allow_other_workers=False, pure=False).result(60)}
            for f, spec in b["fields"].items()
        }  # fmt: skip
        found[b["index"]] = buffer_digest({"fields": fields})
    return found


def _rows(ds: dvml.Dataset) -> dict[str, int]:
    rows: dict[str, int] = {}
    for b in ds.layout["buffers"]:
        rows[b["worker_name"]] = rows.get(b["worker_name"], 0) + b["rows"]
    return rows


@pytest.fixture(scope="module")
def grown(tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """2 workers (worker-0 has a GPU), two datasets packed on them, then a GPU worker added."""
    frame = iris_frame().iloc[:120]
    with running_cluster(n_workers=2, gpus=[1, 0], vineyard_memory="128MiB") as cluster:
        client = cluster.client
        common = {"y": "label", "x": "x", "buffer_size": 10, "client": client}
        every = dvml.training_preprocessor(frame, name="rb_all", **common)
        gpu = dvml.training_preprocessor(
            frame, name="rb_gpu", distribution_rules="gpu_workers", **common
        )
        address = cluster.add_worker(gpus=1)
        yield {"cluster": cluster, "client": client, "all": every, "gpu": gpu,
               "added": address, "tmp": tmp_path_factory.mktemp("rebalance")}  # fmt: skip


def test_add_worker_is_a_full_worker(grown: dict[str, Any]) -> None:
    cluster, address = grown["cluster"], grown["added"]
    info = {w.address: w for w in cluster.workers}[address]
    assert info.name == "worker-2" and info.vineyard_instance_id is not None
    assert len(info.gpus) == 1  # the declared GPU, as dvml.gpu_configuration lists it
    assert f"vineyardd of {info.name}" in cluster.processes()
    assert address in {w.address for w in dvml.datasets.vineyard_workers(grown["client"]).values()}


def test_rebalance_spreads_onto_the_new_worker_and_keeps_old_readers(
    grown: dict[str, Any],
) -> None:
    client = grown["client"]
    before = dvml.datasets.describe("rb_all", client=client)
    assert set(_rows(before)) == {"worker-0", "worker-1"}
    with holding(["rb_all"], job="a reader of version 1", client=client):
        old_digests = _digests_on_workers(client, before.layout)
        out = dvml.datasets.rebalance("rb_all", client=client)
        after = dvml.datasets.describe("rb_all", client=client)
        # the old version's buffers, by their old object ids, still read the same bytes
        assert _digests_on_workers(client, before.layout) == old_digests
    assert out["new_workers"] == [grown["added"]] and out["pending_free"] > 0
    assert after.version == before.version + 1
    rows = _rows(after)
    assert set(rows) == {"worker-0", "worker-1", "worker-2"}
    assert max(rows.values()) - min(rows.values()) <= 10  # within one buffer
    dataset_bytes = sum(f["nbytes"] for b in before.layout["buffers"] for f in b["fields"].values())
    assert 0 < out["bytes_moved"] <= out["share_bytes"] <= -(-dataset_bytes // 3)
    # same digests: recorded, and read back from the new copies on their new workers
    recorded = {b["index"]: buffer_digest(b) for b in before.layout["buffers"]}
    assert {b["index"]: buffer_digest(b) for b in after.layout["buffers"]} == recorded
    assert _digests_on_workers(client, after.layout) == recorded
    # without a lease, the next rebalance frees the old copies kept for the reader
    again = dvml.datasets.rebalance("rb_all", client=client)
    assert again["moves"] == [] and again["freed"] == out["pending_free"]


def test_the_next_fit_runs_a_trainer_on_the_new_worker(grown: dict[str, Any]) -> None:
    client, tmp = grown["client"], grown["tmp"]
    if not any(b["worker_name"] == "worker-2" for b in
               dvml.datasets.describe("rb_all", client=client).layout["buffers"]):  # fmt: skip
        dvml.datasets.rebalance("rb_all", client=client)
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        try:
            arch = dvml.load_keras_model(iris_mlp().to_json(), name="iris", registry=registry)
            model = dvml.fit("rb_all", "rb_model", arch, COMPILE,
                             "batch_size=8, epochs=1", num_iterations=1, registry=registry,
                             client=client, progress=False)  # fmt: skip
            trainers = model.summary["trainers"]
            assert len(set(trainers)) == 3, trainers
        finally:
            registry.close()


def test_a_gpu_dataset_grows_only_onto_gpu_workers(grown: dict[str, Any]) -> None:
    """worker-1 (no GPU) holds none of rb_gpu either: only the GPU worker that joined gets rows.

    (A CPU worker added here would outlive this test: the module's cluster is shared.)
    """
    client = grown["client"]
    assert _rows(dvml.datasets.describe("rb_gpu", client=client)) == {"worker-0": 120}
    out = dvml.datasets.rebalance("rb_gpu", client=client)
    assert out["new_workers"] == [grown["added"]]
    assert _rows(dvml.datasets.describe("rb_gpu", client=client)) == {
        "worker-0": 60, "worker-2": 60,
    }  # fmt: skip
