"""Dataset leases (dvml.store.leases): the pure parts, and leases of real processes."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from dvml.exceptions import DatasetInUseError
from dvml.store.leases import (
    check_not_leased,
    holders,
    holding,
    in_use_message,
    lease_record,
    read_leases,
    unleased,
)
from tests.helpers import REPO, pid_gone, poll_for


def test_lease_record_and_holders_are_plain_values() -> None:
    a = lease_record(["d1", "d2"], "dvml.fit of model 'm'", 10, "h", 1.5, "2026-01-01T00:00:00")
    b = lease_record(["d2"], "other", 11, "h", None, "2026-01-01T00:00:01")
    assert a == {"datasets": ["d1", "d2"], "job": "dvml.fit of model 'm'", "pid": 10,
                 "host": "h", "start_time": 1.5, "since": "2026-01-01T00:00:00"}  # fmt: skip
    assert holders("d1", [a, b], lambda r: True) == [a]
    assert holders("d2", [a, b], lambda r: r["pid"] == 11) == [b]
    assert holders("d3", [a, b], lambda r: True) == []
    message = in_use_message("d1", "drop", [a])
    assert "Cannot drop dataset 'd1'" in message
    assert "dvml.fit of model 'm' (pid 10 on h" in message
    assert "force=True" in message and "--force" in message


def test_holding_writes_an_owner_only_lease_and_removes_it(tmp_path: pathlib.Path) -> None:
    with holding(["train", None, "val"], job="a fit", state_dir=tmp_path) as names:
        assert names == ["train", "val"]
        (lease,) = read_leases(tmp_path)
        assert lease["job"] == "a fit" and lease["pid"] == os.getpid()
        assert lease["host"] == socket.gethostname()
        files = list((tmp_path / "leases").glob("*.json"))
        assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "leases").stat().st_mode) == 0o700
        with pytest.raises(DatasetInUseError, match=r"Cannot drop dataset 'train'.*a fit"):
            check_not_leased("train", "drop", state_dir=tmp_path)
        check_not_leased("train", "drop", force=True, state_dir=tmp_path)
        check_not_leased("other", "drop", state_dir=tmp_path)
    assert read_leases(tmp_path) == []
    check_not_leased("train", "drop", state_dir=tmp_path)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from dvml.store.leases import holding
    with holding(["digits"], job="a fit that will be killed", state_dir=sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_a_killed_holder_blocks_nothing(tmp_path: pathlib.Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        # Another process's live lease is seen, and names the job and its pid.
        with pytest.raises(DatasetInUseError, match=rf"killed \(pid {holder.pid} on"):
            check_not_leased("digits", "overwrite", state_dir=tmp_path)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        assert poll_for(lambda: pid_gone(holder.pid), 10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    check_not_leased("digits", "drop", state_dir=tmp_path)  # its file is ignored...
    assert list((tmp_path / "leases").glob("*.json")) == []  # ...and removed


def test_a_lease_from_another_host_counts_as_held(tmp_path: pathlib.Path) -> None:
    (tmp_path / "leases").mkdir(mode=0o700)
    record = lease_record(["d"], "a fit elsewhere", 1, "some-other-host", None, "now")
    (tmp_path / "leases" / "1-x.json").write_text(json.dumps(record))
    with pytest.raises(DatasetInUseError, match="some-other-host"):
        check_not_leased("d", "drop", state_dir=tmp_path)


_LEASER = textwrap.dedent(
    """
    import sys
    from dvml.store.leases import holding
    with holding(["digits"], job="late fit", state_dir=sys.argv[1]):
        print("leased", flush=True)
    """
)


def test_a_job_cannot_lease_a_dataset_while_it_is_being_dropped(tmp_path: pathlib.Path) -> None:
    with unleased("digits", "drop", state_dir=tmp_path):
        late = subprocess.Popen(
            [sys.executable, "-c", _LEASER, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            # It waits for the drop (the lock), so it is still running while the block runs.
            assert late.wait(timeout=3) is None
        except subprocess.TimeoutExpired:
            pass
        assert late.poll() is None, "a job took its lease in the middle of a drop"
    assert late.stdout is not None and late.stdout.readline().strip() == "leased"
    assert late.wait(timeout=60) == 0
