"""A dataset whose vineyardd died is reported as damaged, with what was lost (issue #16, item 10).

Before, ``datasets.list()``, ``describe()`` and the CLI kept reporting every row of a dataset
whose buffers lived on a dead vineyardd; only ``fit`` noticed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.cluster.health import wait_watched
from dvml.exceptions import VineyarddDiedError
from dvml.store.datasets import lost_buffers
from tests.helpers import pid_gone, poll_for


def layout(instances: list[int]) -> dict[str, list[dict[str, int]]]:
    return {"buffers": [{"index": i, "instance_id": iid} for i, iid in enumerate(instances)]}


def test_lost_buffers_are_those_on_instances_no_live_worker_serves() -> None:
    assert lost_buffers(layout([0, 1, 0, 1]), {0: "w0", 1: "w1"}) == ()
    assert lost_buffers(layout([0, 1, 0, 1]), {0: "w0"}) == (1, 3)
    assert lost_buffers(layout([4, 4]), []) == (0, 1)


@pytest.mark.cluster
def test_a_dead_vineyardd_makes_its_datasets_damaged(
    local_cluster: Callable[..., dvml.LocalCluster],
) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    client = cluster.client
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": rng.normal(size=40), "y": rng.integers(0, 2, size=40)})
    ds = dvml.training_preprocessor(
        table, y="y", x="a", distribution_rules="all_workers", name="health", client=client
    )
    on_victim = sum(b["rows"] for b in ds.layout["buffers"] if b["worker_name"] == "worker-1")
    assert 0 < on_victim < ds.rows
    listed = dvml.datasets.list(client).set_index("name")
    assert listed.loc["health", "status"] == "intact"
    assert listed.loc["health", "lost_rows"] == 0

    pid = cluster.processes()["vineyardd of worker-1"]
    os.kill(pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid), 10)

    listed = dvml.datasets.list(client).set_index("name")
    assert listed.loc["health", "status"] == "damaged"
    assert listed.loc["health", "lost_rows"] == on_victim
    assert listed.loc["health", "rows"] == ds.rows  # what it held, next to what is lost
    described = dvml.datasets.describe("health", client)
    assert described.damaged
    assert described.lost_rows == on_victim
    assert "worker-1" in (described.damage() or "")
    assert "DAMAGED" in repr(described)
    placement = described.placement().set_index("worker_name")
    assert set(placement.loc["worker-1", ["status"]].values.ravel()) == {"lost"}
    assert set(placement.loc["worker-0", ["status"]].values.ravel()) == {"ok"}
    assert dvml.datasets.exists("health", client)  # the name is still there, to drop it

    # Tasks slower than the watch's interval: a catalog read or a delete on a live vineyardd
    # must finish (under load a drop of this dataset failed: the watch found the dead vineyardd
    # and cancelled the catalog read); any other watched task stops at once.
    live = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "worker-0")
    catalog_like = client.submit(time.sleep, 2.0, workers=[live], pure=False)
    wait_watched(client, [catalog_like], interval=0.2, vineyardd=False)
    needs_every_vineyardd = client.submit(time.sleep, 2.0, workers=[live], pure=False)
    with pytest.raises(VineyarddDiedError, match="worker-1"):
        wait_watched(client, [needs_every_vineyardd], interval=0.2)

    dvml.datasets.drop("health", client)
    assert not dvml.datasets.exists("health", client)
