"""The runtime's watcher probe against real distributed TLS listeners: found, and quiet."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest

from dvml.cluster.probe import probe_context, reachable
from dvml.cluster.workers import discover_workers
from dvml.train.runtime.watcher import departed_workers


def test_a_probe_of_a_tls_listener_completes_the_handshake(
    cluster2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A distributed TLS listener in this process, with the cluster's certificates: a bare
    TCP probe makes it log "TLS handshake failed" each time; the watcher's does not."""
    from distributed.comm import listen

    security = cluster2.security
    tls = probe_context(cluster2.client)
    assert tls is not None

    async def probe_twice() -> list[bool]:
        async def handler(comm: Any) -> None:
            await comm.close()

        listener = listen("tls://127.0.0.1:0", handler, **security.get_listen_args("worker"))
        await listener.start()
        try:
            loop = asyncio.get_running_loop()
            found = [
                await loop.run_in_executor(None, reachable, listener.contact_address, 3.0, tls)
                for _ in range(2)
            ]
            await asyncio.sleep(0.5)  # the listener handles (and would log) the connections
            return found
        finally:
            listener.stop()

    with caplog.at_level(logging.DEBUG, logger="distributed"):
        assert asyncio.run(probe_twice()) == [True, True]
    assert not [r for r in caplog.records if "handshake failed" in r.getMessage()]


def test_live_workers_are_not_gone_and_a_closed_port_is(cluster2: Any) -> None:
    client = cluster2.client
    workers = discover_workers(client)
    assert all(w.address.startswith("tls://") for w in workers)
    assert departed_workers(client, workers, wait=0.0) == []
    closed = dataclasses.replace(workers[0], address=workers[0].address.rsplit(":", 1)[0] + ":1")
    assert departed_workers(client, [closed], wait=0.0, probe_timeout=1.0) == [closed]


async def _leases_on_the_loop(dask_worker: Any, client_id: str) -> list[str | None]:
    """On a worker's event loop, as ``client.run`` runs functions: a lease of ``client_id``."""
    from dvml.train.runtime.supervisor import ClientLease

    lease = ClientLease(dask_worker, client_id, 30.0)
    return [await lease.lost_now()]


def test_a_lease_is_asked_on_the_workers_loop_as_client_run_does(cluster2: Any) -> None:
    """``stop_orphaned_sessions`` (run by ``client.run`` when a workflow recovers) asks its
    leases on the worker's event loop, where the worker's client answers with a coroutine:
    it used to compare that coroutine with the timeout and fail with a TypeError, on every
    worker, leaving orphaned trainers to their leases."""
    import inspect

    from dvml.train.runtime.sessions import stop_orphaned_sessions

    client = cluster2.client
    assert inspect.iscoroutinefunction(stop_orphaned_sessions)
    gone = client.run(_leases_on_the_loop, client_id="no-such-client")
    assert len(gone) == 2
    assert all("went away (disconnected)" in str(v[0]) for v in gone.values()), gone
    alive = client.run(_leases_on_the_loop, client_id=client.id)
    assert all(v == [None] for v in alive.values()), alive
    # The cluster is shared: earlier tests may have left sessions whose client is gone (their
    # leases stop them within seconds). The first call stops those; the second finds none.
    first = client.run(stop_orphaned_sessions)
    assert all(isinstance(v, list) and all(isinstance(j, str) for j in v) for v in first.values())
    assert all(v == [] for v in client.run(stop_orphaned_sessions).values()), first
