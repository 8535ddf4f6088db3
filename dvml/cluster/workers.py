"""What dvml knows about each worker, discovered from the workers themselves.

A worker tells its simulated or real host (:func:`worker_host`), its vineyard
socket (``VINEYARD_IPC_SOCKET``), the instance id of that vineyardd and its GPUs (declared in
``DVML_GPUS`` for a simulated cluster, else found with ``nvidia-smi -L``).
:func:`discover_workers` asks every worker of the :func:`current_client`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import urllib.parse
from typing import TYPE_CHECKING, Any

from dvml.cluster.connection import local_client
from dvml.cluster.health import bounded_run, daemon_timeout, require_daemons
from dvml.cluster.security import recorded_security
from dvml.cluster.state import recorded_scheduler
from dvml.exceptions import ClusterError, DaemonDiedError

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "WorkerInfo",
    "current_client",
    "describe_this_worker",
    "detect_gpus",
    "discover_workers",
    "gpu_index",
    "parse_nvidia_smi_list",
    "visible_gpus",
    "worker_host",
]

HOST_ENV = "DVML_HOST"
_DISCOVER_ROUNDS = 3
GPUS_ENV = "DVML_GPUS"
SOCKET_ENV = "VINEYARD_IPC_SOCKET"


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One Dask worker and the vineyard instance and GPUs that belong to it.

    Parameters
    ----------
    address : str
        The worker's Dask address (``tcp://...`` or ``tls://...``).
    name : str
        The worker's name.
    host : str
        Its host name (``DVML_HOST``, else its address's host).
    vineyard_socket : str or None
        The IPC socket of its vineyardd (None: none reachable).
    vineyard_instance_id : int or None
        Its vineyardd's instance id.
    gpus : tuple of str
        The GPUs it owns (``nvidia-smi -L`` descriptions).
    pid : int
        The worker process's id.
    """

    address: str
    name: str
    host: str
    vineyard_socket: str | None
    vineyard_instance_id: int | None
    gpus: tuple[str, ...]
    pid: int

    @property
    def n_gpus(self) -> int:
        """How many GPUs it owns."""
        return len(self.gpus)

    def as_row(self) -> dict[str, Any]:
        """The worker as one row of a worker table.

        Returns
        -------
        dict
            The fields, with ``gpus`` as a count.
        """
        row = dataclasses.asdict(self)
        row["gpus"] = len(self.gpus)
        return row

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerInfo:
        """The worker that :func:`dataclasses.asdict` gave as ``d`` (e.g. after JSON).

        Parameters
        ----------
        d : dict
            The fields; ``gpus`` as a list or tuple.

        Returns
        -------
        WorkerInfo
            The worker.
        """
        return cls(**{**d, "gpus": tuple(d.get("gpus", ()))})


_NVIDIA_SMI_LINE = re.compile(r"^GPU\s+(\d+):\s*(.+?)(?:\s+\(UUID:\s*([^)]+)\))?\s*$")


def parse_nvidia_smi_list(text: str) -> list[str]:
    """Parse the output of ``nvidia-smi -L`` into one description per GPU.

    ``"GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"`` becomes ``"GPU 0: NVIDIA H100 80GB
    HBM3"``. MIG lines (indented) and blank lines are ignored.
    """
    gpus = []
    for line in text.splitlines():
        m = _NVIDIA_SMI_LINE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if m:
            gpus.append(f"GPU {m.group(1)}: {m.group(2)}")
    return gpus


def detect_gpus() -> tuple[str, ...]:
    """GPUs of this process's host: declared ones first, else ``nvidia-smi -L``.

    Never initialises CUDA or TensorFlow, so no GPU memory is taken.
    """
    declared = os.environ.get(GPUS_ENV)
    if declared is not None:
        return tuple(json.loads(declared))
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    return tuple(
        visible_gpus(parse_nvidia_smi_list(out.stdout), os.environ.get("CUDA_VISIBLE_DEVICES"))
    )


def visible_gpus(gpus: list[str], cuda_visible_devices: str | None) -> list[str]:
    """Keep the GPUs a worker may use: ``CUDA_VISIBLE_DEVICES`` (indices) when it is set.

    Several workers on one host each see only their own GPUs this way, so the inventory does
    not list a GPU once per worker.
    """
    if cuda_visible_devices is None or not cuda_visible_devices.strip():
        return gpus if cuda_visible_devices is None else []
    wanted = [d.strip() for d in cuda_visible_devices.split(",")]
    if not all(d.isdigit() for d in wanted):  # UUIDs or MIG names: keep all, cannot map
        return gpus
    by_index = {gpu_index(g): g for g in gpus}
    return [by_index[int(d)] for d in wanted if int(d) in by_index]


def gpu_index(description: str) -> int | None:
    """The host-level index in ``"GPU 3: ..."``, or None."""
    m = re.match(r"GPU (\d+):", description)
    return int(m.group(1)) if m else None


def _local_instance_id() -> int | None:
    """The instance id of this worker's vineyardd, through the process's shared connection."""
    try:
        return int(local_client().instance_id)
    except DaemonDiedError:
        return None


