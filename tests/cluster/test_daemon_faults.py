"""A daemon that dies, an owner that dies, two `up` at once, a forged state file (#16: 5, 8, 14).

Every call after (or during) an etcd death ends in bounded time with an error that names etcd;
daemons never outlive the process that owns their cluster; `dvml cluster` never signals a
process whose identity (pid, start time, command line) is not proven.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import dvml
from dvml.cluster.state import recorded_processes, same_process, signal_process, write_state
from dvml.exceptions import DaemonDiedError
from tests.helpers import (
    REPO,
    dvml_command,
    one_error_line,
    pid_gone,
    poll_for,
    workers_stderr,
)

pytestmark = pytest.mark.cluster

# Generous: the machine is shared and slow; today these calls never return at all.
BOUND = 60.0


def bounded(fn: Callable[[], Any], bound: float = BOUND) -> tuple[Any, BaseException | None]:
    """Run ``fn`` in a thread; fail the test when it has not returned within ``bound`` s."""
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"the call did not return within {bound:.0f}s (it hangs)"
    assert time.monotonic() - start < bound
    return (result[0] if result else None), (error[0] if error else None)


def digits_source(rows: int = 600) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.random((rows, 8, 8), dtype=np.float32),
        "y": rng.integers(0, 10, rows),
    }


def pack(cluster: dvml.LocalCluster, name: str, rows: int = 600) -> dvml.Dataset:
    return dvml.training_preprocessor(
        digits_source(rows), "y", "x", name=name, client=cluster.client
    )


def kill_etcd(cluster: dvml.LocalCluster) -> int:
    pid = cluster.processes()["etcd"]
    os.kill(pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid), 10)
    return pid


def assert_names_etcd(error: BaseException | None, pid: int) -> None:
    assert isinstance(error, DaemonDiedError), repr(error)
    assert f"etcd (pid {pid})" in str(error)
    assert "Restart the cluster" in str(error)


def test_calls_after_etcd_died_fail_fast(
    local_cluster: Callable[..., dvml.LocalCluster],
) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="64MiB")
    pack(cluster, "before")
    pid = kill_etcd(cluster)

    _, error = bounded(lambda: dvml.datasets.list(client=cluster.client))
    assert_names_etcd(error, pid)
    _, error = bounded(lambda: dvml.datasets.describe("before", client=cluster.client))
    assert_names_etcd(error, pid)
    _, error = bounded(lambda: dvml.datasets.drop("before", client=cluster.client))
    assert_names_etcd(error, pid)
    _, error = bounded(lambda: pack(cluster, "after"))
    assert_names_etcd(error, pid)
    _, error = bounded(cluster.check_daemons)
    assert_names_etcd(error, pid)

    table, error = bounded(cluster.status)
    assert error is None, error
    assert set(table["etcd"]) == {"dead"}
    assert set(table["etcd_reachable"]) == {"unreachable"}


def test_etcd_killed_during_a_pack(local_cluster: Callable[..., dvml.LocalCluster]) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    pid = cluster.processes()["etcd"]
    source = digits_source(60_000)
    killed = threading.Event()

    def kill_when_packing() -> None:
        # Once the split, take or pack tasks run, the pack graph is under way: etcd dies now.
        def packing() -> bool:
            keys = [str(k) for ks in cluster.client.processing().values() for k in ks]
            return any(k.startswith(("split_part", "take_piece", "pack_buffers")) for k in keys)

        poll_for(packing, 60, interval=0.02)
        os.kill(pid, signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_when_packing, daemon=True)
    killer.start()
    _, error = bounded(
        lambda: dvml.training_preprocessor(
            source, "y", "x", name="during", buffer_size=2000, client=cluster.client
        )
    )
    killer.join(60)
    assert killed.is_set(), "etcd was never killed: the pack ended first"
    assert_names_etcd(error, pid)
    _, error = bounded(lambda: dvml.datasets.list(client=cluster.client))
    assert_names_etcd(error, pid)


# -- a vineyardd that dies: no retry chatter from vineyard's client ----------------------------

RETRY_CHATTER = "Connection to IPC socket failed"  # vineyard's client, on fd 2, per retry


def dead_socket(directory: pathlib.Path) -> str:
    """A Unix socket file that nobody listens on: what a vineyardd killed by a signal leaves."""
    import socket

    path = str(directory / "dead.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
    return path


def test_no_vineyard_connect_to_a_dead_socket(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """vineyard's client prints a retry line on fd 2 for a socket nobody listens on (even
    with VINEYARD_IPC_SKIP_RETRY): dvml finds the dead daemon by a plain connect first."""
    from dvml.cluster.connection import local_client
    from dvml.cluster.daemons import vineyard_instance_id

    path = dead_socket(tmp_path)
    with pytest.raises(DaemonDiedError) as died:
        local_client(path)
    assert path in str(died.value) and "not running" in str(died.value), str(died.value)
    assert vineyard_instance_id(path) is None
    out = capfd.readouterr()
    assert RETRY_CHATTER not in out.err + out.out, out.err


def test_calls_after_a_vineyardd_died_print_no_retry_lines(
    local_cluster: Callable[..., dvml.LocalCluster],
    tmp_path: pathlib.Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """What the soak does after it kills a vineyardd: list, describe and drop the dataset, then
    close the cluster. Nothing prints vineyard's retry line, on the workers (their fd 2) or here
    (#16 item 15: it was printed on every call after a daemon died)."""
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    pack(cluster, "vd_dead")
    pid = cluster.processes()["vineyardd of worker-1"]
    os.kill(pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid), 10)
    capfd.readouterr()
    with workers_stderr(cluster.client, tmp_path / "stderr") as written:
        listed, error = bounded(lambda: dvml.datasets.list(cluster.client))
        assert error is None, error
        assert listed.set_index("name").loc["vd_dead", "status"] == "damaged"
        _, error = bounded(lambda: dvml.datasets.describe("vd_dead", cluster.client))
        assert error is None, error
        _, error = bounded(lambda: dvml.datasets.drop("vd_dead", cluster.client))
    cluster.close()
    out = capfd.readouterr()
    text = written() + out.err + out.out
    assert RETRY_CHATTER not in text, text[-3000:]


