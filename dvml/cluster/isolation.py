"""etcd that only the cluster's owner reaches: a private network namespace for the daemons.

etcd holds the metadata of every vineyard object: whoever reaches it can list the datasets and
delete their keys (a dataset vanishes from ``datasets.list()`` while its memory stays
allocated). On loopback TCP every user of the machine reaches it. The obvious fixes do not work
with vineyardd 0.24.2, checked on its binary: its etcd client (etcd-cpp-apiv3) resolves the
endpoint's ``host:port`` into an IPv4 address, so a ``unix://`` endpoint fails ("Failed to
startup meta service"), and vineyardd has no flag for an etcd client certificate or an etcd
user and password.

So etcd and every vineyardd of a :class:`~dvml.LocalCluster` run in a network namespace of
their own, which has nothing but its loopback: etcd listens on 127.0.0.1:2379 there, where no
process outside the namespace can connect (entering it needs the owner's privileges). The
owner reaches etcd through a Unix socket in the cluster's 0700 directory (the health check).
The Dask workers stay outside: they reach their vineyardd through its IPC socket, a file,
which network namespaces do not separate, and vineyard RPC is off.

The trainers go inside too (:func:`trainer_prefix`). TensorFlow's gRPC server, which
``MultiWorkerMirroredStrategy`` and the collectives of model averaging need, listens on every
interface (``[::]:port``) and has no option to choose one: on the machine's namespace any local
user, or any host that reaches the machine, could connect to a training job. Inside the
cluster's namespace the only interface is its loopback, where the trainers of the cluster (all
on this machine, addressed as 127.0.0.1) reach each other and nothing outside reaches them.
They need nothing else on the network: their vineyardd is an IPC socket, their worker talks to
them through pipes, the registry is a file.

Root creates the namespace with ``unshare --net``; another user inside a user namespace of
their own (``unshare --user --map-root-user --net``) where the kernel allows unprivileged user
namespaces. Where neither works (no util-linux, a container's seccomp profile), config
``dvml.cluster.private-etcd`` decides: ``"auto"`` (default) falls back to loopback TCP with a
warning, ``true`` refuses to start, ``false`` always uses loopback TCP.
"""

from __future__ import annotations

import functools
import http.client
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

from dvml import config
from dvml.cluster.daemons import etcd_binary
from dvml.cluster.processes import ManagedProcess, poll_for
from dvml.exceptions import ArgumentError, ClusterStartError

__all__ = [
    "ETCD_ENDPOINT",
    "ETCD_SOCKET",
    "TRAINER_NAMESPACE_ENV",
    "etcd_socket_request",
    "join_namespace",
    "namespace_mode",
    "private_etcd_wanted",
    "start_private_etcd",
    "trainer_prefix",
]

logger = logging.getLogger("dvml.cluster")

# Fixed: nothing else listens inside the namespace.
ETCD_ENDPOINT = "http://127.0.0.1:2379"
_PEER_URL = "http://127.0.0.1:2380"
# etcd takes a unix:// URL only in the form host:port and creates that file in its working
# directory; the wrapper below changes into the cluster directory first.
ETCD_SOCKET = "etcd.sock:0"

# Run by the interpreter inside the new namespace: bring its loopback up (the kernel creates
# it down), change into the cluster directory, then become etcd (same pid).
_LO_UP_AND_EXEC = """\
import fcntl, os, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))
s.close()
os.chdir(sys.argv[1])
os.execv(sys.argv[2], sys.argv[2:])
"""


def _unshare_flags(mode: str) -> list[str]:
    return ["--net"] if mode == "root" else ["--user", "--map-root-user", "--net"]