def worker_host(address: str) -> str:
    """The host of the worker at ``address``, as worker tables, buffers and rules name it.

    ``DVML_HOST`` when it is set (a :class:`~dvml.LocalCluster` simulates hosts with it; a
    deployment may name its hosts), else the host part of the worker's address
    (``tcp://10.0.0.5:40123`` → ``10.0.0.5``): what tells the machines of a real multi-host
    cluster apart, the same for every worker of one machine whatever its port. Run in the
    worker's own process (it reads the worker's environment).
    """
    named = os.environ.get(HOST_ENV)
    if named:
        return named
    host = urllib.parse.urlsplit(address).hostname if "://" in address else None
    return host or address


def describe_this_worker(dask_worker: Any) -> dict[str, Any]:
    """Run on a worker (through ``client.run``): describe it as a :class:`WorkerInfo` dict."""
    sock = os.environ.get(SOCKET_ENV)
    return {
        "address": dask_worker.address,
        "name": str(dask_worker.name),
        "host": worker_host(dask_worker.address),
        "vineyard_socket": sock,
        "vineyard_instance_id": _local_instance_id() if sock else None,
        "gpus": list(detect_gpus()),
        "pid": os.getpid(),
    }


# Clients this process opened to the cluster recorded by `dvml cluster up`: distributed keeps
# only weak references to its default client, so one made here must be held to stay default.
_RECORDED_CLIENTS: list[Client] = []

# How long current_client() waits for the recorded cluster's scheduler (dvml.connect's default).
_RECORDED_TIMEOUT_S = 30.0


def current_client(client: Client | None = None) -> Client:
    """Return ``client``, else the default Dask client, else one to the recorded cluster.

    With no default client, the cluster that ``dvml cluster up`` recorded in the state
    directory (``dvml.cluster.state-dir``) is attached to, with its TLS certificate, as the
    ``dvml`` commands do, and becomes the default client.

    Raises
    ------
    NoClusterError
        No client, and no cluster recorded.
    ClusterError
        The recorded cluster is not running, or its scheduler does not answer.
    """
    if client is not None:
        return client
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        pass
    return _recorded_client()


def _recorded_client() -> Client:
    from distributed import Client

    address = recorded_scheduler()  # NoClusterError says what to do next
    try:
        client = Client(
            address,
            timeout=_RECORDED_TIMEOUT_S,
            security=recorded_security(address),
            set_as_default=True,
        )
    except OSError as exc:
        raise ClusterError(
            f"Cannot reach the Dask scheduler at {address!r}, recorded by `dvml cluster up`, "
            f"within {_RECORDED_TIMEOUT_S:.0f}s: {exc}. Check it with `dvml cluster status`."
        ) from exc
    _RECORDED_CLIENTS.append(client)
    return client


def _natural_key(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def discover_workers(client: Client | None = None, omit_silent: bool = False) -> list[WorkerInfo]:
    """Ask every worker for its host, vineyard socket and instance, and GPUs.

    Returns the workers sorted by name (``worker-2`` before ``worker-10``). Each worker is
    given ``cluster.daemon-timeout`` seconds to answer (a worker whose vineyard call waits on a
    dead etcd is frozen, see :mod:`dvml.cluster.health`); when one is silent the daemons are
    checked, and while they all run (a slow worker, e.g. importing vineyard on a busy host) it
    is asked again, ``_DISCOVER_ROUNDS`` times in all.

    Raises
    ------
    DaemonDiedError
        Naming the workers that did not answer in time, unless ``omit_silent`` (then they are
        left out).
    """
    import time

    client = current_client(client)
    timeout = daemon_timeout()
    if not omit_silent:
        # A dead etcd is named at once, before a broadcast waits for a worker it froze (a
        # dead vineyardd freezes nothing: its worker answers, without an instance id).
        require_daemons(client, vineyardd=False)
    # One daemon-timeout for the whole discovery, its rounds included: a frozen worker costs
    # a call that long, never a multiple of it (issue 28).
    deadline = time.monotonic() + timeout
    answers = bounded_run(client, describe_this_worker, timeout=timeout)
    for _ in range(_DISCOVER_ROUNDS - 1):
        silent = [a for a, d in answers.items() if not isinstance(d, dict)]
        left = deadline - time.monotonic()
        if not silent or omit_silent or left < 1.0:
            break
        require_daemons(client)  # a daemon that died meanwhile is named at once
        answers.update(bounded_run(client, describe_this_worker, timeout=left, workers=silent))
    silent = [a for a, d in answers.items() if not isinstance(d, dict)]
    if silent and not omit_silent:
        raise DaemonDiedError(
            f"Workers {silent} did not describe themselves within {timeout:.0f}s "
            "(cluster.daemon-timeout). A worker freezes when its vineyard call waits on a dead "
            "etcd, or when it was stopped (SIGSTOP): check `dvml cluster status`, and restart "
            "the cluster if a daemon died."
        )
    infos = [WorkerInfo.from_dict(d) for d in answers.values() if isinstance(d, dict)]
    return sorted(infos, key=lambda w: _natural_key(w.name))
