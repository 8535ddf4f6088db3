"""dvml on several network hosts: a cluster of Linux network namespaces on a private bridge.

One module-scoped cluster (dvml.cluster.netns, started with the cluster/ recipes): a head
namespace with etcd and the Dask scheduler, two worker-host namespaces with one vineyardd and
one Dask worker each. Clients run inside the head namespace (tests/cluster/netns_client.py)
and print JSON that these tests assert on. After the module, nothing of the cluster may be
left: no namespace, link, process or file.

Needs root: without it every test here is skipped with the reason (and a warning).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import pid_gone

from dvml.cluster import netns

pytestmark = [pytest.mark.cluster, pytest.mark.netns]

CLIENT = pathlib.Path(__file__).with_name("netns_client.py")


def _reason() -> str | None:
    reason = netns.unavailable_reason()
    if reason:
        warnings.warn(f"multi-host namespace tests SKIPPED: {reason}", stacklevel=1)
    return reason


@pytest.fixture(scope="module")
def cluster() -> Iterator[netns.NetnsCluster]:
    reason = _reason()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    c = netns.NetnsCluster(hosts=2, workers_per_host=1, vineyard_memory="256MiB")
    try:
        c.up()
        yield c
    finally:
        seen = [p["pid"] for p in c.processes()]
        problems = c.down()
        # The leak check of the whole module: nothing of this cluster survives it.
        assert problems == [], problems
        assert netns.leftovers(c.id, c.workdir) == []
        assert all(pid_gone(pid) for pid in seen), [p for p in seen if not pid_gone(p)]


def client(cluster: netns.NetnsCluster, command: str, timeout: float = 600, **args: Any) -> Any:
    out = cluster.run_client(
        [sys.executable, str(CLIENT), command, cluster.scheduler_address, json.dumps(args)],
        timeout=timeout,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("DVML-RESULT ")]
    assert out.returncode == 0 and lines, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[-1].removeprefix("DVML-RESULT "))


def test_every_daemon_listens_on_its_own_namespace_address(
    cluster: netns.NetnsCluster,
) -> None:
    head = cluster.head
    listeners = netns.listening(head["namespace"])
    assert {(r["address"], r["port"]) for r in listeners} == {
        (head["address"], p) for p in (2379, 2380, 8786, 8787)
    }
    for host in cluster.hosts:
        rows = netns.listening(host["namespace"])
        # A worker and its Nanny (vineyardd has RPC off and listens on its socket only).
        assert len(rows) >= 2
        assert {r["address"] for r in rows} == {host["address"]}, rows


def test_namespaces_have_loopback_up_and_no_way_out(cluster: netns.NetnsCluster) -> None:
    for ns in cluster.namespaces:
        lo = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "lo"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
        assert "UP" in lo.split("<", 1)[1].split(">", 1)[0]
        routes = subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True,
                                check=True).stdout  # fmt: skip
        assert "default" not in routes  # only the bridge subnet is reachable


def test_workers_see_two_hosts_each_with_its_own_vineyardd(cluster: netns.NetnsCluster) -> None:
    result = client(cluster, "workers", timeout=120)
    table = result["table"]
    addresses = {h["address"] for h in cluster.hosts}
    assert {row["host"] for row in table} == addresses
    for row in table:
        host = next(h for h in cluster.hosts if h["address"] == row["host"])
        # The worker listens on its host's address, uses its host's socket and daemon.
        assert row["address"].startswith(f"tcp://{host['address']}:")
        assert row["vineyard_socket"] == host["socket"]
        assert row["vineyard_socket"].startswith(host["socket_dir"] + "/")
        assert row["vineyard_instance_id"] == host["instance_id"]
    assert len({row["vineyard_instance_id"] for row in table}) == 2
    for address, ident in result["identity"].items():
        host = next(h for h in cluster.hosts if address.startswith(f"tcp://{h['address']}:"))
        assert ident["socket"] == host["socket"] and ident["dvml_host"] == host["address"]
        assert ident["instance_id"] == host["instance_id"]
        # vineyardd advertises the namespace address (MY_HOST_NAME), not the shared hostname.
        assert ident["advertised"] == host["address"]
        # Both daemons joined the same etcd: one vineyard cluster of two instances.
        assert sorted(ident["instances"]) == sorted(h["instance_id"] for h in cluster.hosts)
    assert result["gpu_configuration"] == []  # no GPU declared or found on these hosts


def test_status_and_state_file(cluster: netns.NetnsCluster) -> None:
    status = cluster.status()
    assert set(status["namespaces"]) == set(cluster.namespaces)
    again = netns.NetnsCluster.from_state(cluster.state_path)
    assert again.id == cluster.id and again.processes() == cluster.processes()
    assert os.stat(cluster.workdir).st_mode & 0o777 == 0o700