# -- an owner that dies ----------------------------------------------------------------------

OWNER_SCRIPT = """
import json, sys, time
import dvml
if __name__ == "__main__":
    cluster = dvml.LocalCluster(n_workers=2, vineyard_memory="64MiB")
    print(json.dumps({"pids": cluster.processes(), "directory": cluster.directory}), flush=True)
    time.sleep(600)
"""


@pytest.fixture
def private_tmp() -> Iterator[pathlib.Path]:
    """A private TMPDIR for the processes a test starts (their clusters' directories)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dvd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_daemons_die_with_a_killed_owner(private_tmp: pathlib.Path) -> None:
    env = {**os.environ, "TMPDIR": str(private_tmp), "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        assert line, "the owner process did not start its cluster"
        started = json.loads(line)
        pids = started["pids"]
        assert {"etcd", "vineyardd of worker-0", "dask worker worker-1"} <= set(pids)
        assert not any(pid_gone(p) for p in pids.values())
    finally:
        owner.kill()
        owner.wait(30)

    try:
        assert poll_for(lambda: all(pid_gone(p) for p in pids.values()), 30), {
            n: p for n, p in pids.items() if not pid_gone(p)
        }
    finally:  # what this test's owner started, should it have outlived it
        for pid in pids.values():
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert os.path.isdir(started["directory"])  # nobody ran the owner's clean-up
    status = dvml_command(
        "cluster", "status", "--state-dir", str(private_tmp / "state"), env=env, timeout=120
    )
    assert status.returncode == 1  # no cluster recorded there ...
    assert not os.path.exists(started["directory"])  # ... but the dead one's directory is gone


# -- dvml cluster up / status / down -----------------------------------------------------------


def read_state(state_dir: pathlib.Path) -> dict[str, Any]:
    with open(state_dir / "cluster.json") as f:
        return dict(json.load(f))


@pytest.fixture
def state_dir(private_tmp: pathlib.Path) -> Iterator[pathlib.Path]:
    path = private_tmp / "state"
    yield path
    if (path / "cluster.json").exists():
        dvml_command("cluster", "down", "--state-dir", str(path), "--timeout", "20")


def test_status_cleans_up_after_a_killed_serve_process(
    state_dir: pathlib.Path, private_tmp: pathlib.Path
) -> None:
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    up = dvml_command("cluster", "up", "--state-dir", str(state_dir), "--n-workers", "1", env=env)
    assert up.returncode == 0, up.stderr
    state = read_state(state_dir)
    os.kill(state["pid"], signal.SIGKILL)
    pids = [p for p, _ in recorded_processes(state).values()]
    assert poll_for(lambda: all(pid_gone(p) for p in pids), 30), "daemons outlived serve"

    status = dvml_command("cluster", "status", "--state-dir", str(state_dir), env=env, timeout=60)
    assert status.returncode == 1
    assert "was cleaned up" in one_error_line(status)
    assert not (state_dir / "cluster.json").exists()
    assert not os.path.exists(state["directory"])


def test_another_client_is_told_that_etcd_died(
    state_dir: pathlib.Path, private_tmp: pathlib.Path
) -> None:
    """`dvml datasets list` in a process that does not own the cluster: the scheduler's
    process (serve, the owner) answers which daemon died."""
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    up = dvml_command("cluster", "up", "--state-dir", str(state_dir), "--n-workers", "1", env=env)
    assert up.returncode == 0, up.stderr
    etcd = read_state(state_dir)["processes"]["etcd"]
    os.kill(etcd, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(etcd), 10)
    start = time.monotonic()
    listing = dvml_command(  # the state dir gives the cluster's TLS certificate
        "datasets", "list", "--scheduler", read_state(state_dir)["scheduler_address"],
        "--state-dir", str(state_dir), env=env, timeout=BOUND,
    )  # fmt: skip
    assert time.monotonic() - start < BOUND
    assert listing.returncode == 1
    assert f"etcd (pid {etcd})" in one_error_line(listing)

    start = time.monotonic()
    status = dvml_command(
        "cluster", "status", "--state-dir", str(state_dir), env=env, timeout=BOUND
    )
    assert time.monotonic() - start < BOUND
    assert status.returncode == 1
    assert "etcd is not reachable from worker-0" in one_error_line(status)


def test_two_concurrent_ups_start_one_cluster(
    state_dir: pathlib.Path, private_tmp: pathlib.Path
) -> None:
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    argv = [sys.executable, "-m", "dvml", "cluster", "up", "--state-dir", str(state_dir),
            "--n-workers", "1", "--vineyard-memory", "64MiB"]  # fmt: skip
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    serve_pids = [int(m) for out, _ in results for m in re.findall(r"serve pid (\d+)", out)]
    recorded = read_state(state_dir)["pid"] if (state_dir / "cluster.json").exists() else None
    for pid in serve_pids:  # a second cluster that nothing recorded: stop it by its pid
        if pid != recorded and not pid_gone(pid):
            os.kill(pid, signal.SIGTERM)
            poll_for(lambda pid=pid: pid_gone(pid), 60)
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], results
    failed = results[[p.returncode for p in procs].index(1)][1]
    assert "Another `dvml cluster up` is starting" in failed or "already running" in failed
    state = read_state(state_dir)
    clusters = [d for d in os.listdir(private_tmp) if d.startswith("dvml-cluster-")]
    assert clusters == [os.path.basename(state["directory"])]  # exactly one was started

    down = dvml_command("cluster", "down", "--state-dir", str(state_dir), env=env, timeout=120)
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize("forgery", ["no start times", "wrong start time", "wrong command"])
def test_down_never_signals_an_unproven_process(
    state_dir: pathlib.Path, private_tmp: pathlib.Path, forgery: str
) -> None:
    victim = subprocess.Popen(["sleep", "120"])
    try:
        import psutil

        start = psutil.Process(victim.pid).create_time()
        identity: dict[str, Any] = {"start_time": start, "cmdline": ["sleep", "120"]}
        if forgery == "no start times":
            identity = {}  # a state file as older dvml versions wrote it
        elif forgery == "wrong start time":
            identity["start_time"] = start - 3600
        else:
            identity["cmdline"] = ["dvml-serve"]
        decoy = private_tmp / "dvml-cluster-decoy"
        decoy.mkdir()
        state_dir.mkdir()
        write_state(
            state_dir,
            {"pid": victim.pid, "scheduler_address": "tcp://127.0.0.1:1",
             "directory": str(decoy), "processes": {"etcd": victim.pid},
             **({"start_time": identity["start_time"],
                 "start_times": {"etcd": identity["start_time"]}} if identity else {}),
             **({"cmdline": identity["cmdline"],
                 "cmdlines": {"etcd": identity["cmdline"]}} if identity else {})},
        )  # fmt: skip
        down = dvml_command("cluster", "down", "--state-dir", str(state_dir), "--timeout", "2")
        time.sleep(0.5)
        assert victim.poll() is None, "down signalled a process it could not prove its own"
        assert decoy.is_dir()  # nor removed a directory that is not provably a dead cluster's
        if forgery == "no start times":  # cannot tell: says so, keeps the file
            assert down.returncode == 1
            assert "not proven" in one_error_line(down)
            (state_dir / "cluster.json").unlink()
        else:  # proven to be another process: the cluster is gone, the stale file removed
            assert down.returncode == 0, down.stderr
            assert not (state_dir / "cluster.json").exists()
    finally:
        victim.kill()
        victim.wait()


def test_pid_one_is_never_signalled() -> None:
    for record in ({"pid": 1}, {"pid": 1, "start_time": 0.0, "cmdline": ["init"]}):
        assert not signal_process(record, signal.SIGTERM)
    assert not same_process(1, None)
    assert not same_process(os.getpid(), None)  # no start time recorded: nothing proven
