"""Datasets as first-class objects on a real LocalCluster: list, describe, exists, drop, overwrite.

Memory is checked on every vineyardd (``status.memory_usage`` and the local tensors, read by a
plain vineyard client on each worker): creating a dataset takes room only on its targets, and
dropping or replacing it gives every byte back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import DatasetExistsError, DatasetNotFoundError
from tests.helpers import object_exists, on_worker, snapshot

pytestmark = pytest.mark.cluster


# -- helpers ------------------------------------------------------------------------------------


def instance_of(cluster: dvml.LocalCluster, name: str) -> int:
    return next(w.vineyard_instance_id for w in cluster.workers if w.name == name)


def exists_on(cluster: dvml.LocalCluster, instance: int, ids: Sequence[int]) -> list[bool]:
    worker = next(w for w in cluster.workers if w.vineyard_instance_id == instance)
    return on_worker(cluster, worker, object_exists, list(ids))


def tensor_ids(ds: dvml.Dataset) -> dict[int, list[int]]:
    """The dataset's tensors by the instance that owns them."""
    found: dict[int, list[int]] = {}
    for b in ds.layout["buffers"]:
        found.setdefault(b["instance_id"], []).extend(f["id"] for f in b["fields"].values())
    return found


def frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"a": rng.normal(size=n), "b": rng.normal(size=n), "y": rng.integers(0, 3, size=n)}
    )


def test_list_describe_exists_drop(cluster4: dvml.LocalCluster, clean_vineyard4: list[str]) -> None:
    client = cluster4.client
    before = snapshot(cluster4)
    clean_vineyard4 += ["ds_first", "ds_second"]
    first = dvml.training_preprocessor(
        frame(30, 1), y="y", x=[["a", "b"]], distribution_rules=["worker-0", "worker-2"],
        name="ds_first", client=client,
    )  # fmt: skip
    second = dvml.training_preprocessor(
        frame(21, 2), y="y", x="a", distribution_rules="all_workers", name="ds_second",
        client=client,
    )  # fmt: skip
    assert dvml.datasets.exists("ds_first", client=client)
    assert not dvml.datasets.exists("ds_never_made", client=client)

    table = dvml.datasets.list(client=client)
    mine = table[table["name"].isin(["ds_first", "ds_second"])].set_index("name")
    assert sorted(mine.index) == ["ds_first", "ds_second"]
    assert mine.loc["ds_first", "rows"] == 30 and mine.loc["ds_second", "rows"] == 21
    assert mine.loc["ds_first", "workers"] == 2 and mine.loc["ds_second", "workers"] == 4
    # the default, compact layout: 2 float32 x and a uint8 class index a row
    assert mine.loc["ds_first", "nbytes"] == first.nbytes == 30 * (4 * 2 + 1)
    assert (mine["kind"] == "dataset").all()
    assert list(table["name"]) == sorted(table["name"])  # sorted by name

    described = dvml.datasets.describe("ds_first", client=client)
    assert described == first  # the same id, summary, layout and global tensors
    assert described.summary["output_table"] == "ds_first"
    placement = described.placement()
    assert placement["rows"].sum() == 30
    assert set(placement["worker_name"]) == {"worker-0", "worker-2"}
    assert set(placement["vineyard_instance_id"]) == {
        instance_of(cluster4, "worker-0"),
        instance_of(cluster4, "worker-2"),
    }
    dist = described.distribution().set_index("worker_name")
    assert dist["rows"].to_dict() == {"worker-0": 15, "worker-2": 15}
    assert dist["nbytes"].sum() == first.nbytes
    assert "ds_first" in repr(described) and "rows=30" in repr(described)

    # Creating took room on the targets only; the other workers hold what they held.
    middle = snapshot(cluster4)
    used = {i: middle[i]["memory_usage"] - before[i]["memory_usage"] for i in middle}
    first_owners = set(tensor_ids(first))
    for iid, ids in tensor_ids(second).items():
        assert set(ids) <= set(middle[iid]["tensors"])
        assert used[iid] >= sum(
            b["fields"][f]["nbytes"]
            for b in second.layout["buffers"]
            if b["instance_id"] == iid
            for f in b["fields"]
        )
    assert first_owners == {instance_of(cluster4, "worker-0"), instance_of(cluster4, "worker-2")}

    dvml.datasets.drop("ds_first", client=client)
    assert not dvml.datasets.exists("ds_first", client=client)
    with pytest.raises(DatasetNotFoundError, match="ds_first"):
        dvml.datasets.describe("ds_first", client=client)
    for iid, ids in tensor_ids(first).items():
        assert exists_on(cluster4, iid, ids) == [False] * len(ids)
    root_and_globals = [first.id, *first.global_tensors.values()]
    assert exists_on(cluster4, instance_of(cluster4, "worker-1"), root_and_globals) == [
        False
    ] * len(root_and_globals)
    assert "ds_first" not in set(dvml.datasets.list(client=client)["name"])

    second.drop(client=client)  # the handle's drop
    after = snapshot(cluster4)
    assert after == before  # every byte back, on every worker
    with pytest.raises(DatasetNotFoundError, match="ds_second"):
        dvml.datasets.drop("ds_second", client=client)


def test_overwrite(cluster4: dvml.LocalCluster, clean_vineyard4: list[str]) -> None:
    client = cluster4.client
    before = snapshot(cluster4)
    clean_vineyard4.append("ds_over")
    old = dvml.training_preprocessor(
        frame(40, 3), y="y", x=[["a", "b"]], distribution_rules=["worker-0", "worker-1"],
        name="ds_over", client=client,
    )  # fmt: skip
    with_old = snapshot(cluster4)

    with pytest.raises(DatasetExistsError, match=r"'ds_over' already exists.*overwrite=True"):
        dvml.training_preprocessor(
            frame(12, 4), y="y", x="a", name="ds_over", distribution_rules="worker-3",
            client=client,
        )  # fmt: skip
    assert snapshot(cluster4) == with_old  # nothing was put, the old dataset is untouched
    assert dvml.datasets.describe("ds_over", client=client).id == old.id

    new = dvml.training_preprocessor(
        frame(12, 4), y="y", x="a", name="ds_over", distribution_rules=["worker-2", "worker-3"],
        overwrite=True, client=client,
    )  # fmt: skip
    assert new.id != old.id
    current = dvml.datasets.describe("ds_over", client=client)
    assert current.id == new.id and current.rows == 12
    # The old tensors, root and global tensors are freed on the workers that held them.
    for iid, ids in tensor_ids(old).items():
        assert exists_on(cluster4, iid, ids) == [False] * len(ids)
    old_globals = [old.id, *old.global_tensors.values()]
    assert exists_on(cluster4, instance_of(cluster4, "worker-2"), old_globals) == [False] * 3
    now = snapshot(cluster4)
    for name in ("worker-0", "worker-1"):
        iid = instance_of(cluster4, name)
        assert now[iid] == before[iid]  # memory and objects as before the old dataset
    for iid in tensor_ids(new):
        assert now[iid]["memory_usage"] > before[iid]["memory_usage"]
    assert len(dvml.datasets.list(client=client).query("name == 'ds_over'")) == 1
