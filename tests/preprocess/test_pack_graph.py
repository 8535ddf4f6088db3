"""The pack graph at many partitions: O(P + W) tasks, balance and placement (issue 17).

A 1,024-partition source is packed onto the 4 workers of ``cluster4``; the tasks the scheduler
received are counted by function and compared with :func:`dvml.placement.routes.pack_graph_size`
(one prepare task per batch of small partitions, fused with the source's reads of them; one
stats and one split task per group of batches on one worker, one pack task per thread of each
target worker: nothing per partition and target).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import pytest

import dvml
from dvml.placement.routes import pack_graph_size
from tests.helpers import on_worker, sort_rows
from tests.helpers.graphs import count_by_name, start_recording, stop_recording

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]


def read_buffer(ids: Sequence[int]) -> dict[str, Any]:
    """On a worker: the instance of each object and a copy of its values."""
    import vineyard

    client = vineyard.connect()  # shared connection: never closed (see tests.helpers)
    out = []
    for raw in ids:
        oid = vineyard.ObjectID(int(raw))
        out.append((int(client.get_meta(oid).instance_id), np.array(client.get(oid))))
    return {"local": int(client.instance_id), "objects": out}


def test_1024_partitions_onto_4_workers(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    client = cluster4.client
    n, parts = 4096, 1024
    rng = np.random.default_rng(21)
    x_np, y_np = rng.random((n, 3)), rng.integers(0, 3, size=n)
    x, y = da.from_array(x_np, chunks=(4, 3)), da.from_array(y_np, chunks=4)
    assert x.numblocks[0] == parts
    clean_vineyard4.append("pp_1024")
    start_recording(client)
    try:
        ds = dvml.training_preprocessor(
            {"x": x, "y": y}, y="y", x="x", buffer_size=300, name="pp_1024", client=client
        )
    finally:
        tasks = stop_recording(client)

    # Placement: every buffer lives in the vineyardd of the worker its record names, and the
    # default rules use all 4 workers.
    workers = {w.vineyard_instance_id: w for w in cluster4.refresh()}
    rows: dict[str, int] = {}
    blocks = []
    for b in ds.layout["buffers"]:
        owner = workers[b["instance_id"]]
        assert b["worker_name"] == owner.name
        answer = on_worker(
            cluster4, owner, read_buffer, [b["fields"][f]["id"] for f in ("x_0", "y")]
        )
        assert answer["local"] == b["instance_id"]
        (ix, bx), (iy, by) = answer["objects"]
        assert ix == iy == b["instance_id"]
        assert len(bx) == len(by) == b["rows"] <= 300
        # the default, compact layout: float x as float32, y as uint8 class indices
        assert bx.dtype == np.float32 and by.dtype == np.uint8 and by.ndim == 1
        blocks.append(np.hstack([bx, by[:, None].astype(np.float32)]))
        rows[owner.name] = rows.get(owner.name, 0) + b["rows"]
    # Balance within one row over the 4 workers.
    assert sorted(rows) == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert max(rows.values()) - min(rows.values()) <= 1
    assert sum(rows.values()) == len(y_np) == ds.rows
    # The same rows as the source (the shuffle moves rows, never changes them).
    want = np.hstack([x_np.astype(np.float32), y_np[:, None].astype(np.float32)])  # classes 0-2
    np.testing.assert_array_equal(sort_rows(np.concatenate(blocks)), sort_rows(want))

    # The graph: O(P + W) tasks, as the model counts them.
    counts = count_by_name(tasks)
    holders = {w for name, restricted in tasks if name == "group_stats" for w in restricted}
    block_bytes = 4 * (3 * 8 + 8)  # 4 rows of x (3 float64) and y (int64)
    model = pack_graph_size(parts, 4, len(ds.layout["buffers"]), holders=len(holders),
                            partition_bytes=block_bytes, batched=True)  # fmt: skip
    # 1,024 partitions of 128 bytes on 4 threads: 16 tasks read and prepare them (4 per
    # thread), each reading its blocks of x and y itself.
    assert counts["prepare_arrays"] == model["prepare"] == 16
    assert {"prepare_arrays", "group_stats", "split_group", "pack_buffers"} <= set(counts)
    assert counts["group_stats"] == model["stats"] == len(holders)
    assert counts["split_group"] == model["split"]
    # One pack task per target worker (1 thread each), however many buffers it holds.
    assert counts["pack_buffers"] == model["pack"] == 4 < len(ds.layout["buffers"])
    assert 1 <= len(holders) <= 4
    ours = model["prepare"] + counts["group_stats"] + counts["split_group"]
    assert ours + counts["pack_buffers"] == model["tasks"] - model["catalog"]
    assert not any(name in counts for name in ("take_piece", "split_part"))
