"""Datasets as first-class objects: list, describe, exists, drop, and a handle that shows them.

Every call runs small tasks on the workers (which own the vineyard instances); no tensor data
reaches the client.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import TYPE_CHECKING, Any

from dvml.cluster.health import require_daemons, wait_watched
from dvml.cluster.workers import WorkerInfo, current_client, discover_workers
from dvml.exceptions import ClusterError, DvmlError, StoreError
from dvml.store import catalog
from dvml.store.events import log_dropped
from dvml.store.leases import unleased
from dvml.store.tensors import delete_objects
from dvml.store.versions import at_version, summary_at

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

__all__ = [
    "Dataset",
    "buffer_workers",
    "describe",
    "drop",
    "exists",
    "list",
    "lost_buffers",
    "resolve_dataset",
    "run_on",
    "versions",
    "vineyard_workers",
]


def vineyard_workers(client: Client, all_vineyardds: bool = True) -> dict[int, WorkerInfo]:
    """Workers that have a reachable vineyardd, by vineyard instance id.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    all_vineyardds : bool
        Require every vineyardd of the cluster to run; False needs etcd and one live
        vineyardd only (enough to read the catalog).

    Returns
    -------
    dict of int to WorkerInfo
        The workers by vineyard instance id.

    Raises
    ------
    DaemonDiedError
        First, when etcd or (with ``all_vineyardds``) a vineyardd is not running: every dvml
        call that touches vineyard passes here.
    """
    require_daemons(client, vineyardd=all_vineyardds)
    return {
        w.vineyard_instance_id: w
        for w in discover_workers(client)
        if w.vineyard_instance_id is not None
    }


def lost_buffers(layout: dict[str, Any], live_instances: Any) -> tuple[int, ...]:
    """Indexes of the buffers of ``layout`` whose vineyard instance is not in ``live_instances``.

    A buffer lives in the shared memory of one vineyardd; when no live worker serves that
    instance any more (its daemon died, or its host left the cluster), the buffer's rows are
    gone even though the dataset's name and metadata, kept in etcd, still list them.

    Parameters
    ----------
    layout : dict
        A dataset's layout (``Dataset.layout``): its ``buffers`` with their
        ``instance_id``.
    live_instances : iterable of int
        The vineyard instances that live workers serve.

    Returns
    -------
    tuple of int
        The lost buffers' indexes, in buffer order.
    """
    live = set(live_instances)
    return tuple(b["index"] for b in layout["buffers"] if b["instance_id"] not in live)


def with_health(client: Client, found: builtins.list[Dataset]) -> builtins.list[Dataset]:
    """``found`` with :attr:`Dataset.lost_buffers` filled in from the workers alive now."""
    live = vineyard_workers(client, all_vineyardds=False)
    return [dataclasses.replace(ds, lost_buffers=lost_buffers(ds.layout, live)) for ds in found]


def buffer_workers(
    client: Client, dataset: Dataset, error: type[DvmlError] = StoreError
) -> builtins.list[WorkerInfo]:
    """The live worker of every buffer of ``dataset``, in buffer order.

    The one mapping from where a dataset's buffers were put to the workers that serve those
    vineyard instances now, used by fit, evaluate and the feature cache.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    dataset : Dataset
        The dataset.
    error : type of DvmlError
        The error class to raise when a buffer is lost.

    Returns
    -------
    list of WorkerInfo
        One worker per buffer.

    Raises
    ------
    StoreError
        (or ``error``, the caller's own class) when a buffer's vineyardd is served by no live
        worker: its data is lost.
    """
    by_instance = vineyard_workers(client)
    buffers = dataset.layout["buffers"]
    lost = sorted({(b["worker_name"], b["instance_id"]) for b in buffers
                   if b["instance_id"] not in by_instance})  # fmt: skip
    if lost:
        raise error(
            f"Buffers of {dataset.name!r} lived on {[w for w, _ in lost]} (vineyard instances "
            f"{[i for _, i in lost]}), which no live worker serves: that data is lost with its "
            "daemon. Preprocess or compute it again."
        )
    return [by_instance[b["instance_id"]] for b in buffers]


def run_on(client: Client, worker: WorkerInfo | None, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on ``worker`` (any vineyard worker when None) and return its result.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    worker : WorkerInfo or None
        Where to run; None: any worker with a live vineyardd (a catalog read, which a dead
        vineyardd elsewhere does not fail).
    fn : callable
        A top-level (picklable) function.
    *args, **kwargs
        Its arguments.

    Returns
    -------
    object
        What ``fn`` returned.
    """
    catalog_only = worker is None
    if worker is None:  # the catalog: etcd and any live vineyardd
        workers = vineyard_workers(client, all_vineyardds=False)
        if not workers:
            raise ClusterError(
                "No worker has a reachable vineyardd. Check `dvml cluster status`; workers need "
                "VINEYARD_IPC_SOCKET pointing at a running vineyardd."
            )
        worker = workers[min(workers)]
    future = client.submit(
        fn, *args, workers=[worker.address], allow_other_workers=False, pure=False, **kwargs
    )
    # A dead vineyardd elsewhere must not fail a catalog read: that is how its damaged datasets
    # are listed, described and dropped.
    wait_watched(client, [future], vineyardd=not catalog_only)
    return future.result()


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A named dataset (or feature cache) in vineyard: its summary and where its buffers live.

    Handles come from :func:`describe`, :func:`list` and the preprocessors; the fields are
    the catalog's record.

    Parameters
    ----------
    name : str
        The dataset's name.
    id : int
        Its vineyard object id (kept across versions).
    kind : str
        ``"training"``, ``"validation"``, ``"feature_cache"``, ...
    summary : dict
        The preprocessor's summary (MADlib's fields and dvml's own).
    layout : dict
        ``fields`` and one entry per buffer (worker, host, vineyard instance, rows, object ids).
    global_tensors : dict of str to int
        The global tensor object of each field.
    lost_buffers : tuple of int
        Indexes of the buffers whose vineyardd no live worker serves (filled in by
        :func:`describe` and :func:`list`; empty for a dataset that is intact).
    versions : list of dict
        One record per version (:mod:`dvml.store.versions`): number, buffers, rows, digest
        per buffer, source; the oldest first.
    version : int
        The version this handle reads: its layout holds that version's buffers only.
    """

    name: str
    id: int
    kind: str
    summary: dict[str, Any]
    layout: dict[str, Any]
    global_tensors: dict[str, int] = dataclasses.field(default_factory=dict)
    lost_buffers: tuple[int, ...] = ()
    versions: builtins.list[dict[str, Any]] = dataclasses.field(default_factory=builtins.list)
    version: int = 1

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Dataset:
        """The handle of a catalog record.

        Parameters
        ----------
        record : dict
            The catalog's record: this class's fields.

        Returns
        -------
        Dataset
            The handle.
        """
        return cls(**record)

    @property
    def rows(self) -> int:
        """Rows in this version's buffers."""
        return int(sum(b["rows"] for b in self.layout["buffers"]))

    @property
    def damaged(self) -> bool:
        """Whether some of its buffers are lost with their vineyardd."""
        return bool(self.lost_buffers)

    @property
    def status(self) -> str:
        """``"intact"``, or ``"damaged"`` when buffers are lost."""
        return "damaged" if self.damaged else "intact"

    @property
    def lost_rows(self) -> int:
        """Rows of the lost buffers (0 when intact)."""
        lost = set(self.lost_buffers)
        return int(sum(b["rows"] for b in self.layout["buffers"] if b["index"] in lost))

    def damage(self) -> str | None:
        """One sentence on what was lost and what to do.

        Returns
        -------
        str or None
            The sentence, or None when intact.
        """
        if not self.damaged:
            return None
        lost = set(self.lost_buffers)
        where = sorted({b["worker_name"] for b in self.layout["buffers"] if b["index"] in lost})
        return (
            f"{len(lost)} of {len(self.layout['buffers'])} buffers ({self.lost_rows} of "
            f"{self.rows} rows) lived on {where}, whose vineyardd no live worker serves: they are "
            f"lost. Drop {self.name!r} and preprocess or compute it again."
        )

    @property
    def nbytes(self) -> int:
        """Bytes of this version's buffers in shared memory."""
        return int(sum(f["nbytes"] for b in self.layout["buffers"] for f in b["fields"].values()))

    def placement(self) -> pd.DataFrame:
        """Where each buffer lives.

        Returns
        -------
        pandas.DataFrame
            One row per buffer: ``buffer``, ``worker``, ``worker_name``, ``host``,
            ``vineyard_instance_id``, ``rows``, ``nbytes``, ``status`` (``"ok"`` or
            ``"lost"``) and ``<field>_id`` per field.
        """
        import pandas as pd

        rows = []
        for b in self.layout["buffers"]:
            row = {
                "buffer": b["index"],
                "worker": b["worker"],
                "worker_name": b["worker_name"],
                "host": b["host"],
                "vineyard_instance_id": b["instance_id"],
                "rows": b["rows"],
                "nbytes": sum(f["nbytes"] for f in b["fields"].values()),
                "status": "lost" if b["index"] in self.lost_buffers else "ok",
            }
            row.update({f"{k}_id": v["id"] for k, v in b["fields"].items()})
            rows.append(row)
        return pd.DataFrame(rows)

    def distribution(self) -> pd.DataFrame:
        """Rows, bytes and buffers per worker (and host).

        Returns
        -------
        pandas.DataFrame
            One row per worker: ``worker_name``, ``host``, ``worker``,
            ``vineyard_instance_id``, ``buffers``, ``rows``, ``nbytes``.
        """
        table = self.placement()
        return (
            table.groupby(["worker_name", "host", "worker", "vineyard_instance_id"], sort=False)
            .agg(buffers=("buffer", "count"), rows=("rows", "sum"), nbytes=("nbytes", "sum"))
            .reset_index()
        )

    def plot_placement(self, ax: Any = None) -> Any:
        """Bar chart of rows per worker, coloured by host.

        Parameters
        ----------
        ax : matplotlib.axes.Axes, optional
            Where to draw (default: a new figure).

        Returns
        -------
        matplotlib.axes.Axes
            The axes drawn on.
        """
        import matplotlib.pyplot as plt

        dist = self.distribution()
        if ax is None:
            _, ax = plt.subplots(figsize=(max(4, 1.2 * len(dist)), 3))
        hosts = builtins.list(dict.fromkeys(dist["host"]))
        colors = {h: plt.cm.tab10(i % 10) for i, h in enumerate(hosts)}
        ax.bar(dist["worker_name"], dist["rows"], color=[colors[h] for h in dist["host"]])
        for h in hosts:
            ax.bar([], [], color=colors[h], label=h)
        ax.set_ylabel("rows")
        ax.set_title(f"{self.name}: rows per worker")
        ax.legend(title="host")
        return ax

    def drop(self, client: Client | None = None, force: bool = False) -> None:
        """Free this dataset's vineyard memory on every worker and remove its name.

        Parameters
        ----------
        client : distributed.Client, optional
            The cluster's client (default: the current one).
        force : bool
            Drop it even while a job reads it; by default that is refused (see :func:`drop`).
        """
        drop(self.name, client=client, force=force)

    def __repr__(self) -> str:
        workers = len({b["worker_name"] for b in self.layout["buffers"]})
        damage = f" DAMAGED: {len(self.lost_buffers)} buffers lost" if self.damaged else ""
        return (
            f"<dvml.Dataset {self.name!r} kind={self.kind} rows={self.rows} "
            f"buffers={len(self.layout['buffers'])} workers={workers} bytes={self.nbytes}{damage}>"
        )


def read_record(client: Client, name: str) -> dict[str, Any]:
    """The catalog record of ``name`` (raises DatasetNotFoundError)."""
    record = run_on(client, None, catalog.find_record, name)
    if record is None:
        raise catalog.not_found(name)
    return dict(record)


def describe(name: str, client: Client | None = None, version: int | None = None) -> Dataset:
    """The dataset called ``name``: summary, placement, versions and health.

    Parameters
    ----------
    name : str
        The dataset (or feature cache).
    client : distributed.Client, optional
        Default: the current one.
    version : int, optional
        The version to read (1, 2, ...; ``.versions`` lists them): the handle's layout holds
        only that version's buffers, so a fit or a reader given it reads that version, and
        its summary's rows and per-worker figures are that version's (``dropped_rows`` and
        ``invalid_counts`` are the totals of every version). Default: the latest.

    Returns
    -------
    Dataset
        ``.status`` is ``"damaged"`` (and ``.damage()`` says what was lost) when some buffers
        lived on a vineyardd that no live worker serves.

    Raises
    ------
    DatasetNotFoundError
        For an unknown name, or a version that it never had or that an overwrite freed.
    """
    client = current_client(client)
    ds = Dataset.from_record(read_record(client, name))
    if version is not None and version != ds.version:
        layout = at_version(name, ds.layout, ds.versions, version)
        record = next(v for v in ds.versions if int(v["version"]) == int(version))
        summary = summary_at(ds.summary, layout, record)
        ds = dataclasses.replace(ds, layout=layout, version=version, summary=summary)
    return with_health(client, [ds])[0]


def versions(name: str, client: Client | None = None) -> pd.DataFrame:
    """One row per version of a dataset, the oldest first (:mod:`dvml.store.versions`).

    Parameters
    ----------
    name : str
        The dataset's name.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    pandas.DataFrame
        Columns ``version``, ``rows_added``, ``rows`` (the total), ``buffers``, ``created``,
        ``readable``, ``source``.
    """
    import pandas as pd

    ds = describe(name, client)
    rows, total = [], 0
    for v in ds.versions:
        total = v["rows"] + (total if v.get("parent") is not None else 0)
        rows.append({
            "version": v["version"], "rows_added": v["rows"], "rows": total,
            "buffers": len(v["buffers"]), "created": v.get("created_at"),
            "readable": bool(v.get("readable", True)),
            "source": (v.get("source") or {}).get("description"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def resolve_dataset(value: str | Dataset, client: Client) -> Dataset:
    """``value`` itself when it is a :class:`Dataset`, else the dataset it names.

    Parameters
    ----------
    value : str or Dataset
        A dataset or its name.
    client : distributed.Client
        The cluster's client.

    Returns
    -------
    Dataset
        The dataset (:func:`describe` of a name).
    """
    return value if isinstance(value, Dataset) else describe(value, client)


def exists(name: str, client: Client | None = None) -> bool:
    """Whether a dataset or feature cache called ``name`` exists.

    Parameters
    ----------
    name : str
        The name to look for.
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    bool
        True when the catalog holds it.
    """
    return run_on(current_client(client), None, catalog.find_record, name) is not None


LIST_COLUMNS = ["name", "kind", "rows", "version", "buffers", "workers", "nbytes", "created",
                "status", "lost_rows"]  # fmt: skip


def list(client: Client | None = None, kind: str | None = None) -> pd.DataFrame:
    """Every dataset (and feature cache), one row each.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster's client (default: the current one).
    kind : str, optional
        Only datasets of this kind (``"training"``, ``"validation"``, ``"feature_cache"``,
        ...).

    Returns
    -------
    pandas.DataFrame
        Columns ``name``, ``kind``, ``rows``, ``version`` (the latest), ``buffers``,
        ``workers``, ``nbytes``, ``created``, ``status``, ``lost_rows``. ``status`` is
        ``"damaged"`` for a dataset whose buffers partly lived on a vineyardd that no live
        worker serves any more; ``lost_rows`` counts the rows gone with it.
    """
    import pandas as pd

    client = current_client(client)
    records = run_on(client, None, catalog.list_records)
    found = [Dataset.from_record(r) for r in records if kind is None or r["kind"] == kind]
    rows = []
    for ds in with_health(client, found):
        rows.append(
            {
                "name": ds.name,
                "kind": ds.kind,
                "rows": ds.rows,
                "version": ds.version,
                "buffers": len(ds.layout["buffers"]),
                "workers": len({b["worker_name"] for b in ds.layout["buffers"]}),
                "nbytes": ds.nbytes,
                "created": ds.summary.get("created_at"),
                "status": ds.status,
                "lost_rows": ds.lost_rows,
            }
        )
    return pd.DataFrame(rows, columns=LIST_COLUMNS)


def drop(name: str, client: Client | None = None, force: bool = False) -> None:
    """Remove the name and free the dataset's vineyard memory on every worker.

    Parameters
    ----------
    name : str
        The dataset (or feature cache).
    client : distributed.Client, optional
        Default: the current one (else the cluster recorded by ``dvml cluster up``).
    force : bool
        Drop it even while a job (a fit) reads it. Without it a leased dataset is refused
        with :class:`~dvml.exceptions.DatasetInUseError` naming the job
        (:mod:`dvml.store.leases`, kept by the scheduler: every client of the cluster sees
        them); with it, the job's lease is broken and the job fails with
        :class:`~dvml.exceptions.LeaseBrokenError` instead of registering what it trained on
        freed memory. Stop that job first when you can.
    """
    client = current_client(client)
    with unleased(name, "drop", force, client):
        record = read_record(client, name)
        delete_layout(client, record["layout"])
        # Old copies of buffers a rebalance moved while a job read them (dvml.preprocess.rebalance).
        kept = (record.get("summary") or {}).get("rebalance_pending_free") or {}
        if kept:
            delete_by_instance(client, {int(i): builtins.list(v) for i, v in kept.items()}, {})
        run_on(client, None, catalog.drop_metadata, record, True)
    log_dropped(client, name)


def delete_layout(
    client: Client, layout: dict[str, Any], names: dict[int, Any] | None = None
) -> int:
    """Delete the tensors of a layout on the workers that own them; return how many."""
    by_instance: dict[int, builtins.list[int]] = {}
    for b in layout["buffers"]:
        by_instance.setdefault(b["instance_id"], []).extend(f["id"] for f in b["fields"].values())
    return delete_by_instance(client, by_instance, names or {})


def delete_by_instance(
    client: Client,
    ids_by_instance: dict[int, builtins.list[int]],
    names_by_instance: dict[int, builtins.list[str]],
) -> int:
    """Delete objects and drop names, each on the worker of its vineyard instance.

    Objects on an instance that no live worker serves are lost with their daemon; they are
    skipped.
    """
    workers = vineyard_workers(client, all_vineyardds=False)  # the lost ones are skipped
    futures = []
    for iid in set(ids_by_instance) | set(names_by_instance):
        if iid not in workers:
            continue
        futures.append(
            client.submit(
                delete_objects,
                ids_by_instance.get(iid, []),
                names_by_instance.get(iid, []),
                workers=[workers[iid].address],
                allow_other_workers=False,
                pure=False,
            )
        )
    wait_watched(client, futures, vineyardd=False)  # the dead ones' objects were skipped
    return int(sum(client.gather(futures)))
