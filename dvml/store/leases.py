"""Dataset leases: a job that reads datasets holds a lease; drop and overwrite refuse.

Trainers (and any process reading through :func:`dvml.resolve.open_local`) keep zero-copy
views of a dataset's blobs in vineyardd's shared memory. Dropping or overwriting the dataset
frees those blobs at once, and the next pack reuses the memory: the readers then train on
garbage or on another dataset's values, silently. So a job holds a *lease* on every dataset it
reads for as long as it runs (``with holding(names, job=...)``: :func:`dvml.fit`,
:func:`dvml.fit_multiple`, :func:`dvml.run` and :func:`dvml.automl` around the whole
training), and :func:`dvml.datasets.drop`, ``overwrite=True`` of the preprocessors and
``dvml datasets drop`` refuse a leased dataset with :class:`~dvml.exceptions.DatasetInUseError`
naming the job, unless ``force=True`` (``--force``).

Where: on the Dask **scheduler**, in a table the lease functions keep in
``scheduler.extensions["dvml-leases"]`` (they run there through ``run_on_scheduler``, one at a
time on its event loop, so a check and the claim that follows it are atomic). Every client of
the cluster talks to that scheduler, whatever its host, user session or state directory, so
every client sees every lease. Not etcd: vineyard's etcd is often reachable only from the
worker hosts (a private namespace, a cluster network), while the scheduler is what a client
connects to by definition; and a lease must die with the job's client, which the scheduler
already tracks. Leases die with the scheduler, as do the jobs that held them. (Issue 42: the
leases were files in the client's state directory, so a client with another state directory
dropped a dataset while a fit trained on it.)

A lease belongs to the holder's Dask client (``client.id``). It ends when the job ends, and
*expires* when its client is gone: at once when the client disconnects (a SIGKILLed process
closes its connections; the scheduler forgets the client), or when the scheduler has not
heard from it for ``dvml.train.client-timeout`` seconds plus :data:`GRACE` (a host cut off
or frozen: the client's heartbeats stop). That is when the job's trainers stop themselves
for the same reason (``ClientLease`` in ``dvml.train.runtime.supervisor``), so an expired lease
has no readers left. A dead holder blocks nothing for longer than that.

A drop or overwrite *claims* the name while it frees the memory: a job starting meanwhile
waits for the claim to end before it takes its lease (and then finds the dataset gone, or the
new one). With ``force=True`` the leases on the name are marked *broken*, naming who forced
it: the job finds out when it checks its lease (:meth:`Lease.check`, called by the fits
before they register anything, and when the lease is given back) and fails with
:class:`~dvml.exceptions.LeaseBrokenError` instead of registering a model trained on freed
memory. A lease that expired and was removed counts as broken too.

The pure parts (:func:`lease_record`, :func:`holders`, :func:`expired`,
:func:`in_use_message`) take and return plain values; the ``_on_scheduler`` functions run on
the scheduler; the rest are the client's side.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from dvml import config
from dvml.exceptions import ArgumentTypeError, DatasetInUseError, LeaseBrokenError

__all__ = [
    "EXTENSION",
    "GRACE",
    "Lease",
    "check_not_leased",
    "expired",
    "holders",
    "holding",
    "in_use_message",
    "lease_record",
    "read_leases",
    "unleased",
]

EXTENSION = "dvml-leases"
"""The key of the lease table in ``scheduler.extensions``."""

GRACE = 5.0
"""Seconds added to ``dvml.train.client-timeout`` before a silent client's lease expires: one
Dask client heartbeat (5 s), so the job's trainers have stopped themselves first."""

_WAIT = 0.2  # seconds between two tries of a lease while the name is claimed by a drop


def _names(datasets: Iterable[Any]) -> list[str]:
    """The names of ``datasets``: names, objects with a ``name`` (a Dataset), or None (skipped)."""
    found: list[str] = []
    for item in datasets:
        if item is None:
            continue
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if not isinstance(name, str):
            raise ArgumentTypeError(
                f"A lease is taken on dataset names or Datasets. Received: {type(item).__name__} "
                f"{item!r:.80}."
            )
        if name not in found:
            found.append(name)
    return found


# -- pure ---------------------------------------------------------------------------------------


def lease_record(
    names: Sequence[str],
    job: str,
    client: str,
    pid: int,
    host: str,
    ttl: float,
    now: str,
    lease_id: str,
) -> dict[str, Any]:
    """The content of one lease (pure)."""
    return {
        "id": str(lease_id),
        "datasets": list(names),
        "job": str(job),
        "client": str(client),
        "pid": int(pid),
        "host": str(host),
        "ttl": float(ttl),
        "since": now,
        "broken": None,
    }


