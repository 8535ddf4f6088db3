"""``dvml cluster up|status|down`` run as real commands (``python -m dvml``)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from dvml.cluster.state import recorded_processes, same_process, write_state
from tests.helpers import dvml_command, one_error_line, pid_gone, poll_for

pytestmark = pytest.mark.cluster


def read_state(state_dir: pathlib.Path) -> dict[str, Any]:
    with open(state_dir / "cluster.json") as f:
        return json.load(f)


def running(state: dict[str, Any]) -> list[str]:
    """The recorded processes that still run."""
    return [n for n, (p, t) in recorded_processes(state).items() if same_process(p, t)]


@pytest.fixture
def state_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A private state directory; whatever a failed test left running is stopped by pid."""
    path = tmp_path / "state"
    yield path
    if (path / "cluster.json").exists():
        state = read_state(path)
        dvml_command("cluster", "down", "--state-dir", str(path), "--timeout", "20")
        for _, (pid, t) in recorded_processes(state).items():
            if same_process(pid, t):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "args",
    [["--help"], ["cluster", "--help"], ["cluster", "up", "--help"],
     ["cluster", "status", "--help"], ["cluster", "down", "--help"]],
)  # fmt: skip
def test_help(args: list[str]) -> None:
    result = dvml_command(*args, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: dvml")


def test_version_and_usage_errors() -> None:
    assert dvml_command("--version", timeout=60).stdout.startswith("dvml ")
    result = dvml_command("cluster", "up", "--no-such-option", timeout=60)
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-option" in result.stderr
    assert dvml_command("cluster", timeout=60).returncode == 2  # a group without its command


def test_status_and_down_without_cluster(state_dir: pathlib.Path) -> None:
    for command in ("status", "down"):
        result = dvml_command("cluster", command, "--state-dir", str(state_dir), timeout=60)
        assert result.returncode == 1
        assert "No cluster is recorded" in one_error_line(result)
        assert "Traceback" not in result.stderr


def test_status_removes_a_stale_state_file(state_dir: pathlib.Path) -> None:
    # This test's own pid with another start time: a pid that was reused since.
    state_dir.mkdir()
    write_state(
        state_dir,
        {"pid": os.getpid(), "start_time": 1.0, "scheduler_address": "tcp://127.0.0.1:1"},
    )
    result = dvml_command("cluster", "status", "--state-dir", str(state_dir), timeout=60)
    assert result.returncode == 1
    assert "stale state file was removed" in one_error_line(result)
    assert not (state_dir / "cluster.json").exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--gpus", "-1"], "GPU counts cannot be negative"),
        (["--gpus", "one"], "--gpus must be"),
        (["--n-workers", "2", "--gpus", "1,1,1"], "one count per worker"),
        (["--vineyard-memory", "lots"], "Received: 'lots'"),
        (["--vineyard-memory", "1PiB"], "/dev/shm"),
    ],
)
def test_up_rejects_bad_arguments(state_dir: pathlib.Path, args: list[str], match: str) -> None:
    result = dvml_command("cluster", "up", "--state-dir", str(state_dir), *args, timeout=60)
    assert result.returncode == 1
    assert match in one_error_line(result)
    assert not state_dir.exists()  # rejected before anything was started or written


def test_debug_shows_the_traceback(state_dir: pathlib.Path) -> None:
    result = dvml_command("--debug", "cluster", "status", "--state-dir", str(state_dir), timeout=60)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "NoClusterError" in result.stderr


def test_up_status_down(state_dir: pathlib.Path) -> None:
    up = dvml_command(
        "cluster", "up", "--state-dir", str(state_dir), "--n-workers", "2", "--hosts", "1",
        "--gpus", "1,0", "--vineyard-memory", "128MiB",
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    state = read_state(state_dir)
    assert state["scheduler_address"] in up.stdout
    assert "worker-0" in up.stdout and "worker-1" in up.stdout
    assert [w["host"] for w in state["workers"]] == ["host-0", "host-0"]
    assert [w["gpus"] for w in state["workers"]] == [1, 0]
    assert len(running(state)) == 6  # serve, etcd, 2 vineyardd, 2 Dask workers
    assert os.path.isdir(state["directory"])

    again = dvml_command("cluster", "up", "--state-dir", str(state_dir), timeout=60)
    assert again.returncode == 1
    assert "already running" in one_error_line(again)

    status = dvml_command("cluster", "status", "--state-dir", str(state_dir), timeout=120)
    assert status.returncode == 0, status.stderr
    assert "worker-0" in status.stdout and "worker-1" in status.stdout
    rows = [line.split() for line in status.stdout.splitlines() if line.startswith("worker-")]
    assert len(rows) == 2 and all("running" in row for row in rows)

    by_address = dvml_command(
        # The scheduler serves TLS: --state-dir is where its certificate is recorded.
        "cluster", "status", "--scheduler", state["scheduler_address"],
        "--state-dir", str(state_dir), timeout=120,
    )  # fmt: skip
    assert by_address.returncode == 0, by_address.stderr
    assert "worker-1" in by_address.stdout

    down = dvml_command("cluster", "down", "--state-dir", str(state_dir), timeout=120)
    assert down.returncode == 0, down.stderr
    assert "Stopped the cluster" in down.stdout
    assert running(state) == []
    assert all(pid_gone(p) for p, _ in recorded_processes(state).values())
    assert not (state_dir / "cluster.json").exists()
    assert not os.path.exists(state["directory"])

    after = dvml_command("cluster", "status", "--state-dir", str(state_dir), timeout=60)
    assert after.returncode == 1
    one_error_line(after)


def test_serve_stops_when_its_state_file_is_removed(state_dir: pathlib.Path) -> None:
    up = dvml_command("cluster", "up", "--state-dir", str(state_dir), "--n-workers", "1")
    assert up.returncode == 0, up.stderr
    state = read_state(state_dir)
    (state_dir / "cluster.json").unlink()
    assert poll_for(lambda: not running(state), 60, interval=0.2), running(state)
    assert not os.path.exists(state["directory"])


def test_down_after_the_serve_process_was_killed(state_dir: pathlib.Path) -> None:
    up = dvml_command("cluster", "up", "--state-dir", str(state_dir), "--n-workers", "1")
    assert up.returncode == 0, up.stderr
    state = read_state(state_dir)
    os.kill(state["pid"], signal.SIGKILL)
    assert poll_for(lambda: pid_gone(state["pid"]), 10)
    # The daemons and workers die with their owner (PR_SET_PDEATHSIG, Dask's own watch).
    assert poll_for(lambda: not running(state), 30), running(state)

    down = dvml_command("cluster", "down", "--state-dir", str(state_dir), "--timeout", "20")
    assert down.returncode == 0, down.stderr
    assert running(state) == []
    assert not (state_dir / "cluster.json").exists()
    assert not os.path.exists(state["directory"])


def test_up_reports_a_cluster_that_fails_to_start(state_dir: pathlib.Path) -> None:
    # A real failure inside the serve process, after etcd and vineyardd started: the Dask
    # dashboard cannot bind an address (TEST-NET-3) that no machine has.
    up = dvml_command(
        "cluster", "up", "--state-dir", str(state_dir), "--n-workers", "1",
        "--dashboard-address", "203.0.113.1:0",
    )  # fmt: skip
    assert up.returncode == 1
    assert up.stderr.startswith("dvml: error: The cluster process exited with code 1")
    assert "dvml.cluster.serve: error:" in up.stderr  # the tail of the serve log
    assert "Cannot assign requested address" in up.stderr
    assert not (state_dir / "cluster.json").exists()
