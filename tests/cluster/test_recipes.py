"""The deployment recipes in cluster/: a two-worker "host" on 127.0.0.1, started by the scripts."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import dask.config
import pytest
import yaml

import dvml
from dvml import config
from dvml.cluster.processes import free_port
from tests.helpers import pid_gone, poll_for

pytestmark = pytest.mark.cluster

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "cluster"


def run_script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(RECIPES / name), *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def reported(stdout: str) -> list[dict[str, str]]:
    """The ``pid=... name=...`` lines a script printed, as dicts."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith("pid="):
            rows.append(dict(field.split("=", 1) for field in line.split()))
    return rows


def stop_by_pid(pids: list[int]) -> None:
    """SIGTERM in the given order, wait, then SIGKILL what is left."""
    for pid in pids:
        if not pid_gone(pid):
            os.kill(pid, signal.SIGTERM)
            poll_for(lambda p=pid: pid_gone(p), 20, interval=0.1)
    for pid in pids:
        if not pid_gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def workdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="dvr-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("script", ["etcd.sh", "scheduler.sh", "host.sh"])
def test_usage(script: str) -> None:
    result = run_script(script, "--help")
    assert result.returncode == 0 and result.stdout.startswith(f"usage: cluster/{script}")
    wrong = run_script(script, "--no-such-flag")
    assert wrong.returncode == 2 and "unknown argument '--no-such-flag'" in wrong.stderr


def test_host_refuses_too_much_shared_memory(workdir: pathlib.Path) -> None:
    result = run_script(
        "host.sh", "--etcd", "http://127.0.0.1:1", "--scheduler", "tcp://127.0.0.1:1",
        "--vineyard-memory", "1PiB", "--socket-dir", str(workdir / "h"),
    )  # fmt: skip
    assert result.returncode == 1
    assert "does not fit in free /dev/shm" in result.stderr
    assert not (workdir / "h").exists()  # refused before anything was created


def test_scripts_start_a_cluster_that_dvml_connects_to(workdir: pathlib.Path) -> None:
    etcd_port, peer_port, scheduler_port = free_port(), free_port(), free_port()
    started: list[int] = []  # in start order; stopped in reverse
    try:
        etcd = run_script(
            "etcd.sh", "--client-port", str(etcd_port), "--peer-port", str(peer_port),
            "--data-dir", str(workdir / "etcd" / "data"),
        )  # fmt: skip
        assert etcd.returncode == 0, etcd.stderr
        (etcd_row,) = reported(etcd.stdout)
        started.append(int(etcd_row["pid"]))

        scheduler = run_script(
            "scheduler.sh", "--port", str(scheduler_port), "--dashboard-address", "127.0.0.1:0",
            "--log-dir", str(workdir / "scheduler"),
        )  # fmt: skip
        assert scheduler.returncode == 0, scheduler.stderr
        (scheduler_row,) = reported(scheduler.stdout)
        started.append(int(scheduler_row["pid"]))
        address = scheduler_row["address"]
        assert address == f"tcp://127.0.0.1:{scheduler_port}"

        host = run_script(
            "host.sh", "--etcd", etcd_row["endpoint"], "--scheduler", address,
            "--workers", "2", "--gpus-per-worker", "1", "--vineyard-memory", "64MiB",
            "--host-name", "host-a", "--socket-dir", str(workdir / "host-a"),
        )  # fmt: skip
        rows = reported(host.stdout)
        started += [int(r["pid"]) for r in rows]
        assert host.returncode == 0, host.stderr
        assert [r["name"] for r in rows] == ["vineyardd", "host-a-worker-0", "host-a-worker-1"]
        socket_dir = workdir / "host-a"
        assert (os.stat(socket_dir).st_mode & 0o777) == 0o700

        cluster = dvml.connect(address)
        try:
            workers = cluster.workers
            assert [w.name for w in workers] == ["host-a-worker-0", "host-a-worker-1"]
            assert {w.host for w in workers} == {"host-a"}
            assert {w.vineyard_socket for w in workers} == {rows[0]["socket"]}
            # Both workers of the host share its one vineyardd.
            assert {w.vineyard_instance_id for w in workers} == {int(rows[0]["instance_id"])}
            info = cluster.client.scheduler_info(n_workers=-1)["workers"].values()
            assert [w["resources"] for w in info] == [{"GPU": 1}, {"GPU": 1}]
            assert set(cluster.status().vineyardd) == {"running"}
        finally:
            cluster.close()
    finally:
        stop_by_pid(list(reversed(started)))
    assert all(pid_gone(pid) for pid in started)


def test_local_yaml_is_a_valid_dvml_configuration() -> None:
    with open(RECIPES / "local.yaml") as f:
        settings = yaml.safe_load(f)
    assert set(settings["dvml"]) <= set(config.defaults()["dvml"])
    with dask.config.set({"dvml": settings["dvml"]}):
        config.validate()  # raises ConfigError on an unknown key
        assert config.get("cluster.vineyard-memory") == "1GiB"
