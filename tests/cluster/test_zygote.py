"""The zygote (dvml.cluster.zygote) with a child of its own instead of a trainer: forks with the
requester's stdio, environment and directory, exit statuses through the zygote, one zygote
for concurrent starters, its end once nobody holds it, and a private socket directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dvml.cluster import zygote
from dvml.exceptions import ClusterError
from tests.helpers import child_processes, pid_gone, poll_for

# The zygote under test: prepare() marks that it ran (once per zygote); each child echoes
# what it is, then the lines of its stdin, and exits with the number on the line "exit N".
_SERVER = """
import os, sys, time
from dvml.cluster import zygote

time.sleep(float(os.environ.get("BIND_DELAY", "0")))  # a loaded machine's slow start

def prepare():
    with open(sys.argv[1] + ".prepared", "a") as f:
        f.write(f"{os.getpid()}\\n")

def child():
    print(os.getcwd(), os.environ.get("ECHO"), os.environ[zygote.PARENT_ENV], os.getsid(0),
          flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    for line in sys.stdin:
        if line.startswith("exit "):
            return int(line.split()[1])
        print("echo", line.strip(), flush=True)
    return 0

sys.exit(zygote.serve(sys.argv[1], prepare, child))
"""


@pytest.fixture
def machine(tmp_path: Path) -> Any:
    """A Zygote handle on a private directory; the zygote it starts is stopped afterwards."""
    path = _private_socket(tmp_path)
    handle = zygote.Zygote(path, [sys.executable, "-c", _SERVER], dict(os.environ))
    yield handle
    handle.close()
    for pid in _zygote_pids(path):
        assert poll_for(lambda pid=pid: pid_gone(pid), 10), "the zygote outlived its holders"


def _private_socket(tmp_path: Path) -> str:
    """A zygote socket path in a new owner-only directory."""
    directory = tmp_path / "z"
    directory.mkdir(mode=0o700)
    return zygote.socket_path({zygote.ZYGOTE_DIR_ENV: str(directory)})


def _running_fork(handle: Any, cwd: Path) -> tuple[Any, int]:
    """A fork that has started (it said who it is), and the pid of its zygote."""
    proc = _fork(handle, cwd)
    proc.stdout.readline()
    (pid,) = _zygote_pids(handle.path)
    return proc, pid


def _zygote_pids(path: str) -> list[int]:
    try:
        with open(path + ".prepared") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(") ", 1)[1].split()[1])


def _fork(handle: Any, cwd: Path, stderr: int | None = None, **env: str) -> Any:
    return handle.fork({**os.environ, **env}, str(cwd), stderr, timeout=60)


def test_a_fork_gets_the_requesters_stdio_environment_and_directory(
    machine: Any, tmp_path: Path
) -> None:
    errors = tmp_path / "stderr"
    with open(errors, "w") as f:
        proc = _fork(machine, tmp_path, f.fileno(), ECHO="hello")
    try:
        cwd, echo, parent, session = proc.stdout.readline().split()
        assert (cwd, echo, int(parent)) == (str(tmp_path), "hello", os.getpid())
        assert int(session) == proc.pid  # its own session: stopped as a process group
        proc.stdin.write("one\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "echo one\n"
        assert proc.poll() is None
        proc.stdin.write("exit 3\n")
        proc.stdin.flush()
        assert proc.wait(30) == 3  # its exit status, from the zygote that reaped it
        assert proc.poll() == 3
        assert errors.read_text() == "to stderr\n"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_killed_fork_reports_its_signal_and_a_closed_stdin_ends_it(
    machine: Any, tmp_path: Path
) -> None:
    killed = _fork(machine, tmp_path)
    ended = _fork(machine, tmp_path)
    assert killed.stdout.readline() and ended.stdout.readline()
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(0.2)
    os.killpg(killed.pid, signal.SIGKILL)
    assert killed.wait(30) == -signal.SIGKILL  # as subprocess.Popen says it
    ended.stdin.close()  # what a killed worker's pipes do
    assert ended.wait(30) == 0
    # Both came from one zygote, which prepared once.
    assert len(_zygote_pids(machine.path)) == 1


def test_concurrent_starters_share_one_zygote(machine: Any, tmp_path: Path) -> None:
    other = zygote.Zygote(machine.path, machine.command, machine.env)  # a second worker
    procs: list[Any] = []

    def fork(handle: Any) -> None:
        procs.append(_fork(handle, tmp_path))

    threads = [threading.Thread(target=fork, args=(h,)) for h in (machine, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert len(procs) == 2
        parents = {_parent(p.pid) for p in procs}
        assert len(parents) == 1  # one zygote forked both
        assert len(_zygote_pids(machine.path)) == 1  # and only one imported
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(30)
        other.close()


def test_a_zygote_started_again_while_the_first_was_slow_does_not_linger(
    tmp_path: Path,
) -> None:
    # The starter tries again after 2 s without a listener; the first then binds and serves.
    path = _private_socket(tmp_path)
    env = {**os.environ, "BIND_DELAY": "3"}
    handle = zygote.Zygote(path, [sys.executable, "-c", _SERVER], env)
    try:
        proc, pid = _running_fork(handle, tmp_path)
        # The second starter was stopped: no zygote but the one that serves waits to bind
        # once it has ended (and would then run, unused, for a minute).
        zygotes = [p for p, cmd in child_processes().items() if "zygote.serve" in cmd]
        assert [p for p in zygotes if _parent(p) == os.getpid()] == [pid]
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        handle.close()
    assert poll_for(lambda: pid_gone(pid), 10)
    assert _zygote_pids(path) == [pid]


def test_the_zygote_ends_once_nobody_holds_it_and_its_forks_ended(
    machine: Any, tmp_path: Path
) -> None:
    proc, pid = _running_fork(machine, tmp_path)
    machine.close()  # the worker lets go, but a fork still runs: the zygote stays
    assert not poll_for(lambda: pid_gone(pid), 1.5)
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert poll_for(lambda: pid_gone(pid), 10)
    assert not os.path.exists(machine.path)  # its socket went with it


def test_a_fork_outliving_its_zygote_still_ends_and_says_its_status_is_lost(
    machine: Any, tmp_path: Path
) -> None:
    proc, pid = _running_fork(machine, tmp_path)
    os.kill(pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid), 10)
    assert proc.poll() is None  # still runs
    proc.stdin.close()
    assert proc.wait(30) == zygote.EXIT_UNKNOWN


def test_a_fork_that_died_with_its_zygote_is_seen_dead_at_the_first_poll(
    machine: Any, tmp_path: Path
) -> None:
    # A standby trainer whose machine's zygote was killed with it (a crashed worker host):
    # take_standby polls it once before handing it a job. That first poll read the zygote's
    # closed socket, said "still runs", and a job was handed to a dead trainer.
    proc, pid = _running_fork(machine, tmp_path)
    os.kill(pid, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGKILL)
    assert poll_for(lambda: pid_gone(pid) and pid_gone(proc.pid), 10)
    assert proc.poll() == zygote.EXIT_UNKNOWN


def test_the_socket_directory_must_be_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with pytest.raises(ClusterError, match="accessible only to it"):
        zygote.socket_path({zygote.ZYGOTE_DIR_ENV: str(shared)})
    # The name depends on the trainers' network namespace: one zygote per namespace.
    private = tmp_path / "private"
    environ = {zygote.ZYGOTE_DIR_ENV: str(private)}
    assert zygote.socket_path(environ, "root:1") != zygote.socket_path(environ, "root:2")
    assert oct(private.stat().st_mode & 0o777) == "0o700"


def test_a_zygote_that_cannot_start_fails_the_request_at_once(tmp_path: Path) -> None:
    path = _private_socket(tmp_path)
    broken = [sys.executable, "-c", "import sys; print('no TensorFlow here'); sys.exit(3)"]
    handle = zygote.Zygote(path, broken, dict(os.environ))
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"exited with code 3[\s\S]*no TensorFlow here"):
        handle.fork(dict(os.environ), str(tmp_path), None, timeout=60)
    assert time.monotonic() - started < 30  # not after the whole timeout


def test_a_zygote_whose_import_fails_fails_the_request(tmp_path: Path) -> None:
    path = _private_socket(tmp_path)
    failing = _SERVER.replace("def prepare():", "def prepare():\n    raise ImportError('no tf')")
    handle = zygote.Zygote(path, [sys.executable, "-c", failing], dict(os.environ))
    started = time.monotonic()
    try:
        with pytest.raises(ClusterError, match="zygote"):
            handle.fork(dict(os.environ), str(tmp_path), None, timeout=60)
    finally:
        handle.close()
    assert time.monotonic() - started < 30
    assert "ImportError: no tf" in Path(path + ".log").read_text()
    assert not os.path.exists(path)  # no dead socket left for the next starter
