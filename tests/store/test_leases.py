"""Dataset leases (dvml.store.leases): the pure parts, and leases of real client processes.

The leases live on the Dask scheduler (issue 42, item 6): the holders here are separate
processes with their own Dask client and their own state directory, as a client on another
host or in another user session would be; the checks run from this process, with yet another
state directory.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import dask
import pytest

from dvml.exceptions import DatasetInUseError, LeaseBrokenError
from dvml.store.leases import (
    check_not_leased,
    expired,
    holders,
    holding,
    in_use_message,
    lease_record,
    read_leases,
    unleased,
)
from tests.helpers import REPO, pid_gone, poll_for, tls_environment


def test_lease_record_holders_and_expiry_are_plain_values() -> None:
    a = lease_record(["d1", "d2"], "dvml.fit of model 'm'", "Client-a", 10, "h", 65.0, "t0", "x")
    b = lease_record(["d2"], "other", "Client-b", 11, "h", 65.0, "t1", "y")
    assert a == {"id": "x", "datasets": ["d1", "d2"], "job": "dvml.fit of model 'm'",
                 "client": "Client-a", "pid": 10, "host": "h", "ttl": 65.0, "since": "t0",
                 "broken": None}  # fmt: skip
    assert holders("d1", [a, b]) == [a]
    assert holders("d2", [a, {**b, "broken": "forced"}]) == [a]  # a broken lease holds nothing
    assert holders("d3", [a, b]) == []
    assert expired(a, None) == "its client disconnected"
    assert expired(a, 64.0) is None
    assert "not heard from its client for 66s" in str(expired(a, 66.0))
    message = in_use_message("d1", "drop", [a])
    assert "Cannot drop dataset 'd1'" in message
    assert "dvml.fit of model 'm' (pid 10 on h, Dask client Client-a" in message
    assert "Wait for that job to end" in message
    assert "force=True" in message and "--force" in message


_HOLDER = textwrap.dedent(
    """
    import sys
    from distributed import Client
    from dvml.store.leases import holding
    client = Client(sys.argv[1])
    with holding(["digits"], job=sys.argv[2], client=client):
        print("held", flush=True)
        sys.stdin.readline()  # until the test says so (or kills it)
    client.close()
    print("released", flush=True)
    """
)


@pytest.fixture
def holder_env(cluster2: Any, tmp_path: pathlib.Path) -> dict[str, str]:
    """The environment of a holder process: its own state directory, this cluster's TLS."""
    return {
        **os.environ,
        **tls_environment(cluster2),
        "PYTHONPATH": str(REPO),
        "DASK_DVML__CLUSTER__STATE_DIR": str(tmp_path / "holder-state"),
    }


@pytest.fixture
def own_state(tmp_path: pathlib.Path) -> Iterator[None]:
    """This process uses another state directory than the holders."""
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "checker-state")}):
        yield


def _start_holder(cluster: Any, env: dict[str, str], job: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, cluster.scheduler_address, job],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _stop(holder: subprocess.Popen[str]) -> None:
    if holder.poll() is None:
        holder.kill()  # SIGKILL ends a stopped process too
    holder.wait(timeout=30)


def _free(name: str, client: Any) -> bool:
    try:
        check_not_leased(name, "drop", client=client)
    except DatasetInUseError:
        return False
    return True


@pytest.mark.cluster
def test_a_lease_of_another_client_is_seen_and_ends_with_its_job(
    cluster2: Any, holder_env: dict[str, str], own_state: None
) -> None:
    client = cluster2.client
    holder = _start_holder(cluster2, holder_env, "a fit elsewhere")
    try:
        (lease,) = [r for r in read_leases(client) if r["job"] == "a fit elsewhere"]
        assert lease["pid"] == holder.pid and lease["datasets"] == ["digits"]
        assert lease["client"] != client.id  # the holder's own Dask client
        with pytest.raises(DatasetInUseError, match=rf"a fit elsewhere \(pid {holder.pid} on"):
            check_not_leased("digits", "drop", client=client)
        check_not_leased("other", "drop", client=client)
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        assert holder.wait(timeout=60) == 0
    finally:
        _stop(holder)
    check_not_leased("digits", "drop", client=client)  # the job ended: accepted
    assert [r for r in read_leases(client) if r["job"] == "a fit elsewhere"] == []


