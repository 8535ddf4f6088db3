"""write_arrays on a real vineyardd: a worker killed while filling leaves nothing behind."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dvml
from dvml.store.publish import cleanup_run

pytestmark = pytest.mark.cluster

ROWS = 25 << 20  # float32: 100 MiB


def memory_usage() -> int:
    """On a worker: bytes in use in its vineyardd."""
    from dvml.cluster.connection import local_client

    return int(local_client().status.memory_usage)


def write_and_die_once(marker: str, run_id: str) -> dict[str, Any]:
    """On a worker: fill a 100 MiB tensor; the first attempt dies half way through the fill."""
    from dvml.store.tensors import STAGING_PREFIX, write_arrays

    def fill(out: dict[str, np.ndarray]) -> None:
        out["x"][: ROWS // 2] = 1.0
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # SIGKILL-like: no cleanup of any kind in this process
        out["x"][ROWS // 2 :] = 2.0

    staging = f"{STAGING_PREFIX}{run_id}/0/{os.getpid()}"  # one name per attempt
    return write_arrays({"x": ((ROWS,), np.float32)}, fill, staging_name=staging)


def read_sum(oid: int) -> float:
    """On a worker: the sum of a local tensor, read with a plain vineyard client."""
    import vineyard

    return float(np.asarray(vineyard.connect().get(vineyard.ObjectID(oid))).sum())


@pytest.fixture
def one_worker(local_cluster: Callable[..., dvml.LocalCluster]) -> dvml.LocalCluster:
    return local_cluster(n_workers=1, vineyard_memory="256MiB")


def test_worker_killed_while_filling_leaks_no_memory(
    one_worker: dvml.LocalCluster, tmp_path: Any
) -> None:
    client = one_worker.client
    before = client.submit(memory_usage, pure=False).result()
    # Dask reruns the task on the restarted worker (same vineyardd); that attempt succeeds.
    record = client.submit(
        write_and_die_once, str(tmp_path / "killed"), "killtest", pure=False
    ).result(timeout=180)
    assert (tmp_path / "killed").exists()
    oid = record["fields"]["x"]["id"]
    assert client.submit(read_sum, oid, pure=False).result() == pytest.approx(1.5 * ROWS)
    # The dead attempt's object was staged before its fill began, so the run's cleanup finds
    # it: without that, vineyardd would hold its unsealed 100 MiB until restarted.
    during = client.submit(memory_usage, pure=False).result()
    assert during >= before + 2 * ROWS * 4
    cleanup_run(client, "killtest", keep=None)
    assert client.submit(memory_usage, pure=False).result() == before
