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