def expired(record: Mapping[str, Any], silence: float | None) -> str | None:
    """Why lease ``record`` expired, or None while it holds (pure).

    ``silence``: seconds since the scheduler last heard from the lease's client, None when
    that client is not connected.
    """
    if silence is None:
        return "its client disconnected"
    if silence > float(record.get("ttl", 0.0)):
        return f"the scheduler had not heard from its client for {silence:.0f}s"
    return None


def holders(name: str, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The leases of ``records`` on dataset ``name`` that still hold (not broken) (pure)."""
    return [dict(r) for r in records if name in r.get("datasets", ()) and not r.get("broken")]


def in_use_message(name: str, action: str, held: Sequence[Mapping[str, Any]]) -> str:
    """The error for ``action`` (``"drop"``, ``"overwrite"``) of a leased dataset (pure)."""
    jobs = "; ".join(
        f"{r['job']} (pid {r['pid']} on {r['host']}, Dask client {r['client']}, since {r['since']})"
        for r in held
    )
    return (
        f"Cannot {action} dataset {name!r}: it is in use by {jobs}, whose trainers read it "
        f"from shared memory; a {action} now would let them read freed memory. Received: "
        f"{action} of {name!r} with force=False. Wait for that job to end (or stop it; the "
        f"lease of a job whose client died expires by itself) and {action} again, or pass "
        f"force=True (`--force` on the command line) to {action} it anyway: that job then "
        "fails instead of registering its model."
    )


# -- on the scheduler (through run_on_scheduler: one at a time, on its event loop) --------------


def _table(dask_scheduler: Any) -> dict[str, Any]:
    table = dask_scheduler.extensions.get(EXTENSION)
    if table is None:
        table = dask_scheduler.extensions[EXTENSION] = {"leases": {}, "claims": {}}
    return table


def _silence(dask_scheduler: Any, client_id: str) -> float | None:
    cs = dask_scheduler.clients.get(client_id)
    return None if cs is None else time.time() - cs.last_seen


def _purged(dask_scheduler: Any) -> dict[str, Any]:
    """The lease table without the leases and claims whose client is gone."""
    table = _table(dask_scheduler)
    for lid, record in list(table["leases"].items()):
        if expired(record, _silence(dask_scheduler, record["client"])):
            del table["leases"][lid]
    for name, claim in list(table["claims"].items()):
        if expired(claim, _silence(dask_scheduler, claim["client"])):
            del table["claims"][name]
    return table


def _acquire_on_scheduler(dask_scheduler: Any, record: dict[str, Any]) -> list[str]:
    """Take lease ``record``; the names a drop claims now instead (then nothing is taken)."""
    table = _purged(dask_scheduler)
    claimed = [n for n in record["datasets"] if n in table["claims"]]
    if not claimed:
        table["leases"][record["id"]] = record
    return claimed


def _release_on_scheduler(dask_scheduler: Any, lease_id: str) -> dict[str, Any] | None:
    """Give lease ``lease_id`` back; what it was (None: it expired and was removed)."""
    return _table(dask_scheduler)["leases"].pop(lease_id, None)


def _lease_on_scheduler(dask_scheduler: Any, lease_id: str) -> dict[str, Any] | None:
    return _table(dask_scheduler)["leases"].get(lease_id)


def _list_on_scheduler(dask_scheduler: Any) -> list[dict[str, Any]]:
    return list(_purged(dask_scheduler)["leases"].values())


def _claim_on_scheduler(
    dask_scheduler: Any, name: str, claim: dict[str, Any] | None, force: bool, by: str
) -> list[dict[str, Any]]:
    """The leases that refuse a drop of ``name``; none: ``claim`` it (if given) and, with
    ``force``, mark its leases broken ``by`` that drop."""
    table = _purged(dask_scheduler)
    held = holders(name, table["leases"].values())
    if held and not force:
        return held
    for record in held:
        table["leases"][record["id"]]["broken"] = by
    if claim is not None:
        table["claims"][name] = claim
    return []


def _unclaim_on_scheduler(dask_scheduler: Any, name: str, claim_id: str) -> None:
    claims = _table(dask_scheduler)["claims"]
    if claims.get(name, {}).get("id") == claim_id:
        del claims[name]


# -- the client's side --------------------------------------------------------------------------


def _client(client: Any) -> Any:
    from dvml.cluster.workers import current_client

    return current_client(client)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _ttl() -> float:
    return float(config.get("train.client-timeout")) + GRACE


def read_leases(client: Any = None) -> list[dict[str, Any]]:
    """Every lease that holds on the cluster of ``client`` (expired ones are removed)."""
    return list(_client(client).run_on_scheduler(_list_on_scheduler))


def _refuse_or_claim(
    client: Any, name: str, action: str, force: bool, claim: dict[str, Any] | None
) -> None:
    by = f"a {action} with force=True from pid {os.getpid()} on {socket.gethostname()} at {_now()}"
    held = client.run_on_scheduler(_claim_on_scheduler, name=name, claim=claim, force=force, by=by)
    if held:
        raise DatasetInUseError(in_use_message(name, action, held))


def check_not_leased(name: str, action: str, force: bool = False, client: Any = None) -> None:
    """Raise :class:`DatasetInUseError` when a live job holds a lease on ``name``.

    ``force=True`` skips the check and breaks those leases: their jobs fail instead of
    registering what they trained.
    """
    _refuse_or_claim(_client(client), name, action, force, None)


@contextlib.contextmanager
def unleased(name: str, action: str, force: bool = False, client: Any = None) -> Iterator[None]:
    """Check that ``name`` is not leased, and keep new leases out while the block runs.

    Wrap the step that frees a dataset's memory (a drop, the replacement of an overwrite):
    a job starting meanwhile waits for the block before it takes its lease, and then finds
    the dataset gone (or the new one). With ``force=True`` the leases on ``name`` are broken.
    """
    client = _client(client)
    claim = {"id": uuid.uuid4().hex, "client": client.id, "ttl": _ttl(), "action": action}
    _refuse_or_claim(client, name, action, force, claim)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # the scheduler is gone: so is the claim
            client.run_on_scheduler(_unclaim_on_scheduler, name=name, claim_id=claim["id"])


class Lease:
    """A lease held on the scheduler (made by :func:`holding`).

    Attributes
    ----------
    names : list of str
        The datasets leased.
    record : dict
        The lease as the scheduler keeps it (``id``, ``job``, ``client``, ``pid``, ...).
    """

    def __init__(self, client: Any, record: dict[str, Any]) -> None:
        self.client, self.record = client, record
        self.names: list[str] = list(record["datasets"])

    def _broken(self, current: Mapping[str, Any] | None) -> str | None:
        if current is None:
            return (
                "its lease expired on the scheduler (its client was silent for more than "
                f"{self.record['ttl']:g}s) and the datasets may have been dropped meanwhile"
            )
        return current.get("broken") or None

    def _raise(self, why: str) -> None:
        raise LeaseBrokenError(
            f"{self.record['job']} read datasets {self.names} that were taken away while it "
            f"ran: {why}. Its trainers may have read freed memory, so nothing was registered. "
            "Received: a lease broken during the job. Prepare the data again if needed and "
            "rerun the job; drop or overwrite a dataset with force=True only once the jobs "
            "reading it are stopped."
        )

    def check(self) -> None:
        """Raise :class:`~dvml.exceptions.LeaseBrokenError` if the lease was broken (a drop
        or overwrite with ``force=True``) or expired: call it before registering anything."""
        why = self._broken(self.client.run_on_scheduler(_lease_on_scheduler, lease_id=self.id))
        if why:
            self._raise(why)

    @property
    def id(self) -> str:
        return str(self.record["id"])


@contextlib.contextmanager
def holding(datasets: Iterable[Any], job: str, client: Any = None) -> Iterator[Lease]:
    """Hold a lease on ``datasets`` (names, Datasets; None is skipped) for the ``with`` block.

    Parameters
    ----------
    datasets : iterable
        What the job reads.
    job : str
        Who holds it, as the refusal names it (``"dvml.fit of model 'digits_cnn'"``).
    client : distributed.Client, optional
        The job's client (default: the current one): the lease lives on its scheduler and
        expires when this client is gone.

    Yields
    ------
    Lease
        ``.names`` (the names leased) and ``.check()``.

    Raises
    ------
    LeaseBrokenError
        When the block ends (normally or with an error) and the lease was broken meanwhile.
    """
    names = _names(datasets)
    client = _client(client)
    lease_id = uuid.uuid4().hex
    record = lease_record(
        names, job, client.id, os.getpid(), socket.gethostname(), _ttl(), _now(), lease_id
    )
    # A drop of one of the names runs now: wait for it (it holds its claim for seconds).
    while client.run_on_scheduler(_acquire_on_scheduler, record=record):
        time.sleep(_WAIT)
    lease = Lease(client, record)
    try:
        yield lease
    except BaseException:
        current = _release_quietly(client, lease_id)
        why = lease._broken(current) if current is not _UNKNOWN else None
        if why:
            lease._raise(why)  # the real cause of whatever the job saw (freed memory)
        raise
    current = client.run_on_scheduler(_release_on_scheduler, lease_id=lease_id)
    why = lease._broken(current)
    if why:
        lease._raise(why)


_UNKNOWN = object()


def _release_quietly(client: Any, lease_id: str) -> Any:
    """Release a lease while an error propagates: the scheduler may be what failed."""
    try:
        return client.run_on_scheduler(_release_on_scheduler, lease_id=lease_id)
    except Exception:
        return _UNKNOWN
