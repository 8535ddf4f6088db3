"""A writer's marker beside the allocation lock tells a cleanup whether to sweep (issue 17).

The lock and its markers are files beside the vineyardd's socket; no daemon is needed here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import types
from pathlib import Path

from dvml.store.tensors import allocation_lock, clear_writer_markers, writers_died

_DIES_INSIDE = """
import sys, time, types
from dvml.store.tensors import allocation_lock

with allocation_lock(types.SimpleNamespace(ipc_socket=sys.argv[1])):
    print("inside", flush=True)
    time.sleep(600)
"""


def test_a_live_writer_leaves_no_marker(tmp_path: Path) -> None:
    client = types.SimpleNamespace(ipc_socket=str(tmp_path / "vineyard.sock"))
    with allocation_lock(client) as held:
        assert held
        assert len(list(tmp_path.glob("*.writer.*"))) == 1  # its marker, while inside
    with allocation_lock(client, exclusive=True):
        assert writers_died(client) == []


def test_a_writer_killed_inside_its_window_leaves_its_marker(tmp_path: Path) -> None:
    socket = str(tmp_path / "vineyard.sock")
    client = types.SimpleNamespace(ipc_socket=socket)
    proc = subprocess.Popen([sys.executable, "-c", _DIES_INSIDE, socket], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "inside"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    # The kernel dropped its lock: the sweep gets the lock at once and finds the marker.
    with allocation_lock(client, exclusive=True) as held:
        assert held
        markers = writers_died(client)
        assert len(markers) == 1 and f".writer.{proc.pid}." in markers[0]
        clear_writer_markers(markers)
    with allocation_lock(client, exclusive=True):
        assert writers_died(client) == []


def test_no_lock_file_no_markers(tmp_path: Path) -> None:
    client = types.SimpleNamespace(ipc_socket=str(tmp_path / "missing" / "vineyard.sock"))
    with allocation_lock(client) as held:
        assert not held
    assert writers_died(client) == []


def test_a_writer_that_cannot_leave_a_marker_still_writes(tmp_path: Path) -> None:
    # The lock's name fits in a directory entry (255 bytes) but the marker's does not: the
    # writer holds the lock and goes on without a marker (as in a directory it may not write).
    client = types.SimpleNamespace(ipc_socket=str(tmp_path / ("s" * 220)))
    with allocation_lock(client) as held:
        assert held
        assert list(tmp_path.iterdir()) == [tmp_path / ("s" * 220 + ".dvml-alloc.lock")]
