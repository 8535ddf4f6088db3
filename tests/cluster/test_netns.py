"""dvml on several network hosts: a cluster of Linux network namespaces on a private bridge.

One module-scoped cluster (dvml.testing.netns, started with the cluster/ recipes): a head
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
from collections.abc import Iterator
from typing import Any

import pytest

from dvml.testing import netns
from tests.helpers import netns_argv, netns_client, running_netns_cluster, tensors_by_instance

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.serial]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_netns_cluster(hosts=2, workers_per_host=1, vineyard_memory="256MiB") as c:
        yield c


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
    result = netns_client(cluster, "workers", timeout=120)
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


def test_placement_rules_object_by_object(cluster: netns.NetnsCluster) -> None:
    result = netns_client(cluster, "placement", timeout=300)
    addresses = sorted(h["address"] for h in cluster.hosts)
    assert result["hosts"] == addresses
    hosts_of = {label: {b["host"] for b in rows} for label, rows in result["datasets"].items()}
    assert hosts_of == {"all": set(addresses), "one_host": {addresses[1]}, "table": set(addresses)}
    held = tensors_by_instance(result["vineyard"])
    instance_of = {h["address"]: h["instance_id"] for h in cluster.hosts}
    for rows in result["datasets"].values():
        for b in rows:
            # Each buffer lives on the vineyardd of the host it was placed on, and only there.
            assert b["vineyard_instance_id"] == instance_of[b["host"]]
            ids = {b["x_0_id"], b["y_id"]}
            assert ids <= held[b["vineyard_instance_id"]], b
            others = [i for i in held if i != b["vineyard_instance_id"]]
            assert all(not ids & held[i] for i in others)
    gone = set().union(*(set(b.values()) for rows in result["datasets"].values() for b in rows))
    after = tensors_by_instance(result["vineyard_after_drop"])
    assert all(not (ids & gone) for ids in after.values())


@pytest.mark.tf
def test_pipeline_across_two_hosts(cluster: netns.NetnsCluster) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as k

    model = k.Sequential(
        [
            k.layers.InputLayer(input_shape=(8, 8, 1)),
            k.layers.Conv2D(16, 3, activation="relu", padding="same", name="conv"),
            k.layers.Flatten(),
            k.layers.Dense(32, activation="relu", name="hidden"),
            k.layers.Dense(10, activation="softmax", name="out"),
        ]
    )
    state = pathlib.Path(cluster.workdir) / "client-state"
    result = netns_client(
        cluster, "pipeline", timeout=900, model_json=model.to_json(), state_dir=str(state)
    )
    instances = {h["instance_id"] for h in cluster.hosts}
    fit = result["fit"]
    # One trainer per data-holding worker, one on each host, each reading its own partitions.
    assert len(fit["trainers"]) == 2
    assert {p["instance_id"] for p in fit["trainer_partitions"].values()} == instances
    assert all(p["rows"] > 0 for p in fit["trainer_partitions"].values())
    assert fit["weights_identical"]
    # The accuracy a single-host fit reaches (tests/train/test_fit_cluster.py).
    assert fit["validation_metric"] >= 0.90, fit
    assert result["evaluate"]["rows"] == 297
    assert abs(result["evaluate"]["metric"] - fit["validation_metric"]) < 0.02
    assert result["predict"]["rows"] == 200 and result["predict"]["accuracy"] >= 0.85
    assert result["client_loaded_tensorflow"] is False  # evaluate/predict ran on the workers
    features = result["features"]
    assert features["rows"] == 1500 and features["batches_built"] > 0
    assert features["same_object"] and features["batches_hit"] == 0
    assert features["hosts"] == sorted(h["address"] for h in cluster.hosts)
    # The data took memory on both hosts and dropping it gave that memory back on both.
    before = {v["instance_id"]: v["memory_usage"] for v in result["memory_before"].values()}
    loaded = {v["instance_id"]: v["memory_usage"] for v in result["memory_loaded"].values()}
    after = {v["instance_id"]: v["memory_usage"] for v in result["memory_after_drop"].values()}
    assert set(loaded) == instances
    assert all(loaded[i] > before[i] for i in instances), (before, loaded)
    assert all(after[i] <= before[i] for i in instances), (before, after)


def test_your_own_training_loop_across_two_hosts(cluster: netns.NetnsCluster) -> None:
    """dvml.run across namespace hosts: one trainer per host in lock-step, each on its own
    rows; the model it saved is evaluated where the data is."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as k

    model = k.Sequential(
        [
            k.layers.InputLayer(input_shape=(8, 8, 1)),
            k.layers.Flatten(),
            k.layers.Dense(32, activation="relu", name="hidden"),
            k.layers.Dense(10, activation="softmax", name="out"),
        ]
    )
    state = pathlib.Path(cluster.workdir) / "client-state-run"
    result = netns_client(
        cluster, "run_loop", timeout=900, model_json=model.to_json(), state_dir=str(state)
    )
    assert len(result["workers"]) == 2
    assert result["value"]["world"] == 2
    assert result["value"]["host"], result["value"]  # the chief's host, as worker tables name it
    assert {r["worker"] for r in result["reports"]} == set(result["workers"])
    assert result["loss"][-1] < result["loss"][0], result["loss"]
    assert result["evaluate"]["rows"] == 297
    assert result["evaluate"]["metric"] > 0.5, result["evaluate"]


