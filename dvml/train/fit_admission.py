"""Admission of a fit beside the running jobs: memory reservations on the Dask scheduler.

A fit whose plan fits its hosts alone (:func:`~dvml.train.trainer_memory.check_fit_fits`)
is then admitted against the reservations of the jobs running on the same cluster, and holds
a reservation of its own planned bytes per machine until it ends (``with admitted(...)``).
The check and the reservation that follows it run as one function on the scheduler's event
loop (``run_on_scheduler``), so two clients cannot both take the last room.

Where: ``scheduler.extensions["dvml-reservations"]``, as the dataset leases
(:mod:`dvml.store.leases`, whose docstring says why the scheduler): every client of the
cluster sees them, and a reservation whose Dask client disconnected, or was silent for
longer than ``dvml.train.client-timeout`` plus :data:`~dvml.store.leases.GRACE`, is dropped
(its trainers stop themselves by then). The arithmetic is pure, in
:mod:`dvml.placement.reservations`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from dvml import config
from dvml.exceptions import MemoryPlanError
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.placement.reservations import admission, refusal_message, reservation_record
from dvml.store.leases import GRACE, expired
from dvml.train.trainer_memory import check_fit_fits

__all__ = ["EXTENSION", "admitted", "read_reservations", "reservations_on_scheduler", "reserved"]

EXTENSION = "dvml-reservations"
"""The key of the reservation table in ``scheduler.extensions``."""


# -- on the scheduler (through run_on_scheduler: one at a time, on its event loop) --------------


def _purged(dask_scheduler: Any) -> dict[str, Any]:
    """The reservations whose Dask client is still heard from."""
    table = dask_scheduler.extensions.setdefault(EXTENSION, {})
    for rid, record in list(table.items()):
        cs = dask_scheduler.clients.get(record["client"])
        if expired(record, None if cs is None else time.time() - cs.last_seen):
            del table[rid]
    return table


def _reserve_on_scheduler(
    dask_scheduler: Any, record: dict[str, Any], rooms: dict[str, int]
) -> list[Any]:
    """Reserve ``record`` unless it does not fit beside the others; the shortfalls if not."""
    table = _purged(dask_scheduler)
    shorts = admission(record["machines"], rooms, table.values())
    if not shorts:
        table[record["id"]] = record
    return shorts


def _release_on_scheduler(dask_scheduler: Any, reservation_id: str) -> None:
    dask_scheduler.extensions.setdefault(EXTENSION, {}).pop(reservation_id, None)


def reservations_on_scheduler(dask_scheduler: Any) -> list[dict[str, Any]]:
    """The reservations of the running jobs, read on the scheduler (its dashboard page)."""
    return list(_purged(dask_scheduler).values())


# -- the client's side --------------------------------------------------------------------------


def read_reservations(client: Any) -> list[dict[str, Any]]:
    """The memory reservations of the jobs running on the cluster of ``client``."""
    return list(client.run_on_scheduler(reservations_on_scheduler))


@contextlib.contextmanager
def admitted(
    client: Any, plan: FitMemoryPlan, model: str, batch_size: int
) -> Iterator[dict[str, Any]]:
    """Admit the fit of ``model`` by its ``plan``, alone then beside the running jobs, and
    reserve its bytes for the ``with`` block.

    Raises
    ------
    MemoryPlanError
        When the plan does not fit its hosts alone (:func:`check_fit_fits`), or when, on one
        of its machines, it does not fit in the room less the running jobs' reservations (the
        message names those jobs and their bytes). Nothing is reserved then.
    """
    check_fit_fits(plan, model, batch_size)
    with reserved(client, plan, f"dvml.fit of model {model!r}") as record:
        yield record


@contextlib.contextmanager
def reserved(client: Any, plan: FitMemoryPlan, job: str) -> Iterator[dict[str, Any]]:
    """Reserve the bytes of ``plan`` (one that fits its hosts alone) for the ``with`` block,
    under the name ``job``, unless it does not fit beside the running jobs' reservations.

    Raises
    ------
    MemoryPlanError
        On one of its machines, it does not fit in the room less the running jobs'
        reservations (the message names those jobs and their bytes). Nothing is reserved.
    """
    needed: Mapping[str, int] = {h.host: h.with_margin for h in plan.hosts}
    rooms = {h.host: h.room.room for h in plan.hosts}
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    ttl = float(config.get("train.client-timeout")) + GRACE
    record = reservation_record(
        job, client.id, os.getpid(), socket.gethostname(), ttl, now, uuid.uuid4().hex, needed
    )
    shorts = client.run_on_scheduler(_reserve_on_scheduler, record=record, rooms=rooms)
    if shorts:
        raise MemoryPlanError(refusal_message(job, shorts), plan)
    try:
        yield record
    finally:
        with contextlib.suppress(Exception):  # the scheduler is gone: so is the reservation
            client.run_on_scheduler(_release_on_scheduler, reservation_id=record["id"])
