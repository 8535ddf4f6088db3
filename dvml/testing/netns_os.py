"""The operating-system side of namespace hosts (:mod:`dvml.testing.netns`): commands, the
processes inside a namespace, their shared-memory semaphores, test certificates and cgroup v1
CPU quotas. Each function does one system call's worth of work and raises
:class:`~dvml.exceptions.ClusterError` when a command fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from dvml.exceptions import ClusterError

__all__ = [
    "cgroup_leftovers",
    "cpu_cgroup_reason",
    "leftovers",
    "listening",
    "make_certificates",
    "make_cpu_cgroup",
    "mapped_shm_inodes",
    "move_to_cgroup",
    "ns_pids",
    "pid_alive",
    "remove_cgroup",
    "remove_semaphores",
    "run_cmd",
    "send_signal",
    "unavailable_reason",
]

PREFIX = "dvml"
_SHM, _SEMAPHORE_PREFIX = "/dev/shm", "sem.mp-"


def run_cmd(argv: Sequence[str], check: bool = True, timeout: float = 30) -> str:
    """Run a command; its stdout (``check``: a non-zero exit raises ClusterError)."""
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise ClusterError(
            f"Command failed (exit code {out.returncode}): {' '.join(argv)}: "
            f"{out.stderr.strip() or out.stdout.strip()}"
        )
    return out.stdout


def unavailable_reason() -> str | None:
    """Why namespace clusters cannot run here (not root, no ``ip``/``ss``), or None."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "ss", "bash"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command is not installed (iproute2 provides ip and ss)"
    probe = f"{PREFIX}-probe-{secrets.token_hex(3)}"
    try:
        run_cmd(["ip", "netns", "add", probe])
    except ClusterError as exc:
        return f"`ip netns add` failed: {exc}"
    run_cmd(["ip", "netns", "del", probe], check=False)
    return None


def listening(namespace: str) -> list[dict[str, Any]]:
    """The TCP sockets listening inside ``namespace``: ``address``, ``port``, ``process``."""
    out = run_cmd(["ip", "netns", "exec", namespace, "ss", "-ltnpH"])
    rows = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        address, _, port = local.rpartition(":")
        users = fields[5] if len(fields) > 5 else ""
        process = users.split('"')[1] if '"' in users else ""
        rows.append({"address": address.strip("[]"), "port": int(port), "process": process})
    return rows


def ns_pids(namespace: str) -> list[int]:
    """Pids of every process inside network namespace ``namespace``."""
    out = run_cmd(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def mapped_shm_inodes(pid: int) -> set[int]:
    """Inodes of the ``/dev/shm`` files that process ``pid`` maps.

    A named semaphore shows under the temporary name it was created with (glibc links it to
    its name, then removes the temporary one), so it is told by its inode.
    """
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {int(line.split()[4]) for line in maps if " /dev/shm/" in line}
    except (OSError, ValueError, IndexError):  # gone already
        return set()


def remove_semaphores(inodes: set[int]) -> None:
    """Remove Python multiprocessing's named semaphores (``sem.mp-*``) with these inodes."""
    try:
        entries = [e for e in os.scandir(_SHM) if e.name.startswith(_SEMAPHORE_PREFIX)]
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.inode() in inodes:
                os.unlink(entry.path)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def leftovers(cluster_id: str, workdir: str | None = None) -> list[str]:
    """Namespaces, links and files of cluster ``cluster_id`` that still exist (for leak checks)."""
    found = [f"namespace {n}" for n in run_cmd(["ip", "netns", "list"]).split() if cluster_id in n]
    for line in run_cmd(["ip", "-o", "link", "show"]).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if cluster_id in name:
            found.append(f"link {name}")
    if workdir and os.path.exists(workdir):
        found.append(f"directory {workdir}")
    found += cgroup_leftovers(cluster_id)
    return found


def make_certificates(directory: str) -> dict[str, str]:
    """A test CA and one certificate signed by it, for every Dask peer (``openssl``).

    Dask checks that a peer's certificate is signed by the CA, not its host name, so one
    certificate serves the scheduler, the workers and the clients of this test cluster.
    """
    if shutil.which("openssl") is None:
        raise ClusterError("tls=True needs the `openssl` command to generate certificates.")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    ca, ca_key = os.path.join(directory, "ca.pem"), os.path.join(directory, "ca-key.pem")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    csr = os.path.join(directory, "cert.csr")
    run_cmd(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
          "-subj", "/CN=dvml-netns-ca", "-keyout", ca_key, "-out", ca])  # fmt: skip
    run_cmd(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=dvml-netns",
          "-keyout", key, "-out", csr])  # fmt: skip
    run_cmd(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
          "-CAcreateserial", "-days", "2", "-out", cert])  # fmt: skip
    for path in (ca_key, key):
        os.chmod(path, 0o600)
    return {"ca": ca, "cert": cert, "key": key}


