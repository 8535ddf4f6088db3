"""dvml.cluster.pinned: a task is redone only when its worker really restarted (#13 item 11).

The spurious ``worker worker-1 restarted as <its own address>`` came from reading a future's
status twice: ``"pending"`` at the first reading, ``"finished"`` at the second, so the task
fell through to the restart branch although its worker never left. The decision is now one
pure function of one reading and of the worker's identity (address and server id).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import dvml
from dvml.cluster import pinned
from dvml.cluster.pinned import NannyWatch, live_identities, pinned_step, run_pinned
from dvml.exceptions import ClusterError
from tests.helpers import poll_for

A = ("tcp://127.0.0.1:4000", "worker-id-a")


@pytest.mark.parametrize(
    ("status", "now", "step"),
    [
        ("finished", A, "done"),
        ("finished", None, "done"),
        ("pending", A, "wait"),
        # The status moved on between two readings: still the same worker, not a restart.
        ("lost", A, "wait"),
        ("error", A, "failed"),
        ("cancelled", A, "failed"),
        ("pending", None, "gone"),
        ("error", None, "gone"),
        # Same address, another process (a worker restarted on a fixed port): a restart.
        ("pending", (A[0], "worker-id-b"), "restarted"),
        ("error", ("tcp://127.0.0.1:4001", "worker-id-c"), "restarted"),
    ],
)
def test_pinned_step(status: str, now: tuple[str, str] | None, step: str) -> None:
    assert pinned_step(status, A, now) == step


@pytest.mark.cluster
def test_only_a_real_restart_redoes_a_task(
    local_cluster: Callable[..., dvml.LocalCluster], caplog: Any
) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="64MiB")
    client = cluster.client
    targets = cluster.refresh()
    calls: list[tuple[int, int]] = []

    def quick(i: int, address: str, attempt: int) -> Any:
        calls.append((i, attempt))
        return client.submit(int, i, workers=[address], allow_other_workers=False, pure=False)

    # Many short runs on live workers: every task done once, no warning.
    with caplog.at_level(logging.WARNING, logger="dvml.cluster"):
        for _ in range(20):
            assert run_pinned(client, quick, targets, "checking") == [0, 1]
    assert not [r for r in caplog.records if "restarted" in r.getMessage()]
    assert {attempt for _, attempt in calls} == {1}

    # worker-1 killed while it runs its task: redone once, on the restarted process.
    before = live_identities(client)["worker-1"]
    pid = cluster.processes()["dask worker worker-1"]

    def slow(i: int, address: str, attempt: int) -> Any:
        delay = 30.0 if (i, attempt) == (1, 1) else 0.0
        return client.submit(time.sleep, delay, workers=[address], allow_other_workers=False,
                             pure=False)  # fmt: skip

    def kill_when_running() -> None:
        address = before[0]
        assert poll_for(lambda: bool(client.processing(workers=[address]).get(address)), 60)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_running)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dvml.cluster"):
        killer.start()
        started = time.monotonic()
        assert run_pinned(client, slow, targets, "checking") == [None, None]
        killer.join()
    assert time.monotonic() - started < 30  # the lost task did not run to its end
    after = live_identities(client)["worker-1"]
    assert after != before
    warned = [r.getMessage() for r in caplog.records if "restarted" in r.getMessage()]
    assert warned == [f"worker worker-1 restarted as {after[0]}: redoing checking task 1"]


@pytest.mark.cluster
def test_a_departed_worker_whose_nanny_stays_silent_fails_after_the_grace(
    local_cluster: Callable[..., dvml.LocalCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="64MiB")
    client = cluster.client
    targets = cluster.refresh()
    # The watch knows every target's Nanny, and the probe (TLS) finds them all.
    watch = NannyWatch(client, targets)
    assert sorted(watch.nannies) == sorted(t.name for t in targets)
    assert all(watch.answers(address) for address in watch.nannies.values())
    watch.check_targets("checking")  # every target connected: nothing to ask

    # A Nanny that stops answering fails the call once the grace has passed, not before; one
    # answer in between starts the grace again (a supervisor restarting the worker).
    monkeypatch.setattr(pinned, "NANNY_GONE_AFTER", 0.5)
    answering = {"now": False}
    silent = NannyWatch(client, targets, answers=lambda address: answering["now"])
    silent.check("worker-1", "checking")
    time.sleep(0.6)
    answering["now"] = True
    silent.check("worker-1", "checking")
    answering["now"] = False
    silent.check("worker-1", "checking")
    time.sleep(0.6)
    with pytest.raises(ClusterError, match="left the cluster during checking") as info:
        silent.check("worker-1", "checking")
    assert watch.nannies["worker-1"] in str(info.value)
    assert "will not come back" in str(info.value)
    silent.check("not-a-target", "checking")  # no Nanny known: waited for as before
