"""cluster/k8s/: the manifests parse and their wiring is what dvml.connect expects (pure).

No Kubernetes runs here: these checks read the YAML. Every Dask worker pod must mount the
directory of the vineyard socket its environment names, from the same hostPath the vineyardd
DaemonSet puts its socket in, and report its node as DVML_HOST; GPU workers request
nvidia.com/gpu and declare as many GPUs to Dask.
"""

from __future__ import annotations

import pathlib
import posixpath
from typing import Any

import pytest
import yaml

from dvml.cluster.workers import HOST_ENV, SOCKET_ENV

K8S = pathlib.Path(__file__).resolve().parents[2] / "cluster" / "k8s"


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def worker_pods() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every Dask worker pod template."""
    pods = [(f"DaskCluster/{d['metadata']['name']}", d["spec"]["worker"]["spec"])
            for d in by_kind("DaskCluster")]  # fmt: skip
    pods += [(f"DaskWorkerGroup/{d['metadata']['name']}", d["spec"]["worker"]["spec"])
             for d in by_kind("DaskWorkerGroup")]  # fmt: skip
    return pods


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounted_host_path(pod: dict[str, Any], container: dict[str, Any], path: str) -> str | None:
    """The hostPath a container sees at ``path`` (through its volume mounts), or None."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            host = volumes[mount["name"]].get("hostPath")
            return None if host is None else host["path"] + path[len(root) :]
    return None


def flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def vineyardd() -> tuple[dict[str, Any], dict[str, Any]]:
    (ds,) = [d for d in by_kind("DaemonSet") if d["metadata"]["name"] == "dvml-vineyardd"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "vineyardd"]
    return pod, container


def test_every_manifest_parses_and_kustomize_lists_them() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    kinds = {d["kind"] for d in documents()}
    assert {"DaemonSet", "StatefulSet", "Service", "DaskCluster", "DaskWorkerGroup"} <= kinds


def test_vineyardd_socket_on_a_host_path_rpc_off_joined_to_the_etcd_service() -> None:
    pod, container = vineyardd()
    args = container["command"]
    socket = flag(args, "--socket")
    assert socket and mounted_host_path(pod, container, socket) == socket
    assert flag(args, "--rpc") == "false"  # the `=` form: `--rpc false` would leave RPC on
    (etcd,) = [s for s in by_kind("Service") if s["metadata"]["name"] == "dvml-etcd"]
    port = etcd["spec"]["ports"][0]["port"]
    assert flag(args, "--etcd_endpoint") == f"http://dvml-etcd:{port}"
    assert env_of(container)["MY_HOST_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("name", [n for n, _ in worker_pods()])
def test_worker_pods_mount_the_socket_their_environment_names(name: str) -> None:
    pod = dict(worker_pods())[name]
    _, daemon = vineyardd()
    daemon_socket = flag(daemon["command"], "--socket")
    for container in pod["containers"]:
        env = env_of(container)
        socket = env[SOCKET_ENV]
        # The worker sees its node's vineyardd socket: the same hostPath, the same file.
        assert mounted_host_path(pod, container, posixpath.dirname(socket)) == posixpath.dirname(
            daemon_socket
        )
        assert posixpath.basename(socket) == posixpath.basename(daemon_socket)
        assert env[HOST_ENV] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["TF_USE_LEGACY_KERAS"] == "1"
        args = container["args"]
        assert args[:2] == ["dask", "worker"] and flag(args, "--nthreads") == "1"
        # Listening on the pod's address only (also the /health and /metrics server).
        assert flag(args, "--host") == "$(POD_IP)"
        assert flag(args, "--dashboard-address") == "$(POD_IP):0"
        gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
        declared = flag(args, "--resources")
        assert declared == (f"GPU={gpus}" if gpus else None), (name, declared, gpus)


def test_one_image_and_nothing_exposed_outside_the_cluster() -> None:
    images = set()
    for d in documents():
        spec = d.get("spec", {})
        templates = [spec.get("template", {}).get("spec", {})]
        templates += [spec.get(k, {}).get("spec", {}) for k in ("scheduler", "worker")]
        for t in templates:
            for c in t.get("containers", []) + t.get("initContainers", []):
                images.add(c["image"])
        services = [d] if d["kind"] == "Service" else []
        if d["kind"] == "DaskCluster":
            services.append({"spec": spec["scheduler"]["service"]})
        for s in services:
            assert s["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert images == {"dvml"}  # kustomization.yaml's `images:` names the real one
