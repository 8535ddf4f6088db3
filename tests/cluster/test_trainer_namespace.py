"""A LocalCluster's trainers run in its private network namespace (etcd's), not the machine's.

TensorFlow's gRPC server (MultiWorkerMirroredStrategy, the collectives of model averaging)
listens on every interface with no option to choose one; inside the cluster's namespace the
only interface is its loopback. Every fit, fit_multiple and dvml.run test on a LocalCluster
trains inside it; this one checks where the trainer processes are.
"""

from __future__ import annotations

import os
from typing import Any

from dvml.cluster import standby
from dvml.cluster.isolation import TRAINER_NAMESPACE_ENV, trainer_prefix
from tests.helpers import poll_for


def _namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_trainers_start_inside_the_clusters_network_namespace(cluster2: Any) -> None:
    client = cluster2.client
    assert cluster2.etcd_socket is not None, "this cluster has no private namespace"
    private = _namespace(cluster2.etcd.pid)
    assert private != _namespace(os.getpid())
    client.run(standby.start_standby)

    def standbys() -> dict[str, int | None]:
        return client.run(standby.standby_pid)  # type: ignore[no-any-return]

    assert poll_for(lambda: all(standbys().values()), 60), standbys()
    pids = standbys()
    assert len(pids) == 2
    for address, pid in pids.items():
        assert pid is not None
        assert _namespace(pid) == private, (address, pid)
    # The workers themselves stay on the machine's namespace (the scheduler reaches them).
    workers = client.run(os.getpid)
    assert all(_namespace(pid) != private for pid in workers.values())


def test_without_a_private_namespace_trainers_start_as_they_are() -> None:
    assert trainer_prefix({}) == []
    prefix = trainer_prefix({TRAINER_NAMESPACE_ENV: "root:4242"})
    assert prefix[0].endswith("nsenter") and prefix[1:] == ["--net=/proc/4242/ns/net", "--"]
    user = trainer_prefix({TRAINER_NAMESPACE_ENV: "user:4242"})
    assert "--user=/proc/4242/ns/user" in user and "--preserve-credentials" in user
