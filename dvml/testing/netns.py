"""A multi-host dvml cluster on one machine: Linux network namespaces on a private bridge.

Each "host" is a network namespace with its own address on a bridge that only this cluster
uses: a head host runs etcd and the Dask scheduler, every worker host runs one vineyardd joined
to that etcd and its Dask workers. They are started with the ``cluster/`` recipes
(``etcd.sh``, ``scheduler.sh``, ``host.sh``), exactly as on real machines, and every daemon
listens on its own namespace's address, never on 0.0.0.0. The bridge has no address in the
machine's own namespace and no namespace has a default route: traffic stays on the bridge and
nothing outside the machine can be addressed.

Filesystem-path Unix sockets and ``/dev/shm`` stay shared between network namespaces, so every
host gets its own socket directory; ``DVML_HOST`` and vineyardd's ``MY_HOST_NAME`` are the
host's address (all namespaces share one hostname).

Everything created is recorded, as it is created, in a registry (a JSON state file) so that
:meth:`NetnsCluster.down` removes every process (by pid, and any other process left in the
cluster's namespaces), namespace, link and file, also after a failed start or in another
process. Needs root (``ip netns``); :func:`unavailable_reason` says why not otherwise.

Run it by hand::

    sudo python -m dvml.testing.netns up            # prints the namespaces and the scheduler
    sudo ip netns exec dvml-<id>-head python my_script.py   # dvml.connect("tcp://10.77.0.10:8786")
    sudo python -m dvml.testing.netns status
    sudo python -m dvml.testing.netns down
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from typing import Any

from dvml.exceptions import ArgumentError, ClusterError, ClusterStartError
from dvml.testing import netns_os
from dvml.testing.netns_os import (
    leftovers,
    listening,
    make_certificates,
    mapped_shm_inodes,
    ns_pids,
    pid_alive,
    remove_semaphores,
    run_cmd,
    send_signal,
    unavailable_reason,
)

__all__ = ["NetnsCluster", "leftovers", "listening", "main", "unavailable_reason"]

PREFIX = "dvml"
ETCD_PORT, ETCD_PEER_PORT, SCHEDULER_PORT, DASHBOARD_PORT = 2379, 2380, 8786, 8787


def recipes_dir() -> pathlib.Path:
    """The ``cluster/`` recipes of a source checkout (or ``DVML_RECIPES``)."""
    env = os.environ.get("DVML_RECIPES")
    path = pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parents[2] / "cluster"
    if not (path / "host.sh").exists():
        raise ClusterError(
            f"The cluster/ recipes (etcd.sh, scheduler.sh, host.sh) are not at {path}. Run from "
            "a source checkout of dvml or set DVML_RECIPES to the recipes' folder."
        )
    return path


class NetnsCluster:
    """A head namespace (etcd, scheduler) and worker-host namespaces (vineyardd, workers).

    Parameters
    ----------
    hosts : int
        Worker hosts (namespaces with one vineyardd each).
    workers_per_host : int
        Dask workers on each worker host, sharing its vineyardd.
    subnet : str
        A private IPv4 network of the bridge; the head is its 10th address, worker host ``i``
        its ``11 + i``-th.
    vineyard_memory : str
        Shared memory of each vineyardd.
    state_path : str, optional
        Where the registry of what was created is kept (default: in the cluster's workdir).
    python : str, optional
        Interpreter of the daemons and workers (default: this one).
    timeout : float
        Seconds each recipe may take to start.
    env : dict, optional
        Extra environment of every daemon and client, e.g. Dask settings
        (``DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL``).
    tls : bool
        Dask over TLS (``tls://``): a CA and a certificate signed by it are generated (with
        ``openssl``) in the workdir; the scheduler, the workers and clients started with
        :meth:`env` use them, and a client without a certificate is refused.
    """

    def __init__(
        self,
        hosts: int = 2,
        workers_per_host: int = 1,
        subnet: str = "10.77.0.0/24",
        vineyard_memory: str = "256MiB",
        state_path: str | None = None,
        python: str | None = None,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        tls: bool = False,
    ) -> None:
        if hosts < 1 or workers_per_host < 1:
            raise ArgumentError(
                f"hosts and workers_per_host must be at least 1. Received: hosts={hosts}, "
                f"workers_per_host={workers_per_host}."
            )
        net = ipaddress.ip_network(subnet)
        if not net.is_private or net.num_addresses < 16 + hosts:
            raise ArgumentError(
                f"subnet must be a private network with room for {hosts + 1} hosts. Received: "
                f"subnet={subnet!r}."
            )
        self.id = secrets.token_hex(3)
        self.workdir = tempfile.mkdtemp(prefix=f"{PREFIX}-netns-{self.id}-", dir="/tmp")
        os.chmod(self.workdir, 0o700)
        self.state_path = state_path or os.path.join(self.workdir, "state.json")
        self.python = python or sys.executable
        self.timeout = timeout
        self.state: dict[str, Any] = {
            "id": self.id,
            "subnet": str(net),
            "workdir": self.workdir,
            "bridge": f"{PREFIX}br{self.id}",
            "namespaces": [],
            "links": [],
            "processes": [],
            "head": {
                "namespace": f"{PREFIX}-{self.id}-head",
                "address": str(net[10]),
            },
            "hosts": [
                {
                    "namespace": f"{PREFIX}-{self.id}-h{i + 1}",
                    "address": str(net[11 + i]),
                    "socket_dir": os.path.join(self.workdir, f"h{i + 1}"),
                    "workers": workers_per_host,
                }
                for i in range(hosts)
            ],
            "vineyard_memory": vineyard_memory,
            "env": dict(env or {}),
            "tls": None,
        }
        head = self.state["head"]["address"]
        self.state["etcd_endpoint"] = f"http://{head}:{ETCD_PORT}"
        self.state["scheduler_address"] = f"{'tls' if tls else 'tcp'}://{head}:{SCHEDULER_PORT}"
        if tls:
            self.state["tls"] = make_certificates(os.path.join(self.workdir, "tls"))
        self._save()

    # -- the registry --------------------------------------------------------------------------

    @classmethod
    def from_state(cls, path: str) -> NetnsCluster:
        """The cluster recorded in the state file ``path`` (to stop it from another process)."""
        with open(path) as f:
            state = json.load(f)
        self = cls.__new__(cls)
        self.state, self.id, self.workdir = state, state["id"], state["workdir"]
        self.state_path, self.python, self.timeout = path, sys.executable, 120
        return self

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.state_path) or ".", exist_ok=True)
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(tmp, self.state_path)

    def _record(self, kind: str, value: Any) -> None:
        self.state[kind].append(value)
        self._save()

    @property
    def scheduler_address(self) -> str:
        return str(self.state["scheduler_address"])

    @property
    def etcd_endpoint(self) -> str:
        return str(self.state["etcd_endpoint"])

    @property
    def security(self) -> Any:
        """The :class:`distributed.security.Security` of a ``tls=True`` cluster, else None:
        ``dvml.connect(cluster.scheduler_address, security=cluster.security)``. (Clients run
        with :meth:`env` get the same certificates through Dask's configuration.)"""
        from dvml.cluster.security import cluster_security

        tls = self.state.get("tls")
        return cluster_security(tls) if tls else None

    @property
    def head(self) -> dict[str, Any]:
        return dict(self.state["head"])

    @property
    def hosts(self) -> list[dict[str, Any]]:
        return [dict(h) for h in self.state["hosts"]]

    @property
    def namespaces(self) -> list[str]:
        return [self.state["head"]["namespace"]] + [h["namespace"] for h in self.state["hosts"]]

    def processes(self) -> list[dict[str, Any]]:
        """Every recorded process: ``pid``, ``name``, ``namespace`` and the recipe's fields."""
        return [dict(p) for p in self.state["processes"]]

    # -- start ---------------------------------------------------------------------------------

    def up(self) -> NetnsCluster:
        """Create the bridge and namespaces and start every daemon; on failure remove it all."""
        try:
            self._network()
            self._daemons()
        except BaseException as exc:
            problems = self.down()
            if isinstance(exc, ClusterError | subprocess.SubprocessError | OSError):
                extra = f" Cleaning up also reported: {problems}" if problems else ""
                raise ClusterStartError(
                    f"The namespace cluster {self.id} failed to start and was removed: {exc}"
                    + extra
                ) from exc
            raise
        return self

    def _network(self) -> None:
        bridge = self.state["bridge"]
        run_cmd(["ip", "link", "add", bridge, "type", "bridge"])
        self._record("links", bridge)
        run_cmd(["ip", "link", "set", bridge, "up"])
        for i, role in enumerate([self.state["head"], *self.state["hosts"]]):
            self._attach(role, i)
        self._wait_reachable([h["address"] for h in self.state["hosts"]])

    def _attach(self, role: dict[str, Any], index: int) -> None:
        """Create ``role``'s namespace and its veth to the bridge, with its address."""
        ns, bridge = role["namespace"], self.state["bridge"]
        prefix = ipaddress.ip_network(self.state["subnet"]).prefixlen
        run_cmd(["ip", "netns", "add", ns])
        self._record("namespaces", ns)
        run_cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        outer, inner = f"dv{self.id}n{index}", f"dv{self.id}p{index}"
        run_cmd(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        self._record("links", outer)  # deleting one end deletes its peer
        role["link"] = outer
        run_cmd(["ip", "link", "set", inner, "netns", ns])
        run_cmd(["ip", "-n", ns, "link", "set", inner, "name", "eth0"])
        run_cmd(["ip", "-n", ns, "addr", "add", f"{role['address']}/{prefix}", "dev", "eth0"])
        run_cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run_cmd(["ip", "link", "set", outer, "master", bridge, "up"])
        self._save()

    def add_host(self, workers: int | None = None) -> dict[str, Any]:
        """Add a worker host to the running cluster (a machine that joins); return it.

        Its namespace gets the next address of the subnet and a veth to the bridge, then
        ``host.sh`` starts its vineyardd (joined to the cluster's etcd) and its Dask workers
        (``workers``, default: as many as the other hosts), exactly as a new machine is added.
        Everything is recorded as it is created, so :meth:`down` removes it with the rest, also
        when the start fails here (which raises :class:`~dvml.exceptions.ClusterError`).
        """
        hosts = self.state["hosts"]
        n = len(hosts) + 1
        net = ipaddress.ip_network(self.state["subnet"])
        if net.num_addresses < 16 + n:
            raise ArgumentError(
                f"The subnet {net} has no address left for host {n}. Received: a cluster "
                f"of {n - 1} hosts. Use a larger subnet."
            )
        each = int(hosts[0]["workers"]) if hosts else 1
        if (workers if workers is not None else each) < 1:
            raise ArgumentError(f"workers must be at least 1. Received: workers={workers}.")
        host: dict[str, Any] = {
            "namespace": f"{PREFIX}-{self.id}-h{n}",
            "address": str(net[10 + n]),
            "socket_dir": os.path.join(self.workdir, f"h{n}"),
            "workers": workers if workers is not None else each,
        }
        self._record("hosts", host)
        self._attach(host, n)
        self._wait_reachable([host["address"]])
        self.start_host(host["namespace"])
        return dict(host)

    def _wait_reachable(self, addresses: list[str]) -> None:
        """Each of these worker hosts answers the head over the bridge (a refused TCP
        connection is an answer; no ``ping`` is needed)."""
        head = self.state["head"]
        probe = (
            "import socket, sys\n"
            "for a in sys.argv[1:]:\n"
            "    try:\n"
            "        socket.create_connection((a, 9), timeout=1).close()\n"
            "    except ConnectionRefusedError:\n"
            "        pass\n"
        )
        deadline = time.monotonic() + 15
        while True:
            out = subprocess.run(
                self.exec_argv(head["namespace"], [self.python, "-c", probe, *addresses]),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if out.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"The worker hosts {addresses} are not reachable from the head namespace "
                    f"over bridge {self.state['bridge']}: {out.stderr.strip()[-300:]}. Bridged "
                    "traffic may be filtered (br_netfilter with a DROP policy)."
                )
            time.sleep(0.2)

    def exec_argv(self, namespace: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``namespace``."""
        return ["ip", "netns", "exec", namespace, *argv]

    def env(self) -> dict[str, str]:
        """The environment of the daemons and clients: this one, plus the interpreter."""
        env = dict(os.environ)
        env["PYTHON"] = self.python
        # A pinned task on a host that is gone fails instead of waiting forever.
        env.setdefault("DASK_DISTRIBUTED__SCHEDULER__NO_WORKERS_TIMEOUT", "60s")
        tls = self.state.get("tls")
        if tls:  # what a client (dvml.connect -> distributed.Client) reads from the config
            env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"] = tls["ca"]
            env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"] = tls["cert"]
            env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"] = tls["key"]
            env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] = "True"
        env.update(self.state.get("env", {}))
        return env

    def _tls_args(self) -> list[str]:
        tls = self.state.get("tls")
        if not tls:
            return []
        return ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]

    def _recipe(self, namespace: str, script: str, *args: str) -> list[dict[str, str]]:
        argv = self.exec_argv(namespace, ["bash", str(recipes_dir() / script), *args])
        out = subprocess.run(
            argv, capture_output=True, text=True, env=self.env(), timeout=self.timeout + 30,
            check=False,
        )  # fmt: skip
        rows = []
        for line in out.stdout.splitlines():
            if line.startswith("pid="):
                row = dict(field.split("=", 1) for field in line.split())
                row["namespace"] = namespace
                rows.append(row)
                self._record("processes", {**row, "pid": int(row["pid"])})
        if out.returncode != 0:
            raise ClusterError(
                f"{script} failed in {namespace} (exit code {out.returncode}): "
                f"{out.stderr.strip()[-2000:]}"
            )
        return rows

    def _daemons(self) -> None:
        head = self.state["head"]
        ns, addr, wd, t = head["namespace"], head["address"], self.workdir, str(int(self.timeout))
        self._recipe(
            ns, "etcd.sh", "--host", addr, "--client-port", str(ETCD_PORT),
            "--peer-port", str(ETCD_PEER_PORT), "--data-dir", f"{wd}/etcd/data", "--timeout", t,
        )  # fmt: skip
        self._recipe(
            ns, "scheduler.sh", "--host", addr, "--port", str(SCHEDULER_PORT),
            "--dashboard-address", f"{addr}:{DASHBOARD_PORT}", "--log-dir", f"{wd}/scheduler",
            "--timeout", t, *self._tls_args(),
        )  # fmt: skip
        # One host after the other: vineyardds joining etcd at once race for their rank.
        for host in self.state["hosts"]:
            self.start_host(host["namespace"])

    def start_host(self, namespace: str, workers_only: bool = False) -> list[dict[str, str]]:
        """Run ``host.sh`` in a worker host's namespace (also to restart a host after a fault).

        ``workers_only`` starts just the Dask workers, on the host's running vineyardd (whose
        data stays), e.g. after the workers shut down while the host was cut off.
        """
        host = next(h for h in self.state["hosts"] if h["namespace"] == namespace)
        rows = self._recipe(
            namespace, "host.sh", "--etcd", self.etcd_endpoint,
            "--scheduler", self.scheduler_address, "--workers", str(host["workers"]),
            "--vineyard-memory", str(self.state["vineyard_memory"]),
            "--listen", host["address"], "--host-name", host["address"],
            "--socket-dir", host["socket_dir"], "--etcd-prefix", f"/dvml/netns-{self.id}",
            "--timeout", str(int(self.timeout)), *(["--workers-only"] if workers_only else []),
            *self._tls_args(),
        )  # fmt: skip
        for row in rows:
            if row["name"] == "vineyardd":
                host["socket"], host["instance_id"] = row["socket"], int(row["instance_id"])
        host["worker_names"] = [r["name"] for r in rows if r["name"] != "vineyardd"]
        self._save()
        return rows

    def worker_pids(self, namespace: str) -> list[int]:
        """Live pids of the recorded Dask workers of a host."""
        return [
            p["pid"]
            for p in self.state["processes"]
            if p["namespace"] == namespace and p["name"] != "vineyardd" and pid_alive(p["pid"])
        ]

    # -- use -----------------------------------------------------------------------------------

    def run_client(
        self, argv: Sequence[str], timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the head namespace (where a notebook or script would run)."""
        return subprocess.run(
            self.exec_argv(self.state["head"]["namespace"], argv),
            capture_output=True, text=True, timeout=timeout, env={**self.env(), **(env or {})},
            check=False,
        )  # fmt: skip

    def kill_host(
        self, namespace: str, keep_vineyardd: bool = False, spare: Collection[int] = ()
    ) -> list[int]:
        """SIGKILL every process of a worker host (a host that dies); return their pids.

        ``keep_vineyardd`` spares the host's vineyardd (its data stays): only the Dask workers
        and what they started (trainers) die, as when the workers crash. ``spare``: pids left
        running too (a trainer that must end on its own once its worker is gone).

        Returns once no other process runs in the namespace (bounded by a few seconds): a
        process started while the others were being killed (a Nanny restarting its worker, a
        worker starting a trainer) is killed too, not left behind as the host's survivor.

        A machine that dies takes its ``/dev/shm`` along; these hosts share this machine's. So
        the named semaphores that the killed processes mapped (Python multiprocessing's
        ``sem.mp-*``, which their resource tracker, killed with them, would have removed) are
        removed here, instead of piling up in ``/dev/shm`` at every simulated host death.
        """
        if namespace not in [h["namespace"] for h in self.state["hosts"]]:
            raise ArgumentError(f"Not a worker host of this cluster. Received: {namespace!r}.")
        spared = {
            p["pid"]
            for p in self.state["processes"]
            if keep_vineyardd and p["namespace"] == namespace and p["name"] == "vineyardd"
        } | set(spare)
        killed: list[int] = []
        inodes: set[int] = set()  # of the shared memory files the killed processes mapped
        deadline = time.monotonic() + 10.0
        while True:
            # Zombies count as gone: their parent (outside the host, or dead) reaps them.
            pids = [p for p in ns_pids(namespace) if p not in spared and pid_alive(p)]
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                inodes |= mapped_shm_inodes(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                if pid not in killed:
                    killed.append(pid)
            time.sleep(0.05)
        remove_semaphores(inodes)
        return killed

    def set_link(self, namespace: str, up: bool) -> None:
        """Cut (``up=False``) or restore a host's link to the bridge: a network partition."""
        roles = [self.state["head"], *self.state["hosts"]]
        role = next(r for r in roles if r["namespace"] == namespace)
        run_cmd(["ip", "link", "set", role["link"], "up" if up else "down"])

    def throttle_host(self, namespace: str, cpus: float) -> str:
        """Cap a worker host's CPU at ``cpus`` cores (a cgroup v1 CPU quota); the cgroup's path.

        Every process of the host (its vineyardd, Nanny, worker, zygote and trainers) goes into
        one cgroup whose quota is ``cpus`` cores; what they start later inherits it, so a job's
        restarted trainers stay throttled. :meth:`unthrottle_host` (or :meth:`down`) removes it.
        """
        if namespace not in [h["namespace"] for h in self.state["hosts"]]:
            raise ArgumentError(f"Not a worker host of this cluster. Received: {namespace!r}.")
        name = f"{PREFIX}-{self.id}-{namespace.rsplit('-', 1)[-1]}"
        path = netns_os.make_cpu_cgroup(name, cpus)
        if path not in self.state.setdefault("cgroups", []):
            self._record("cgroups", path)
        netns_os.move_to_cgroup(path, ns_pids(namespace))
        return path

    def unthrottle_host(self, namespace: str) -> None:
        """Give a throttled host its CPU back: its processes leave the cgroup, which is removed."""
        name = f"{PREFIX}-{self.id}-{namespace.rsplit('-', 1)[-1]}"
        for path in [c for c in self.state.get("cgroups", []) if os.path.basename(c) == name]:
            problem = netns_os.remove_cgroup(path)
            if problem:
                raise ClusterError(f"Could not remove the CPU quota of {namespace}: {problem}.")
            self.state["cgroups"].remove(path)
            self._save()

    def status(self) -> dict[str, Any]:
        """Each namespace with its address, live recorded processes and TCP listeners."""
        rows = {}
        existing = set(run_cmd(["ip", "netns", "list"]).split())
        for role in [self.state["head"], *self.state["hosts"]]:
            ns = role["namespace"]
            if ns not in existing:
                rows[ns] = {"address": role["address"], "exists": False}
                continue
            procs = [
                f"{p['name']}({p['pid']})"
                for p in self.state["processes"]
                if p["namespace"] == ns and pid_alive(p["pid"])
            ]
            rows[ns] = {
                "address": role["address"],
                "exists": True,
                "processes": procs,
                "listening": [f"{r['address']}:{r['port']} {r['process']}" for r in listening(ns)],
            }
        return {"id": self.id, "scheduler": self.scheduler_address, "namespaces": rows}

    # -- stop ----------------------------------------------------------------------------------

    def down(self, grace: float = 10) -> list[str]:
        """Stop every process, remove namespaces, links and files; return what went wrong.

        Safe to call twice and after a partial start. Recorded processes stop in reverse start
        order (workers, vineyardd, scheduler, etcd) with SIGTERM, then SIGKILL; any other
        process left inside the cluster's namespaces (a trainer, a Nanny's child) is killed
        too. Only pids found inside this cluster's own namespaces are signalled.
        """
        problems: list[str] = []
        existing = set(run_cmd(["ip", "netns", "list"], check=False).split())
        ours = [n for n in self.state["namespaces"] if n in existing]
        inside = {pid for ns in ours for pid in ns_pids(ns)}
        recorded = [p["pid"] for p in reversed(self.state["processes"]) if p["pid"] in inside]
        for pid in recorded:
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(pid_alive(p) for p in recorded):
            time.sleep(0.1)
        for _ in range(50):
            left = {pid for ns in ours for pid in ns_pids(ns) if pid_alive(pid)}
            if not left:
                break
            for pid in left:
                send_signal(pid, signal.SIGKILL)
            time.sleep(0.1)
        else:
            problems.append(f"processes still running in {ours}: {sorted(left)}")
        for ns in ours:
            out = subprocess.run(
                ["ip", "netns", "del", ns], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                problems.append(f"ip netns del {ns}: {out.stderr.strip()}")
        links = set(run_cmd(["ip", "-o", "link", "show"], check=False).split())
        for link in reversed(self.state["links"]):
            if f"{link}:" in links or any(t.startswith(f"{link}@") for t in links):
                out = subprocess.run(
                    ["ip", "link", "del", link], capture_output=True, text=True, check=False
                )
                if out.returncode != 0 and "Cannot find" not in out.stderr:
                    problems.append(f"ip link del {link}: {out.stderr.strip()}")
        for path in self.state.get("cgroups", []):
            problem = netns_os.remove_cgroup(path)
            if problem:
                problems.append(problem)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if os.path.exists(self.state_path):
            os.remove(self.state_path)
        problems += leftovers(self.id, self.workdir)
        return problems

    def __enter__(self) -> NetnsCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        problems = self.down()
        if problems:
            raise ClusterError(f"Removing namespace cluster {self.id} left: {problems}")


# -- command line ------------------------------------------------------------------------------


def _default_state() -> str:
    from dvml import config

    return str(config.state_dir() / "netns.json")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dvml.testing.netns up|down|status``."""
    parser = argparse.ArgumentParser(
        prog="python -m dvml.testing.netns",
        description="A multi-host dvml cluster of network namespaces on this machine (root).",
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state", default=None, help="state file (default ~/.dvml/netns.json)")
    parser.add_argument("--hosts", type=int, default=2, help="worker hosts (default 2)")
    parser.add_argument("--workers-per-host", type=int, default=1)
    parser.add_argument("--subnet", default="10.77.0.0/24", help="private bridge network")
    parser.add_argument("--vineyard-memory", default="256MiB")
    parser.add_argument("--tls", action="store_true", help="Dask over TLS (test certificates)")
    args = parser.parse_args(argv)
    state = args.state or _default_state()
    if args.command == "up":
        if os.path.exists(state):
            print(
                f"error: a namespace cluster is already recorded in {state}. Run "
                f"`python -m dvml.testing.netns down --state {state}` first.",
                file=sys.stderr,
            )
            return 1
        reason = unavailable_reason()
        if reason:
            print(f"error: cannot create network namespaces: {reason}.", file=sys.stderr)
            return 1
        cluster = NetnsCluster(
            hosts=args.hosts, workers_per_host=args.workers_per_host, subnet=args.subnet,
            vineyard_memory=args.vineyard_memory, state_path=state, tls=args.tls,
        )  # fmt: skip
        try:
            cluster.up()
        except ClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        head = cluster.head["namespace"]
        print(json.dumps(cluster.status(), indent=1))
        print(
            f"\nscheduler: {cluster.scheduler_address}\nrun a client: ip netns exec {head} "
            f'python -c \'import dvml; print(dvml.connect("{cluster.scheduler_address}")'
            f".worker_table())'\nstop: python -m dvml.testing.netns down --state {state}"
        )
        return 0
    if not os.path.exists(state):
        print(f"error: no namespace cluster is recorded in {state}.", file=sys.stderr)
        return 1
    cluster = NetnsCluster.from_state(state)
    if args.command == "status":
        print(json.dumps(cluster.status(), indent=1))
        return 0
    problems = cluster.down()
    if problems:
        print(f"error: removing the cluster left: {problems}", file=sys.stderr)
        return 1
    print(f"removed namespace cluster {cluster.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
