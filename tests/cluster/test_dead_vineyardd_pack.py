"""A pack refused because one worker's vineyardd is dead: the right cause, nothing left behind.

After ``kill -9`` of worker-1's vineyardd, a pack on every worker must say that the daemon is
not running (not "start each worker with VINEYARD_IPC_SOCKET", which it was), must leave no
object on the live vineyardd of worker-0, and ``staging_runs`` (the tool that finds leftovers)
must answer instead of raising.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.jobs.job_cluster import staging_runs
from tests.helpers import REPO, pid_gone, poll_for, tls_environment
from tests.helpers.vineyard_probes import vineyard_contents

pytestmark = pytest.mark.cluster


def _frame(rows: int = 4000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {"x": list(rng.random((rows, 16), dtype=np.float32)), "y": rng.integers(0, 4, rows)}
    )


def _live_contents(cluster: dvml.LocalCluster, address: str) -> dict[str, object]:
    return cluster.client.submit(
        vineyard_contents, workers=[address], allow_other_workers=False, pure=False
    ).result(timeout=60)


_ATTACHED = """
import json, sys
import numpy as np, pandas as pd
import dvml
address, rules = sys.argv[1], json.loads(sys.argv[2])
rng = np.random.default_rng(0)
frame = pd.DataFrame({"x": list(rng.random((4000, 16), dtype=np.float32)),
                      "y": rng.integers(0, 4, 4000)})
cluster = dvml.connect(address)
try:
    dvml.training_preprocessor(frame, x="x", y="y", name="after", distribution_rules=rules)
    print(json.dumps({"error": None}))
except dvml.exceptions.DvmlError as exc:
    print(json.dumps({"error": str(exc), "type": type(exc).__name__}))
from dvml.jobs.job_cluster import staging_runs
print(json.dumps({"staging_runs": staging_runs(cluster.client)}))
"""


def _pack_from_another_process(cluster: dvml.LocalCluster, rules: object) -> str | None:
    env = {**os.environ, **tls_environment(cluster), "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", _ATTACHED, cluster.scheduler_address, json.dumps(rules)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert lines[1]["staging_runs"] == {}, "staging_runs found leftovers in the other process"
    return lines[0]["error"]


@pytest.mark.parametrize("attached", [False, True], ids=["owner", "attached"])
@pytest.mark.parametrize("rules", ["all_workers", ["worker-0", "worker-1"], ["worker-0"]])
def test_pack_after_a_vineyardd_died_names_it_and_leaves_nothing(
    local_cluster: Callable[..., dvml.LocalCluster], rules: object, attached: bool
) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    live = cluster.workers[0]
    dvml.training_preprocessor(_frame(), x="x", y="y", name="before", client=cluster.client)
    pid = cluster.processes()["vineyardd of worker-1"]
    os.kill(pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid), 10)
    before = _live_contents(cluster, live.address)

    if attached:
        message = _pack_from_another_process(cluster, rules)
    else:
        try:
            dvml.training_preprocessor(
                _frame(),
                x="x",
                y="y",
                name="after",
                distribution_rules=rules,
                client=cluster.client,
            )
            message = None
        except dvml.exceptions.DvmlError as exc:
            message = str(exc)
    if message is None:
        # Packing onto live workers only may succeed; what it made is a dataset, no leftover.
        assert rules == ["worker-0"]
        dvml.datasets.drop("after", client=cluster.client)
    else:
        assert "worker-1" in message
        assert "VINEYARD_IPC_SOCKET" not in message, message
        assert "not running" in message or "died" in message, message

    after = _live_contents(cluster, live.address)
    assert after["tensors"] == before["tensors"], "the refused pack left tensors behind"
    assert after["staging"] == before["staging"] == []
    assert staging_runs(cluster.client) == {}
    cluster.close()
