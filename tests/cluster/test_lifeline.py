"""Children that die with their owner, proven identities, the sweep, the state lock (#16: 8, 14).

Real processes, no cluster: quick.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from dvml.cluster.health import endpoint_answers, unix_socket_answers
from dvml.cluster.lifeline import (
    OWNER_FILE,
    identity_of,
    is_same_process,
    spawn,
    sweep_dead_clusters,
    write_owner,
)
from dvml.cluster.processes import ManagedProcess, free_port
from dvml.cluster.state import state_lock
from dvml.exceptions import LockHeldError
from tests.helpers import REPO, pid_gone, poll_for


def test_a_spawned_child_outlives_the_thread_that_asked_for_it(tmp_path: pathlib.Path) -> None:
    # PR_SET_PDEATHSIG fires when the forking THREAD exits: a daemon started from a short-lived
    # start thread must survive that thread (LocalCluster starts vineyardds from one).
    started: list[ManagedProcess] = []
    thread = threading.Thread(
        target=lambda: started.append(ManagedProcess("sleep", ["sleep", "60"], str(tmp_path / "l")))
    )
    thread.start()
    thread.join()
    try:
        time.sleep(0.5)
        assert started[0].alive()
    finally:
        started[0].stop()


CHILD_OWNER = """
import sys, time
from dvml.cluster.lifeline import spawn
child = spawn(["sleep", "120"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_spawned_child_dies_with_its_owner() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", CHILD_OWNER], stdout=subprocess.PIPE, text=True, env=env
    )
    child = 0
    try:
        child = int(owner.stdout.readline()) if owner.stdout else 0
        assert child and not pid_gone(child)
    finally:
        owner.kill()
        owner.wait()
    try:
        assert poll_for(lambda: pid_gone(child), 10), "the child outlived its SIGKILLed owner"
    finally:
        if child and not pid_gone(child):
            os.kill(child, signal.SIGKILL)


def test_identity_needs_pid_start_time_and_command_line() -> None:
    me = identity_of(os.getpid())
    assert me is not None and is_same_process(me)
    assert not is_same_process({**me, "start_time": me["start_time"] - 60})
    assert not is_same_process({**me, "cmdline": ["something", "else"]})
    assert not is_same_process({"pid": me["pid"], "start_time": me["start_time"]})
    assert not is_same_process({"pid": me["pid"]})
    assert not is_same_process({"pid": 1, "start_time": 0.0, "cmdline": ["init"]})
    assert not is_same_process(None)


def test_sweep_removes_only_directories_of_dead_owners(tmp_path: pathlib.Path) -> None:
    dead = subprocess.Popen(["sleep", "30"])
    # Until its exec is done a child's command line is empty (1 in ~300 here right after
    # Popen): such an identity proves nothing, and the sweep rightly leaves its directory alone.
    assert poll_for(lambda: (identity_of(dead.pid) or {}).get("cmdline") == ["sleep", "30"], 10)
    dead_identity = identity_of(dead.pid)
    dead.kill()
    dead.wait()
    gone = tmp_path / "dvml-cluster-gone"
    alive = tmp_path / "dvml-cluster-alive"
    unknown = tmp_path / "dvml-cluster-unknown"  # no owner.json: not provably dead
    other = tmp_path / "not-a-cluster"
    for d in (gone, alive, unknown, other):
        d.mkdir()
    (gone / OWNER_FILE).write_text(json.dumps(dead_identity))
    (other / OWNER_FILE).write_text(json.dumps(dead_identity))
    write_owner(str(alive))
    assert sweep_dead_clusters(str(tmp_path), min_age=0.0) == [str(gone)]
    assert not gone.exists() and alive.is_dir() and unknown.is_dir() and other.is_dir()


def test_connect_probes_tell_dead_from_alive(tmp_path: pathlib.Path) -> None:
    port = free_port()
    assert not endpoint_answers(f"http://127.0.0.1:{port}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert endpoint_answers(f"http://127.0.0.1:{port}")
        assert endpoint_answers(f"127.0.0.1:{port}")
    path = str(tmp_path / "s.sock")
    assert not unix_socket_answers(path)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        assert unix_socket_answers(path)
        assert endpoint_answers(f"unix://{path}")
    assert not unix_socket_answers(path)  # a socket file that nobody listens on any more


def test_state_lock_is_exclusive(tmp_path: pathlib.Path) -> None:
    match = "Another `dvml cluster up` is starting"
    with state_lock(tmp_path), pytest.raises(LockHeldError, match=match), state_lock(tmp_path):
        pass
    with state_lock(tmp_path):  # released
        pass


def test_spawn_reports_a_missing_program() -> None:
    with pytest.raises(FileNotFoundError):
        spawn(["/nonexistent/dvml-no-such-program"])
