"""The namespace cluster with Dask over TLS: client, scheduler and workers all use tls://.

Certificates are generated for the test (a CA and one certificate it signed). A client run
with them in the head namespace works as over TCP (workers, placement object by object); a
client without them is refused. Skipped, with the reason, without root.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dvml.testing import netns
from tests.helpers import netns_client, running_netns_cluster, tensors_by_instance

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.serial]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_netns_cluster(
        hosts=2, workers_per_host=1, vineyard_memory="128MiB", tls=True
    ) as c:
        yield c


def test_tls_end_to_end(cluster: netns.NetnsCluster) -> None:
    assert cluster.scheduler_address.startswith("tls://")
    result = netns_client(cluster, "workers", timeout=120)
    assert {row["host"] for row in result["table"]} == {h["address"] for h in cluster.hosts}
    assert all(row["address"].startswith("tls://") for row in result["table"])
    placed = netns_client(cluster, "placement", timeout=300)
    held = tensors_by_instance(placed["vineyard"])
    for b in placed["datasets"]["all"]:
        assert {b["x_0_id"], b["y_id"]} <= held[b["vineyard_instance_id"]]
    for host in cluster.hosts:
        assert {r["address"] for r in netns.listening(host["namespace"])} == {host["address"]}


def test_a_client_without_the_certificates_is_refused(cluster: netns.NetnsCluster) -> None:
    code = (
        "import sys, distributed\n"
        "try:\n"
        f"    distributed.Client({cluster.scheduler_address.replace('tls', 'tcp')!r}, timeout=5)\n"
        "except Exception as exc:\n"
        "    print('refused', type(exc).__name__); sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    plain = {
        k: "" for k in cluster.env() if k.startswith("DASK_DISTRIBUTED__COMM__")
    }  # no certificates, no TLS
    out = cluster.run_client([sys.executable, "-c", code], timeout=60, env=plain)
    assert out.returncode == 0 and "refused" in out.stdout, out.stdout + out.stderr
