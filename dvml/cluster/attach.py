"""Attaching to a running cluster: the :class:`Cluster` handle and :func:`connect`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dvml.cluster.connection import local_client
from dvml.cluster.gpu import gpu_configuration
from dvml.cluster.health import bounded_run, daemon_timeout, known_dead, probe_daemons
from dvml.cluster.security import resolve_security
from dvml.cluster.state import recorded_scheduler
from dvml.cluster.workers import WorkerInfo, discover_workers
from dvml.exceptions import ClusterError
from dvml.limits import check_seconds

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

__all__ = ["Cluster", "connect"]


async def _probe_vineyard_async() -> dict[str, Any]:
    # In a thread: the vineyard call must not block the worker's event loop.
    import asyncio

    return await asyncio.to_thread(_probe_vineyard)


def _probe_vineyard() -> dict[str, Any]:
    """Run on a worker: can its vineyardd and its etcd be reached, and how full is it?"""
    sock = os.environ.get("VINEYARD_IPC_SOCKET")
    daemons = probe_daemons()
    etcd = {None: "unknown", True: "running", False: "unreachable"}[daemons["etcd"]]
    if not sock:
        return {"vineyardd": "not configured", "memory_used": None, "memory_limit": None,
                "etcd_reachable": etcd}  # fmt: skip
    if not os.path.exists(sock):
        return {"vineyardd": "socket missing", "memory_used": None, "memory_limit": None,
                "etcd_reachable": etcd}  # fmt: skip
    if not daemons["vineyardd"]:  # refuses connections: asking the client would only retry
        return {"vineyardd": "not running (connection refused)", "memory_used": None,
                "memory_limit": None, "etcd_reachable": etcd}  # fmt: skip
    try:
        st = local_client().status  # the process's shared connection: never closed here
    except Exception as exc:
        return {
            "vineyardd": f"unreachable ({type(exc).__name__})",
            "memory_used": None,
            "memory_limit": None,
            "etcd_reachable": etcd,
        }
    return {
        "vineyardd": "running",
        "memory_used": int(st.memory_usage),
        "memory_limit": int(st.memory_limit),
        "etcd_reachable": etcd,
    }


_PLUGIN_WAIT_S = 5.0
"""How long attaching waits at most for every worker to install the plugin (then it goes on);
a quarter of ``cluster.daemon-timeout`` when that is shorter."""


def _register_worker_plugins(client: Client, wait: bool = True) -> None:
    """Install dvml's worker plugins on every worker, waiting ``_PLUGIN_WAIT_S`` at most.

    :class:`~dvml.cluster.worker_logging.QuietDvmlFailures`: failures dvml reports itself are
    not logged a second time by the workers. :class:`~dvml.cluster.worker_metrics.
    VineyardMetrics`: each worker's vineyardd bytes go to the scheduler with its heartbeats
    (dvml's dashboard page shows them).

    ``wait=False`` (a daemon is known dead: a worker may be frozen) does not wait at all. The
    scheduler keeps the plugins and broadcasts them to every worker: one frozen worker (a
    vineyard call waiting on a dead etcd, a SIGSTOP) would hold ``register_plugin`` forever,
    and with it ``dvml.connect`` and every command (issue 28: 297 s). The registration goes on
    in the background past the bound (the plugins are cosmetic; the scheduler installs them on
    workers that answer later).
    """
    import asyncio

    from dvml.cluster.worker_logging import QuietDvmlFailures
    from dvml.cluster.worker_metrics import VineyardMetrics

    plugins: list[QuietDvmlFailures | VineyardMetrics] = [QuietDvmlFailures(), VineyardMetrics()]

    async def register() -> None:
        tasks = [
            asyncio.ensure_future(client._register_worker_plugin(p, name=p.name, idempotent=False))
            for p in plugins
        ]
        for task in tasks:
            # Retrieved whatever happens, so that a late failure is not logged as never retrieved.
            task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
        # no gather: a gathering future that fails after the bound would be a second holder
        # of the error, never retrieved
        done, _ = await asyncio.wait(tasks, timeout=bound)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    bound = min(_PLUGIN_WAIT_S, daemon_timeout() / 4) if wait else 0.0

    client.sync(register)


def dvml_page_link(dashboard_link: str) -> str:
    """dvml's page beside Dask's: ``http://h:8787/status`` → ``http://h:8787/dvml``."""
    base = dashboard_link.rstrip("/")
    if base.endswith("/status"):
        base = base[: -len("/status")]
    return f"{base}/dvml"


class Cluster:
    """A handle on a running Dask + vineyard cluster.

    Obtained from :func:`connect` (a cluster started elsewhere) or as the base of
    :class:`~dvml.LocalCluster`.

    Parameters
    ----------
    client : distributed.Client
        A connected client, kept as ``.client``.
    wait_for_workers : bool
        Wait (boundedly) until the workers have dvml's worker plugins.
    """

    client: Client

    def __init__(self, client: Client, wait_for_workers: bool = True) -> None:
        self.client = client
        self._workers: list[WorkerInfo] | None = None
        _register_worker_plugins(client, wait=wait_for_workers)

    @property
    def scheduler_address(self) -> str:
        """The scheduler's address (``tcp://...`` or ``tls://...``)."""
        return str(getattr(self.client.scheduler, "address", ""))

    @property
    def dashboard_link(self) -> str:
        """The Dask dashboard's URL."""
        return str(self.client.dashboard_link)

    @property
    def dvml_dashboard_link(self) -> str:
        """dvml's page on the Dask dashboard: datasets, workers' vineyard bytes, training jobs
        (served by a scheduler started with the preload ``dvml.dashboard``: a LocalCluster's,
        ``dvml cluster up``'s and ``cluster/scheduler.sh``'s are)."""
        return dvml_page_link(self.dashboard_link)

    @property
    def workers(self) -> list[WorkerInfo]:
        """Every worker with its host, vineyard socket and instance id, and GPUs."""
        if self._workers is None:
            # A frozen worker (see dvml.cluster.health) is left out rather than waited for.
            self._workers = discover_workers(self.client, omit_silent=True)
        return self._workers

    def refresh(self) -> list[WorkerInfo]:
        """Discover the workers again (after workers joined or left).

        Returns
        -------
        list of WorkerInfo
            The workers now (:attr:`workers`).
        """
        self._workers = None
        return self.workers

    def worker_table(self) -> pd.DataFrame:
        """The workers as a table.

        Returns
        -------
        pandas.DataFrame
            One row per worker: address, name, host, vineyard socket and id, GPU count, pid.
        """
        import pandas as pd

        return pd.DataFrame([w.as_row() for w in self.workers])

    def status(self) -> pd.DataFrame:
        """The worker table plus the state of each worker's vineyardd and its memory.

        Bounded by ``cluster.daemon-timeout``: a worker that does not answer (frozen by a
        vineyard call waiting on a dead etcd) is listed with ``vineyardd`` "worker not
        answering" instead of hanging the call.

        Returns
        -------
        pandas.DataFrame
            :meth:`worker_table` with ``vineyardd``, ``memory_used``, ``memory_limit`` and
            ``etcd_reachable``.
        """
        import pandas as pd

        self._workers = None
        table = self.worker_table()
        known = set(table["address"]) if "address" in table else set()
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        silent = [{"address": a, "name": str(w.get("name")), "pid": w.get("pid")}
                  for a, w in info.items() if a not in known]  # fmt: skip
        if silent:
            table = pd.concat([table, pd.DataFrame(silent)], ignore_index=True)
        probes = bounded_run(self.client, _probe_vineyard_async)
        missing = {"vineyardd": "worker not answering", "memory_used": None,
                   "memory_limit": None, "etcd_reachable": "unknown"}  # fmt: skip
        rows = [probes.get(a) for a in table.get("address", [])]
        extra = pd.DataFrame([r if isinstance(r, dict) else missing for r in rows])
        return pd.concat([table.reset_index(drop=True), extra], axis=1)

    def gpu_configuration(self) -> pd.DataFrame:
        """The GPUs of every worker host (:func:`dvml.gpu_configuration`).

        Returns
        -------
        pandas.DataFrame
            As :func:`dvml.gpu_configuration` returns.
        """
        return gpu_configuration(self.client)

    def close(self) -> None:
        """Close the client; a cluster attached with :func:`connect` keeps running."""
        self.client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        n = len(self._workers) if self._workers is not None else "?"
        return f"<{type(self).__name__} {self.scheduler_address} workers={n}>"


def _tls_configured() -> bool:
    """Whether Dask's configuration gives a client certificate (distributed.comm.tls.*)."""
    import dask.config

    return bool(dask.config.get("distributed.comm.tls.client.cert", None))


def connect(address: str | None = None, timeout: float = 30, security: Any = None) -> Cluster:
    """Attach to a running cluster and discover its worker ↔ vineyard mapping.

    Parameters
    ----------
    address : str, optional
        The Dask scheduler address, e.g. ``"tcp://10.0.0.5:8786"`` or ``"tls://..."``. None:
        the cluster recorded by ``dvml cluster up`` in the state directory
        (``dvml.cluster.state-dir``), with its TLS certificate, as the ``dvml`` commands do.
    timeout : float
        Seconds to wait for the scheduler.
    security : distributed.security.Security or dict, optional
        TLS credentials: a ``Security`` object, or the paths ``{"ca": ..., "cert": ...,
        "key": ...}``. None: the certificates of the cluster that ``dvml cluster up``
        recorded for this address, else Dask's configuration (``distributed.comm.tls.*``).

    Returns
    -------
    Cluster
        Whose ``client`` is set as the default client.
    """
    from distributed import Client

    # A NaN, negative or 1e300 timeout would never end (or fail deep in Dask): dvml.limits.
    timeout = check_seconds(timeout, "timeout")
    if address is None:
        address = recorded_scheduler()
    resolved = resolve_security(security, address)
    if address.startswith("tls://") and resolved is None and not _tls_configured():
        raise ClusterError(
            f"The scheduler at {address!r} serves TLS, and no certificate was given. Received: "
            "security=None, and no running `dvml cluster up` cluster records this address. "
            "Pass security= (a distributed.security.Security, or the paths {'ca': ..., "
            "'cert': ..., 'key': ...}), or set distributed.comm.tls.* in the Dask "
            "configuration."
        )
    try:
        client = Client(address, timeout=timeout, security=resolved, set_as_default=True)
    except OSError as exc:
        raise ClusterError(
            f"Cannot reach the Dask scheduler at {address!r} within {timeout}s: {exc}. "
            "Check the address and that the scheduler is running (`dvml cluster status`)."
        ) from exc
    # The daemons first: with one dead, the calls that need it name it at once, and asking
    # every worker now would only wait for one that a vineyard call on a dead etcd froze.
    dead = known_dead(client)
    cluster = Cluster(client, wait_for_workers=dead is None)
    if dead is not None:
        return cluster
    missing = [w.name for w in cluster.workers if w.vineyard_instance_id is None]
    if missing:
        import warnings

        warnings.warn(
            f"Workers {missing} have no reachable vineyardd (VINEYARD_IPC_SOCKET unset or "
            "its daemon down); dvml will not place data on them. See cluster/README.md.",
            stacklevel=2,
        )
    return cluster