def send_signal(pid: int, sig: int) -> None:
    """Signal ``pid``; one that is gone already is not an error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# A cgroup v1 CPU controller (``cpu.cfs_quota_us`` per ``cpu.cfs_period_us``): a host's CPU
# throttled. Processes a member forks are members too, so the trainers a throttled worker or
# zygote starts later are throttled without being found.
CPU_CGROUPS = "/sys/fs/cgroup/cpu"


# The quota's period: 10 ms, not the kernel's default 100 ms. A process capped at a quarter of
# a core then runs 2.5 ms of every 10, close to a slower CPU; over 100 ms it ran 25 ms and
# stopped for 75, in whatever it was doing (a trainer inside its step's all-reduce, where its
# peer then waited too, as on a slow network rather than a slow machine).
CPU_PERIOD_US = 10_000


def cpu_cgroup_reason() -> str | None:
    """Why a CPU quota cannot be set here (no cgroup v1 ``cpu`` controller, not root), or None."""
    if not os.path.exists(os.path.join(CPU_CGROUPS, "cpu.cfs_period_us")):
        return f"no cgroup v1 cpu controller is mounted at {CPU_CGROUPS}"
    if not os.access(CPU_CGROUPS, os.W_OK):
        return f"{CPU_CGROUPS} is not writable (needs root)"
    return None


def make_cpu_cgroup(name: str, cpus: float) -> str:
    """Create cgroup ``name`` under the cpu controller, capped at ``cpus`` cores; its path."""
    if not 0.01 <= cpus <= 1024:
        raise ClusterError(f"cpus must be between 0.01 and 1024 cores. Received: cpus={cpus}.")
    reason = cpu_cgroup_reason()
    if reason:
        raise ClusterError(f"Cannot throttle a host: {reason}.")
    path = os.path.join(CPU_CGROUPS, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
        f.write(str(CPU_PERIOD_US))
    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(max(int(CPU_PERIOD_US * cpus), 1000)))
    return path


def move_to_cgroup(path: str, pids: Sequence[int]) -> list[int]:
    """Move ``pids`` into cgroup ``path`` (one that went meanwhile is skipped); those moved."""
    moved = []
    for pid in pids:
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except (ProcessLookupError, OSError):
            continue
        moved.append(pid)
    return moved


def remove_cgroup(path: str) -> str | None:
    """Move what still runs in cgroup ``path`` back to the root one and remove it; a problem."""
    if not os.path.isdir(path):
        return None
    for _ in range(20):
        with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as f:
            move_to_cgroup(CPU_CGROUPS, [int(p) for p in f.read().split()])
        try:
            os.rmdir(path)
            return None
        except OSError as exc:
            problem = f"rmdir {path}: {exc}"
        time.sleep(0.1)  # a process forked while being moved: move it too
    return problem


def cgroup_leftovers(cluster_id: str) -> list[str]:
    """The cpu cgroups whose name holds ``cluster_id`` that still exist."""
    try:
        names = os.listdir(CPU_CGROUPS)
    except OSError:
        return []
    return [f"cgroup {os.path.join(CPU_CGROUPS, n)}" for n in names if cluster_id in n]
