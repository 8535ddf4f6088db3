"""Reading a buffer by id on the wrong worker names the worker that holds it (#13 item 12)."""

from __future__ import annotations

import numpy as np
import pytest

import dvml
from dvml.exceptions import StoreError
from dvml.resolve import read_buffer
from dvml.resolve.by_id import holder_of
from tests.helpers import on_worker

RECORDS = [
    {
        "name": "ds",
        "layout": {
            "buffers": [
                {"index": 0, "instance_id": 3, "worker_name": "w0", "host": "h0",
                 "fields": {"x_0": {"id": 11}, "y": {"id": 12}}},
                {"index": 1, "instance_id": 4, "worker_name": "w1", "host": "h1",
                 "fields": {"x_0": {"id": 21}, "y": {"id": 22}}},
            ]
        },
    }
]  # fmt: skip


def test_holder_of() -> None:
    assert holder_of(22, RECORDS) == {
        "dataset": "ds", "buffer": 1, "field": "y", "instance_id": 4, "worker_name": "w1",
        "host": "h1",
    }  # fmt: skip
    assert holder_of(99, RECORDS) is None


@pytest.mark.cluster
def test_read_buffer_on_its_worker_and_elsewhere(cluster2: dvml.LocalCluster) -> None:
    client = cluster2.client
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20) % 2
    ds = dvml.training_preprocessor(
        {"x": x, "y": y}, y="y", x="x", name="rb_small", overwrite=True, client=client
    )
    try:
        table = ds.placement()
        buffer = table[table["worker_name"] == "worker-1"].iloc[0]
        workers = {w.name: w for w in cluster2.refresh()}
        oid = int(buffer["x_0_id"])
        held = on_worker(cluster2, workers["worker-1"], read_buffer, oid)
        assert held.shape == (int(buffer["rows"]), 2)
        assert set(held.ravel().tolist()) <= set(x.ravel().tolist())
        with pytest.raises(StoreError) as info:
            on_worker(cluster2, workers["worker-0"], read_buffer, oid)
        message = str(info.value)
        instance = int(buffer["vineyard_instance_id"])
        assert f"vineyard instance {instance} of worker worker-1 (host" in message, message
        assert "'rb_small'" in message and "worker-0" in message
        assert "0.0.0.0:0" not in message
    finally:
        ds.drop(client=client)