@pytest.mark.tf
def test_a_fit_on_one_host_leases_its_dataset_against_a_client_on_another(
    cluster: netns.NetnsCluster, tmp_path: pathlib.Path
) -> None:
    """Issue 42, item 6: the lease lives with the cluster (its scheduler), so a client on
    another host, with another state directory, sees it: its drop is refused while the fit
    trains, and accepted once the fit has ended."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as k

    model = k.Sequential(
        [k.layers.InputLayer(input_shape=(8, 8, 1)), k.layers.Flatten(), k.layers.Dense(10)]
    )
    fitter, dropper = (h["namespace"] for h in cluster.hosts)
    gate = tmp_path / "gate"
    other = str(tmp_path / "dropper-state")
    fit = subprocess.Popen(
        netns_argv(
            cluster, "gated_fit", fitter, name="lease_nf", gate=str(gate),
            model_json=model.to_json(), state_dir=str(tmp_path / "fitter-state"),
        ),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env(),
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert fit.stdout is not None
        for line in fit.stdout:  # until the trainers run and the fit waits at the gate
            lines.append(line.rstrip())
            if line.startswith("FIRST-ITERATION"):
                break
        assert lines and lines[-1] == "FIRST-ITERATION", "\n".join(lines[-40:])
        refused = netns_client(
            cluster, "drop", 300, namespace=dropper, name="lease_nf", state_dir=other
        )
        assert refused["error"] == "DatasetInUseError", refused
        assert "Cannot drop dataset 'lease_nf'" in refused["message"]
        assert "dvml.fit of model 'lease_cnn'" in refused["message"]
        assert "Wait for that job to end" in refused["message"] and "force" in refused["message"]
        assert refused["exists"] is True
        gate.touch()
        lines += [line.rstrip() for line in fit.stdout]
        assert fit.wait(timeout=300) == 0, "\n".join(lines[-40:])
    finally:
        gate.touch()
        if fit.poll() is None:
            fit.kill()
            fit.wait()
    results = [x for x in lines if x.startswith("DVML-RESULT ")]
    assert results, "\n".join(lines[-40:])
    fitted = json.loads(results[-1].removeprefix("DVML-RESULT "))
    assert fitted["error"] is None and fitted["model"] == "lease_cnn", fitted
    dropped = netns_client(
        cluster, "drop", 300, namespace=dropper, name="lease_nf", state_dir=other
    )
    assert dropped == {"error": None, "exists": False}
