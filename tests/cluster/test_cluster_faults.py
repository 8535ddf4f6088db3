"""Failures of a LocalCluster: each gives a clear error and leaves no process or directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

import dvml
import dvml.cluster.daemons
from dvml.cluster.processes import ManagedProcess, free_port
from dvml.exceptions import ClusterStartError, DaemonDiedError
from tests.helpers import assert_no_new_processes, child_processes, pid_gone, poll_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh temporary directory where LocalCluster creates its own (short: socket paths)."""
    path = tempfile.mkdtemp(prefix="dvt-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def left_behind(tmp: str) -> list[str]:
    """What a cluster left in ``tmp``; Dask's shared scratch root holds only its lock files."""
    found = [os.path.join(tmp, p) for p in os.listdir(tmp) if p != "dask-scratch-space"]
    scratch = os.path.join(tmp, "dask-scratch-space")
    if os.path.isdir(scratch):
        found += [os.path.join(scratch, p) for p in os.listdir(scratch) if not p.endswith(".lock")]
    return found


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_workers": 0}, ValueError, "n_workers must be at least 1"),
        ({"n_workers": 2, "gpus": -1}, ValueError, "GPU counts cannot be negative"),
        ({"n_workers": 3, "gpus": [1, 0]}, ValueError, "one count per worker"),
        ({"n_workers": 1, "vineyard_memory": "lots"}, ValueError, "Received: 'lots'"),
        ({"n_workers": 1, "vineyard_memory": "1PiB"}, ValueError, "/dev/shm has"),
        ({"n_workers": 1, "threads_per_worker": 0}, ValueError, "threads_per_worker"),
    ],
)
def test_bad_arguments_fail_before_anything_starts(
    private_tmp: str,
    local_cluster: Callable[..., dvml.LocalCluster],
    kwargs: dict,
    error: type[Exception],
    match: str,
) -> None:
    before = child_processes()
    with pytest.raises(error, match=match):
        local_cluster(**kwargs)
    assert child_processes() == before  # at once: nothing was started at all
    assert left_behind(private_tmp) == []


def test_scheduler_port_taken(
    private_tmp: str, local_cluster: Callable[..., dvml.LocalCluster]
) -> None:
    port = free_port()
    before = child_processes()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(ClusterStartError, match=f"scheduler port {port} .* already taken"):
            local_cluster(n_workers=1, scheduler_port=port)
    assert child_processes() == before
    assert left_behind(private_tmp) == []


@pytest.mark.parametrize("bad", [0, 1])
def test_vineyardd_that_dies_at_once(
    private_tmp: str,
    monkeypatch: pytest.MonkeyPatch,
    local_cluster: Callable[..., dvml.LocalCluster],
    bad: int,
) -> None:
    """A real vineyardd given an unknown flag exits at once; the start fails and cleans up.

    ``bad=1`` fails after Dask has started, so the cleanup must stop the workers too.
    """

    class WithBadFlag(ManagedProcess):
        def __init__(self, name: str, argv: list[str], log_path: str, env=None) -> None:
            if name == f"vineyardd of worker-{bad}":
                argv = [*argv, "--no_such_flag=1"]
            super().__init__(name, argv, log_path, env)

    # Only start_vineyardd builds its process after this point (etcd starts before).
    monkeypatch.setattr(dvml.cluster.daemons, "ManagedProcess", WithBadFlag)
    before = child_processes()
    with pytest.raises(ClusterStartError, match=f"vineyardd of worker-{bad} exited") as info:
        local_cluster(n_workers=2, vineyard_memory="64MiB")
    assert "no_such_flag" in str(info.value)  # the daemon's own log explains why
    assert_no_new_processes(before)
    assert left_behind(private_tmp) == []


def touch_vineyard() -> int:
    """On a worker: connect to this worker's vineyardd and put a small array."""
    import numpy as np
    import vineyard
    from vineyard.core.builder import put

    client = vineyard.connect()  # shared by the whole worker process: never closed
    oid = put(client, np.zeros(8))
    client.delete(oid)
    return int(client.instance_id)


def test_killed_vineyardd_is_reported_and_fails_tasks_quickly(
    local_cluster: Callable[..., dvml.LocalCluster],
) -> None:
    import vineyard

    before = child_processes()
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    victim, survivor = cluster.workers[1], cluster.workers[0]
    pid = cluster.processes()["vineyardd of worker-1"]
    os.kill(pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid), 10)

    status = cluster.status().set_index("name")
    assert status.loc["worker-1", "vineyardd_process"] == "dead (exit -9)"
    assert status.loc["worker-1", "vineyardd"] != "running"
    assert status.loc["worker-0", "vineyardd_process"] == "running"
    assert status.loc["worker-0", "vineyardd"] == "running"
    with pytest.raises(DaemonDiedError, match=r"vineyardd of worker-1 .*not running"):
        cluster.check_daemons()

    start = time.monotonic()
    future = cluster.client.submit(
        touch_vineyard, workers=[victim.address], allow_other_workers=False, pure=False
    )
    # vineyard's own error, raised in the task (it connects to the dead socket and gives up
    # after its retries); not a TimeoutError, which would mean the task hung
    with pytest.raises(vineyard.ConnectionFailedException, match="Failed to connect") as info:
        future.result(timeout=30)
    assert victim.vineyard_socket in str(info.value)  # vineyard names the dead socket
    assert time.monotonic() - start < 30
    # The other worker and its daemon are unaffected.
    healthy = cluster.client.submit(
        touch_vineyard, workers=[survivor.address], allow_other_workers=False, pure=False
    )
    assert healthy.result(timeout=30) == survivor.vineyard_instance_id
    cluster.close()
    assert_no_new_processes(before)


def test_leak_check_catches_a_leftover_child() -> None:
    """The suite's leak check itself: a child left running fails, a stopped one passes."""
    before = child_processes()
    child = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(pytest.fail.Exception, match=f"pid {child.pid}: sleep 60"):
            assert_no_new_processes(before, timeout=0.3)
    finally:
        child.kill()
        child.wait()
    assert_no_new_processes(before, timeout=0.3)