@functools.cache
def namespace_mode() -> str | None:
    """``"root"`` or ``"user"`` when this process can make a private network namespace."""
    if not sys.platform.startswith("linux"):
        return None
    unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
    if unshare is None or nsenter is None:
        return None
    modes = ["root", "user"] if os.geteuid() == 0 else ["user"]
    for mode in modes:
        try:
            out = subprocess.run(
                [unshare, *_unshare_flags(mode), "true"], capture_output=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0:
            return mode
    return None


def private_etcd_wanted(setting: object = None) -> str | None:
    """The namespace mode to use for etcd, or None for loopback TCP (config
    ``cluster.private-etcd``: ``"auto"``, ``true`` or ``false``)."""
    value = config.get("cluster.private-etcd", setting)
    if value is False:
        return None
    if value not in (True, "auto"):
        raise ArgumentError(
            "private_etcd (config dvml.cluster.private-etcd) must be 'auto', true or false. "
            f"Received: {value!r}."
        )
    mode = namespace_mode()
    if mode is None and value is True:
        raise ClusterStartError(
            "dvml.cluster.private-etcd is true, but this process cannot create a network "
            "namespace (it needs root, or unprivileged user namespaces and the `unshare` and "
            "`nsenter` commands of util-linux). Allow user namespaces, or set "
            "dvml.cluster.private-etcd to 'auto' (etcd then listens on loopback TCP, readable "
            "by every local user)."
        )
    if mode is None:
        logger.warning(
            "etcd listens on loopback TCP, where every local user can read and delete vineyard "
            "metadata: this process cannot create a private network namespace (needs root or "
            "unprivileged user namespaces, and util-linux). See the README's Safety section."
        )
    return mode


def join_namespace(mode: str, pid: int, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside the network namespace of process ``pid`` (etcd's)."""
    nsenter = shutil.which("nsenter") or "nsenter"
    join = [f"--net=/proc/{pid}/ns/net"]
    if mode != "root":
        # Keep our uid: setgroups is denied in a user namespace made with --map-root-user.
        join = [f"--user=/proc/{pid}/ns/user", *join, "--preserve-credentials"]
    return [nsenter, *join, "--", *argv]


TRAINER_NAMESPACE_ENV = "DVML_TRAINER_NAMESPACE"
"""Set on the workers of a :class:`~dvml.LocalCluster` whose etcd has a private network
namespace: ``MODE:PID`` (the namespace mode and etcd's pid); their trainers start inside it."""


def trainer_prefix(environ: Mapping[str, str]) -> list[str]:
    """The command prefix that starts a trainer in its cluster's private network namespace
    (:data:`TRAINER_NAMESPACE_ENV`); empty where the cluster has none."""
    value = environ.get(TRAINER_NAMESPACE_ENV)
    if not value:
        return []
    mode, _, pid = value.partition(":")
    return join_namespace(mode, int(pid), [])


def etcd_socket_request(
    socket_path: str, method: str, path: str, body: str | None = None, timeout: float = 2
) -> bytes:
    """One HTTP request to etcd through its Unix socket; returns the response body."""

    class _UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(socket_path)
            self.sock = sock

    conn = _UnixConnection("localhost", timeout=timeout)
    try:
        conn.request(method, path, body=body)
        return conn.getresponse().read()
    finally:
        conn.close()


def _healthy(socket_path: str) -> bool:
    try:
        return b'"true"' in etcd_socket_request(socket_path, "GET", "/health", timeout=1)
    except OSError:
        return False


def start_private_etcd(
    mode: str, directory: str, log_path: str, timeout: float
) -> tuple[ManagedProcess, str]:
    """Start etcd in a new network namespace; return it and the path of its Unix socket.

    Its data goes to ``directory/etcd``; it listens on 127.0.0.1:2379 inside the namespace
    (for the vineyardds, started there with :func:`join_namespace`) and on a Unix socket in
    ``directory`` (for the owner).
    """
    unshare = shutil.which("unshare") or "unshare"
    sock = os.path.join(directory, ETCD_SOCKET)
    argv = [
        unshare, *_unshare_flags(mode), "--",
        sys.executable, "-I", "-S", "-c", _LO_UP_AND_EXEC, directory,
        etcd_binary(), "--name", "dvml", "--data-dir", os.path.join(directory, "etcd"),
        "--listen-client-urls", f"{ETCD_ENDPOINT},unix://{ETCD_SOCKET}",
        "--advertise-client-urls", ETCD_ENDPOINT,
        "--listen-peer-urls", _PEER_URL, "--initial-advertise-peer-urls", _PEER_URL,
        "--initial-cluster", f"dvml={_PEER_URL}", "--log-level", "warn",
        # One member: no peer can miss a heartbeat (see dvml.cluster.daemons.start_etcd).
        "--heartbeat-interval=10", "--election-timeout=100",
    ]  # fmt: skip
    proc = ManagedProcess("etcd", argv, log_path)
    if not poll_for(lambda: _healthy(sock) or not proc.alive(), timeout):
        proc.stop()
        raise ClusterStartError(
            f"etcd did not become healthy on its socket {sock} within {timeout:.0f}s. Its log "
            f"ends with:\n{proc.log_tail()}\nSet dvml.cluster.private-etcd: false to run it on "
            "loopback TCP instead."
        )
    if not proc.alive():
        raise ClusterStartError(
            f"etcd exited at once with code {proc.returncode()} in its private network "
            f"namespace. Its log ends with:\n{proc.log_tail()}\nSet dvml.cluster.private-etcd: "
            "false to run it on loopback TCP instead."
        )
    return proc, sock
