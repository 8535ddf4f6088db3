"""A LocalCluster that looks like a real one: etcd + one vineyardd per worker + Dask.

Several simulated hosts share this machine; every worker is a real Nanny process with its own
vineyardd, joined into one vineyard cluster through one etcd, exactly as on real hosts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dvml import config, tf_runtime
from dvml.cluster import worker_exit
from dvml.cluster.attach import Cluster
from dvml.cluster.daemons import start_etcd, start_vineyardd, vineyard_instance_id
from dvml.cluster.health import ETCD_ENV, register_owner, unregister_owner
from dvml.cluster.isolation import (
    ETCD_ENDPOINT,
    TRAINER_NAMESPACE_ENV,
    join_namespace,
    private_etcd_wanted,
    start_private_etcd,
)
from dvml.cluster.lifeline import CLUSTER_DIR_PREFIX, sweep_dead_clusters, write_owner
from dvml.cluster.main_guard import refuse_in_spawned_import, unguarded_main_hint
from dvml.cluster.processes import ManagedProcess, poll_for, port_is_free, server_port
from dvml.cluster.security import cluster_security, create_certificates, tls_enabled
from dvml.cluster.spec import LocalWorkerSpec, check_shared_memory, parse_memory, plan_workers
from dvml.cluster.workers import GPUS_ENV, HOST_ENV, SOCKET_ENV
from dvml.cluster.zygote import ZYGOTE_DIR_ENV
from dvml.exceptions import (
    ArgumentError,
    ClusterStartError,
    DaemonDiedError,
    VineyarddDiedError,
)

if TYPE_CHECKING:
    import pandas as pd
    from distributed.security import Security

__all__ = ["LocalCluster"]

logger = logging.getLogger("dvml.cluster")

DASHBOARD_PRELOAD = "dvml.dashboard"
"""The scheduler preload that serves dvml's page on the dashboard (a module name: the cluster
layer does not import the dashboard, the scheduler loads it)."""


class LocalCluster(Cluster):
    """Start etcd, one vineyardd per worker and a Dask cluster on this machine.

    Parameters
    ----------
    n_workers : int, optional
        Number of Dask workers, each with its own vineyardd (config ``cluster.n-workers``).
    gpus : int or sequence of int
        GPUs declared for every worker, or one count per worker. Declared GPUs become the
        worker's ``resources={"GPU": n}`` and appear in :func:`dvml.gpu_configuration`.
    hosts : int or sequence of str, optional
        Simulated hosts: a count (workers are spread over them in blocks) or one host name per
        worker. Default: one host per worker.
    vineyard_memory : int or str, optional
        Shared memory of each vineyardd, e.g. ``"512MiB"`` (config ``cluster.vineyard-memory``).
        Checked against free ``/dev/shm`` before anything starts.
    threads_per_worker : int, optional
        Threads of each Dask worker (config ``cluster.threads-per-worker``).
    memory_limit : str or int, optional
        Dask memory limit of each worker (config ``cluster.worker-memory-limit``).
    scheduler_port : int
        Port of the Dask scheduler; 0 picks a free one.
    dashboard_address : str or None
        Where the Dask dashboard listens (``None`` turns it off).
    start_timeout : float, optional
        Seconds to wait for each daemon (config ``cluster.start-timeout``).
    set_as_default : bool
        Make ``cluster.client`` the default Dask client, so dvml calls need no ``client=``.
    tls : bool, optional
        Serve Dask over TLS with a client certificate that only this user can read (config
        ``cluster.tls``, default True): other users of the machine cannot connect to the
        scheduler or the workers. ``cluster.security`` is the
        :class:`distributed.security.Security` to open more clients with.
    private_etcd : bool or "auto", optional
        Run etcd and the vineyardds in a private network namespace, so that only this user
        reaches etcd (config ``cluster.private-etcd``, default ``"auto"``: when the machine
        allows it). See :mod:`dvml.cluster.isolation`.

    Examples
    --------
    >>> with dvml.LocalCluster(n_workers=4, hosts=2, gpus=[1, 1, 0, 0]) as cluster:
    ...     print(cluster.worker_table())
    """

    def __init__(
        self,
        n_workers: int | None = None,
        gpus: int | Sequence[int] = 0,
        hosts: int | Sequence[str] | None = None,
        vineyard_memory: int | str | None = None,
        threads_per_worker: int | None = None,
        memory_limit: int | str | None = None,
        scheduler_port: int = 0,
        dashboard_address: str | None = "127.0.0.1:0",
        start_timeout: float | None = None,
        set_as_default: bool = True,
        tls: bool | None = None,
        private_etcd: bool | str | None = None,
    ) -> None:
        refuse_in_spawned_import()  # a worker process re-running an unguarded script
        config.validate()
        n = config.get("cluster.n-workers", n_workers)
        self.specs: list[LocalWorkerSpec] = plan_workers(n, gpus, hosts)
        self.vineyard_memory = parse_memory(config.get("cluster.vineyard-memory", vineyard_memory))
        check_shared_memory(self.vineyard_memory, len(self.specs))
        self._threads = int(config.get("cluster.threads-per-worker", threads_per_worker))
        if self._threads < 1:
            raise ArgumentError(
                f"threads_per_worker must be at least 1. Received: {threads_per_worker!r}."
            )
        self._memory_limit = config.get("cluster.worker-memory-limit", memory_limit)
        self._timeout = float(config.get("cluster.start-timeout", start_timeout))
        self._tls = tls_enabled(tls)
        self._namespace = private_etcd_wanted(private_etcd)
        self.security: Security | None = None
        self.tls_files: dict[str, str] | None = None
        self.etcd_socket: str | None = None
        if scheduler_port and not port_is_free(scheduler_port):
            raise ClusterStartError(
                f"The scheduler port {scheduler_port} on 127.0.0.1 is already taken. "
                "Choose another scheduler_port, or 0 for a free one."
            )

        # What a cluster whose owner was killed left behind (its daemons died with it).
        sweep_dead_clusters()
        # mkdtemp creates the directory with mode 0700: sockets, etcd data and logs stay private.
        self._state = _Started(tempfile.mkdtemp(prefix=CLUSTER_DIR_PREFIX))
        self.directory = self._state.directory
        write_owner(self.directory)
        self._set_as_default = set_as_default
        self.instance_ids: dict[str, int] = {}
        self._closed = False
        # Also runs at interpreter exit, when the user forgot to close the cluster.
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        try:
            self._start(scheduler_port, dashboard_address)
        except BaseException:
            self.close()
            raise
        super().__init__(self._client)

    # -- start -----------------------------------------------------------------------------

    def socket_path(self, spec: LocalWorkerSpec) -> str:
        """The IPC socket of one worker's vineyardd, in the cluster's 0700 directory.

        Parameters
        ----------
        spec : LocalWorkerSpec
            The worker.

        Returns
        -------
        str
            The socket's path.
        """
        return os.path.join(self.directory, "sockets", spec.socket_name)

    def _start(self, scheduler_port: int, dashboard_address: str | None) -> None:
        from distributed import Client, Nanny, Scheduler

        for sub in ("sockets", "logs", "dask"):
            os.makedirs(os.path.join(self.directory, sub), mode=0o700)
        log = os.path.join(self.directory, "logs")
        if self._tls:
            self.tls_files = create_certificates(os.path.join(self.directory, "tls"))
            self.security = cluster_security(self.tls_files)

        if self._namespace is not None:
            self._state.etcd, self.etcd_socket = start_private_etcd(
                self._namespace, self.directory, os.path.join(log, "etcd.log"), self._timeout
            )
            self.etcd_endpoint = ETCD_ENDPOINT  # inside the namespace only
        else:
            client_port = server_port()
            peer_port = next(p for p in iter(server_port, None) if p != client_port)
            self._state.etcd = start_etcd(
                os.path.join(self.directory, "etcd"),
                client_port,
                peer_port,
                os.path.join(log, "etcd.log"),
                self._timeout,
            )
            self.etcd_endpoint = f"http://127.0.0.1:{client_port}"
        # A fresh prefix per cluster: vineyard instances never see another cluster's objects.
        prefix = f"/dvml/{uuid.uuid4().hex[:12]}"
        self._prefix = prefix  # a worker added later joins the same vineyard cluster
        # vineyardds join one at a time: daemons that register concurrently race for their
        # instance rank and crash (SIGTRAP, vineyard 0.24.2). Dask starts meanwhile, in this
        # thread; workers need their socket only when they run tasks.
        errors: list[BaseException] = []

        def start_daemons() -> None:
            try:
                for spec in self.specs:
                    self._start_vineyardd(spec, prefix)
                    self._wait_for_vineyardd(spec, self.vineyardds[-1])
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)

        daemons = threading.Thread(target=start_daemons, name="dvml-vineyardd-start")
        daemons.start()

        workers = {spec.name: self._worker_spec(spec, Nanny) for spec in self.specs}
        scheduler = {
            "cls": Scheduler,
            "options": {
                "host": "127.0.0.1",
                "port": scheduler_port,
                "dashboard": dashboard_address is not None,
                # Without a dashboard the scheduler still serves /health and /metrics, by
                # default on 0.0.0.0:8787: keep them on a free loopback port.
                "dashboard_address": dashboard_address or "127.0.0.1:0",
                "protocol": "tls" if self.security is not None else "tcp",
                "security": self.security,
                # dvml's page on the dashboard (<dashboard>/dvml), served by this scheduler.
                "preload": [DASHBOARD_PRELOAD],
            },
        }
        try:
            self._start_dask(workers, scheduler)
        finally:
            daemons.join()  # never leave the thread starting daemons behind
        if errors:
            raise errors[0]
        self._client = Client(
            self._state.dask, security=self.security, set_as_default=self._set_as_default
        )
        self._client.wait_for_workers(len(self.specs), timeout=self._timeout)
        # dvml calls made through this cluster's scheduler ask this process about its daemons.
        register_owner(str(getattr(self._client.scheduler, "address", "")), _weak_check(self))

    def _start_dask(self, workers: dict[str, Any], scheduler: dict[str, Any]) -> None:
        import dask
        from distributed import SpecCluster

        settings = {
            # A task pinned to a worker that is gone fails after this timeout, not never.
            "distributed.scheduler.no-workers-timeout": "60s",
            # The scheduler's scratch space stays in the cluster's private directory.
            "temporary-directory": os.path.join(self.directory, "dask"),
        }
        try:
            with dask.config.set(settings):
                self._state.dask = SpecCluster(
                    workers=workers,
                    scheduler=scheduler,
                    silence_logs=logging.WARNING,
                    name="dvml-local",
                    security=self.security,
                )
        except RuntimeError as exc:
            hint = unguarded_main_hint()
            raise ClusterStartError(
                f"The Dask scheduler or workers failed to start: {str(exc).rstrip('.')}."
                + (hint or " Check that the scheduler_port and dashboard_address are free;")
                + " The cluster was cleaned up."
            ) from exc

    # -- grow ------------------------------------------------------------------------------

    def add_worker(self, gpus: int = 0, host: str | None = None) -> str:
        """Start one more Dask worker with its own vineyardd and wait until it is ready.

        The worker gets the same spec as the others (vineyard memory, threads, memory limit,
        TLS, the cluster's etcd) plus ``gpus`` declared GPUs (``resources={"GPU": gpus}``).
        dvml's worker plugins reach it through the scheduler, which keeps them for workers
        that join; :meth:`refresh` is called so that :attr:`workers` lists it. Datasets packed
        before do not hold rows on it until :func:`dvml.datasets.rebalance` moves some there.
        :meth:`close` stops it with the rest.

        Parameters
        ----------
        gpus : int
            GPUs declared for the new worker.
        host : str, optional
            Its simulated host (default: a host of its own).

        Returns
        -------
        str
            The new worker's address.
        """
        from distributed import Nanny

        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ArgumentError(f"gpus must be an int >= 0. Received: gpus={gpus!r}.")
        if self._closed or self._state.dask is None:
            raise ClusterStartError(
                "add_worker needs a running LocalCluster. Received: a closed cluster; start "
                "a new one."
            )
        check_shared_memory(self.vineyard_memory, 1)
        i = max(s.index for s in self.specs) + 1
        host = host or f"host-{i}"
        first = sum(len(s.gpus) for s in self.specs if s.host == host)
        spec = LocalWorkerSpec(
            index=i,
            name=f"worker-{i}",
            host=host,
            gpus=tuple(
                f"GPU {g}: Declared GPU (simulated) on {host}" for g in range(first, first + gpus)
            ),
            socket_name=f"vineyard-{i}.sock",
        )
        self._start_vineyardd(spec, self._prefix)
        self.specs.append(spec)
        self._wait_for_vineyardd(spec, self.vineyardds[-1])
        dask_cluster = self._state.dask
        known = set(self._client.scheduler_info(n_workers=-1)["workers"])
        # SpecCluster starts whatever its worker_spec lists that is not running yet.
        dask_cluster.worker_spec[spec.name] = self._worker_spec(spec, Nanny)
        dask_cluster.sync(dask_cluster._correct_state)
        self._client.wait_for_workers(len(self.specs), timeout=self._timeout)
        added = set(self._client.scheduler_info(n_workers=-1)["workers"]) - known
        self.refresh()
        if len(added) != 1:
            raise ClusterStartError(
                f"add_worker expected one new worker on the scheduler. Received: {sorted(added)}."
            )
        return added.pop()

    @property
    def etcd(self) -> ManagedProcess | None:
        """The etcd process this cluster started (None before it starts)."""
        return self._state.etcd

    @property
    def vineyardds(self) -> list[ManagedProcess]:
        """The vineyardd processes this cluster started, one per worker."""
        return self._state.vineyardds

    def _start_vineyardd(self, spec: LocalWorkerSpec, prefix: str) -> None:
        logs = os.path.join(self.directory, "logs")
        wrapper: list[str] = []
        if self._namespace is not None and self.etcd is not None:
            wrapper = join_namespace(self._namespace, self.etcd.pid, [])
        self.vineyardds.append(
            start_vineyardd(
                f"vineyardd of {spec.name}",
                self.socket_path(spec),
                self.vineyard_memory,
                self.etcd_endpoint,
                prefix,
                os.path.join(logs, f"vineyardd-{spec.index}.log"),
                # glog's own files: in the private directory, removed with it.
                log_dir=logs,
                wrapper=wrapper,
            )
        )

    def _worker_spec(self, spec: LocalWorkerSpec, nanny_cls: Any) -> dict[str, Any]:
        env = {
            SOCKET_ENV: self.socket_path(spec),
            # For dvml.cluster.health's probes: a private etcd is reachable from the workers
            # only through its socket (its TCP endpoint is inside the namespace).
            ETCD_ENV: f"unix://{self.etcd_socket}" if self.etcd_socket else self.etcd_endpoint,
            HOST_ENV: spec.host,
            GPUS_ENV: json.dumps(list(spec.gpus)),
            # A dead vineyardd must fail a task at once, not after vineyard's 10 retries.
            "VINEYARD_IPC_SKIP_RETRY": "1",
            # tf-keras (MultiWorkerMirroredStrategy needs it) and a quiet TensorFlow.
            **tf_runtime.process_environment(),
            # The Dask workers of this machine share its cores (dvml.tf_runtime's budget);
            # simulated hosts are still one machine.
            tf_runtime.WORKERS_ON_HOST_ENV: str(len(self.specs)),
            # The workers' trainers are forked by one zygote, whose socket is the cluster's.
            ZYGOTE_DIR_ENV: os.path.join(self.directory, "sockets"),
        }
        if self._namespace is not None and self.etcd is not None:
            # Trainers run in etcd's namespace: their gRPC servers bind every interface.
            env[TRAINER_NAMESPACE_ENV] = f"{self._namespace}:{self.etcd.pid}"
        local_directory = os.path.join(self.directory, "dask", spec.name)
        os.makedirs(local_directory, mode=0o700, exist_ok=True)
        # The worker's temporary files (TensorFlow's autograph modules among them, which a
        # process leaving with os._exit never deletes) live and go with the cluster's directory.
        env["TMPDIR"] = os.path.join(local_directory, "tmp")
        os.makedirs(env["TMPDIR"], mode=0o700, exist_ok=True)
        options: dict[str, Any] = {
            "name": spec.name,
            "host": "127.0.0.1",
            "nthreads": self._threads,
            "memory_limit": self._memory_limit,
            "env": env,
            "local_directory": local_directory,
            "security": self.security,
            "dashboard": False,
            "dashboard_address": "127.0.0.1:0",  # /health and /metrics: else on 0.0.0.0
            "silence_logs": logging.WARNING,
            # A worker that ran TensorFlow (evaluate, predict) exits at once when it closes,
            # instead of being SIGKILLed by its Nanny after 4 s (dvml.cluster.worker_exit).
            "preload": [worker_exit.PRELOAD],
        }
        if spec.gpus:
            options["resources"] = {"GPU": len(spec.gpus)}
        return {"cls": nanny_cls, "options": options}

    def _wait_for_vineyardd(self, spec: LocalWorkerSpec, proc: ManagedProcess) -> None:
        found: list[int] = []

        def ready() -> bool:
            if not proc.alive():
                return True
            iid = vineyard_instance_id(self.socket_path(spec))
            if iid is not None:
                found.append(iid)
            return bool(found)

        poll_for(ready, self._timeout, interval=0.05)
        if not proc.alive():
            raise ClusterStartError(
                f"The vineyardd of {spec.name} exited at once with code {proc.returncode()}. "
                f"Its log ends with:\n{proc.log_tail()}"
            )
        if not found:
            raise ClusterStartError(
                f"The vineyardd of {spec.name} did not open {self.socket_path(spec)} within "
                f"{self._timeout:.0f}s. Its log ends with:\n{proc.log_tail()}"
            )
        self.instance_ids[spec.name] = found[0]

    # -- inspect ---------------------------------------------------------------------------

    def processes(self) -> dict[str, int]:
        """Pids of every process this cluster started: etcd, vineyardds and Dask workers.

        Returns
        -------
        dict of str to int
            The pid of each, by a name that says what it is (``"vineyardd of worker-0"``).
        """
        pids = {"etcd": self.etcd.pid} if self.etcd else {}
        for spec, proc in zip(self.specs, self.vineyardds, strict=False):
            pids[f"vineyardd of {spec.name}"] = proc.pid
        if self._state.dask is not None:
            for name, nanny in self._state.dask.workers.items():
                if getattr(nanny, "process", None) is not None and nanny.process.pid:
                    pids[f"dask worker {name}"] = int(nanny.process.pid)
        return pids

    def status(self) -> pd.DataFrame:
        """Every worker with the state of its vineyardd process, plus the etcd state.

        A dead daemon shows as ``"dead (exit N)"``; the table says which worker it served.

        Returns
        -------
        pandas.DataFrame
            :meth:`Cluster.status` with ``vineyardd_process`` and ``etcd``.
        """
        table = super().status()
        states = {}
        for spec, proc in zip(self.specs, self.vineyardds, strict=True):
            states[spec.name] = "running" if proc.alive() else f"dead (exit {proc.returncode()})"
        table["vineyardd_process"] = [states.get(n, "unknown") for n in table["name"]]
        etcd_alive = self.etcd is not None and self.etcd.alive()
        table["etcd"] = "running" if etcd_alive else "dead"
        return table

    def check_daemons(self) -> None:
        """Raise :class:`DaemonDiedError` naming the first dead etcd or vineyardd."""
        if self.etcd is not None and not self.etcd.alive():
            raise DaemonDiedError(
                f"etcd (pid {self.etcd.pid}) of this LocalCluster is not running (exit "
                f"{self.etcd.returncode()}); vineyard metadata cannot be shared. Restart the "
                "cluster."
            )
        for spec, proc in zip(self.specs, self.vineyardds, strict=True):
            if not proc.alive():
                raise VineyarddDiedError(
                    f"The vineyardd of {spec.name} (pid {proc.pid}, socket "
                    f"{self.socket_path(spec)}) is not running (exit {proc.returncode()}). "
                    "Data on that worker is lost; restart the cluster."
                )

    # -- stop ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process this cluster started and remove its sockets and data."""
        if self._closed:
            return
        self._closed = True
        client = getattr(self, "_client", None)
        if client is not None:
            unregister_owner(str(getattr(client.scheduler, "address", "")))
            client.close()
        self._finalizer()

    def __enter__(self) -> LocalCluster:
        return self

    def __repr__(self) -> str:
        hosts = sorted({s.host for s in self.specs})
        gpus = sum(len(s.gpus) for s in self.specs)
        return (
            f"<dvml.LocalCluster {getattr(self, 'scheduler_address', '?')} "
            f"workers={len(self.specs)} hosts={len(hosts)} gpus={gpus}>"
        )


def _weak_check(cluster: LocalCluster) -> Callable[[], None]:
    """``cluster.check_daemons`` without keeping the cluster alive (its finalizer must run)."""
    ref = weakref.WeakMethod(cluster.check_daemons)

    def check() -> None:
        method = ref()
        if method is not None:
            method()

    return check


@dataclasses.dataclass
class _Started:
    """What a LocalCluster has started so far; the finalizer stops exactly these."""

    directory: str
    etcd: ManagedProcess | None = None
    vineyardds: list[ManagedProcess] = dataclasses.field(default_factory=list)
    dask: Any = None


def _shutdown(state: _Started) -> None:
    """Stop Dask, then the vineyard daemons, then etcd; remove the private directory."""
    if state.dask is not None:
        try:
            state.dask.close(timeout=20)
        except Exception:  # the workers may already be gone; the processes are checked below
            logger.debug("closing Dask failed", exc_info=True)
    for proc in state.vineyardds:  # SIGTERM all first, so they stop in parallel
        proc.terminate()
    for proc in state.vineyardds:
        # vineyardd 0.24.2 sometimes hangs after SIGTERM (its log ends with "Watcher
        # stopped"). Its memory and etcd keys die with the cluster anyway: SIGKILL soon.
        proc.stop(timeout=3.0)
    if state.etcd is not None:
        state.etcd.stop()
    shutil.rmtree(state.directory, ignore_errors=True)
