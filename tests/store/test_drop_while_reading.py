"""A drop or overwrite while a reader in the worker process holds views (issue #16, item 9).

Before, the delete freed the tensors' shared memory under the reader at once, and the reader
read freed memory, then the bytes of the next dataset put there. Now the delete waits for the
reader: it sees the old data to the end, and the memory is freed when it closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.store import readers
from tests.helpers import object_exists, on_worker

pytestmark = pytest.mark.cluster

ROWS = 40_000


def table(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.normal(size=(ROWS, 8)), columns=[f"c{i}" for i in range(8)])
    frame["y"] = rng.integers(0, 2, size=ROWS)
    return frame


def read_before_and_after(name: str, opened: str, dropped: str) -> dict[str, Any]:
    """On a worker: open ``name``'s local views, wait for the drop, read them again."""
    from distributed import Event

    from dvml.resolve.partitions import open_local

    parts = open_local(name)
    try:
        before = [a.copy() for a in parts.fields["x_0"]]
        Event(opened).set()
        if not Event(dropped).wait(120):
            return {"error": "the test never dropped the dataset"}
        after = [a.copy() for a in parts.fields["x_0"]]
    finally:
        parts.close()
    return {
        "rows": sum(len(a) for a in before),
        "unchanged": all(np.array_equal(b, a) for b, a in zip(before, after, strict=True)),
    }


def test_pinned_ids_are_deleted_when_the_last_reader_lets_go() -> None:
    first = readers.pin([101, 102])
    second = readers.pin([101])
    assert readers.split_pinned([101, 102, 103]) == ([103], [101, 102])
    assert readers.unpin(first) == [102]  # 101 still has a reader
    assert readers.unpin(second) == [101]
    assert readers.split_pinned([101]) == ([101], [])  # nobody reads it any more


@pytest.mark.parametrize("how", ["drop", "overwrite"])
def test_a_reader_keeps_its_data_through_a_drop(
    local_cluster: Callable[..., dvml.LocalCluster], how: str
) -> None:
    cluster = local_cluster(n_workers=1, threads_per_worker=2, vineyard_memory="96MiB")
    client = cluster.client
    worker = cluster.workers[0]
    ds = dvml.training_preprocessor(table(1), y="y", x=[[f"c{i}" for i in range(8)]],
                                    name="victim", client=client)  # fmt: skip
    ids = [f["id"] for b in ds.layout["buffers"] for f in b["fields"].values()]
    from distributed import Event

    opened, dropped = Event(client=client), Event(client=client)
    reader = client.submit(read_before_and_after, "victim", opened.name, dropped.name,
                           workers=[worker.address], pure=False)  # fmt: skip
    assert opened.wait(120)

    if how == "drop":
        dvml.datasets.drop("victim", client)
        # New data of the same size, which would reuse the freed memory.
        dvml.training_preprocessor(table(2), y="y", x=[[f"c{i}" for i in range(8)]],
                                   name="newcomer", client=client)  # fmt: skip
    else:
        dvml.training_preprocessor(table(2), y="y", x=[[f"c{i}" for i in range(8)]],
                                   name="victim", overwrite=True, client=client)  # fmt: skip
    if how == "drop":
        assert not dvml.datasets.exists("victim", client)
    else:
        assert dvml.datasets.describe("victim", client).id != ds.id
    assert all(on_worker(cluster, worker, object_exists, ids))  # kept for the reader
    dropped.set()

    result = reader.result(timeout=120)
    assert result == {"rows": ROWS, "unchanged": True}
    assert not any(on_worker(cluster, worker, object_exists, ids))  # freed once it let go