@pytest.mark.cluster
def test_a_killed_holder_blocks_nothing(
    cluster2: Any, holder_env: dict[str, str], own_state: None
) -> None:
    client = cluster2.client
    holder = _start_holder(cluster2, holder_env, "a fit that will be killed")
    try:
        assert not _free("digits", client)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        assert poll_for(lambda: pid_gone(holder.pid), 10)
    finally:
        _stop(holder)
    # Its connection closed with it: the scheduler forgets its client, the lease expires.
    assert poll_for(lambda: _free("digits", client), 30)


@pytest.mark.cluster
def test_a_frozen_holder_expires_after_the_client_timeout(
    cluster2: Any, holder_env: dict[str, str], own_state: None
) -> None:
    """A holder still connected but silent (a host cut off, a frozen process) stops holding
    once the scheduler has not heard from it for train.client-timeout + GRACE seconds."""
    client = cluster2.client
    env = {**holder_env, "DASK_DVML__TRAIN__CLIENT_TIMEOUT": "1"}  # its lease's ttl: 6 s
    holder = _start_holder(cluster2, env, "a frozen fit")
    try:
        os.kill(holder.pid, signal.SIGSTOP)  # its heartbeats stop, its connection stays
        assert not _free("digits", client)
        assert poll_for(lambda: _free("digits", client), 60, interval=1)
    finally:
        _stop(holder)


@pytest.mark.cluster
def test_a_forced_drop_breaks_the_lease_and_the_job_fails(cluster2: Any, own_state: None) -> None:
    client = cluster2.client
    broken = pytest.raises(LeaseBrokenError, match=r"my reader read datasets \['digits'\]")
    # Leaving the block checks too: the job cannot end as if nothing happened.
    with broken as info, holding(["digits"], job="my reader", client=client) as lease:
        assert lease.names == ["digits"]
        with unleased("digits", "drop", force=True, client=client):
            pass  # the drop would run here
        with pytest.raises(LeaseBrokenError, match="a drop with force=True from pid"):
            lease.check()
    assert "nothing was registered" in str(info.value)
    assert _free("digits", client)  # the broken lease was given back


_LEASER = textwrap.dedent(
    """
    import sys
    from distributed import Client
    from dvml.store.leases import holding
    client = Client(sys.argv[1])
    print("connected", flush=True)
    sys.stdin.readline()  # the test's drop holds its claim now
    with holding(["digits"], job="late fit", client=client):
        print("leased", flush=True)
    client.close()
    """
)


@pytest.mark.cluster
def test_a_job_cannot_lease_a_dataset_while_it_is_being_dropped(
    cluster2: Any, holder_env: dict[str, str], own_state: None
) -> None:
    late = subprocess.Popen(
        [sys.executable, "-c", _LEASER, cluster2.scheduler_address],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=holder_env,
    )  # fmt: skip
    try:
        assert late.stdin is not None and late.stdout is not None
        assert late.stdout.readline().strip() == "connected"
        # It asks for its lease only once the drop holds its claim (else it could lease first
        # and the drop be refused), then waits for the drop, so it still runs while the block runs.
        waits = pytest.raises(subprocess.TimeoutExpired)
        with unleased("digits", "drop", client=cluster2.client), waits:
            late.stdin.write("go\n")
            late.stdin.flush()
            late.wait(timeout=3)
        assert late.stdout.readline().strip() == "leased"
        assert late.wait(timeout=60) == 0
    finally:
        _stop(late)
