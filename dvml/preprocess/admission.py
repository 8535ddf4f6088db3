"""Admission of a pack: its memory plan against the live vineyardds, before any buffer is written.

The plan itself is pure (:func:`dvml.placement.memory.plan_pack`); this module gathers what it
needs: the bytes each target receives (from the layout the planner drew and the bytes of one
packed row, both known once the parts are prepared), the status of every target's vineyardd
(one task per vineyardd, all at once) and, for ``overwrite=True``, the bytes of the dataset it
replaces. A pack that does not fit is refused with :class:`~dvml.exceptions.MemoryPlanError`
before its split and pack tasks are submitted. The late check of
:func:`dvml.store.tensors.write_buffers` stays as the backstop (another job may fill a
vineyardd between the plan and the writes).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dvml.cluster.health import wait_watched
from dvml.exceptions import MemoryPlanError
from dvml.placement.memory import MemoryPlan, VineyarddRoom, format_size, plan_pack
from dvml.store import catalog
from dvml.store.datasets import run_on
from dvml.store.tensors import vineyard_room

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

__all__ = [
    "Planned",
    "admitting_also",
    "check_pack_fits",
    "is_planning",
    "known_x_bytes",
    "pack_plan",
    "planning_only",
    "refuse_before_reading",
]

# Set by dvml.plan.pack: the preprocessor stops at its plan (raising Planned) instead of packing.
_PLANNING: contextvars.ContextVar[bool] = contextvars.ContextVar("dvml_planning", default=False)


class Planned(Exception):
    """Raised by a preprocessor under :func:`planning_only` with its plan, before any write;
    ``label_values``: the classes of its (first) label, one-hot as a model reads them."""

    def __init__(self, plan: MemoryPlan, label_values: int = 0) -> None:
        super().__init__("planned")
        self.plan = plan
        self.label_values = label_values


# Set by a job that packs its source as its first step (the feature cache): a check of its own
# plan that the pack's admission runs after its own, before any write.
_ALSO_ADMIT: contextvars.ContextVar[Callable[[MemoryPlan, int], None] | None] = (
    contextvars.ContextVar("dvml_also_admit", default=None)
)


@contextlib.contextmanager
def planning_only() -> Iterator[None]:
    """Preprocessor calls inside stop at their memory plan (raising :class:`Planned`)."""
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def is_planning() -> bool:
    """Whether a preprocessor call runs under :func:`planning_only`."""
    return _PLANNING.get()


@contextlib.contextmanager
def admitting_also(check: Callable[[MemoryPlan, int], None]) -> Iterator[None]:
    """Preprocessor calls inside also run ``check(plan, label_values)`` once their own plan
    fits, before any write: a job that packs its source first refuses itself whole there,
    with nothing written, instead of after the pack (``check`` raises to refuse)."""
    token = _ALSO_ADMIT.set(check)
    try:
        yield
    finally:
        _ALSO_ADMIT.reset(token)


def pack_plan(
    client: Client,
    rows_per_worker: Mapping[str, int],
    targets: Sequence[WorkerInfo],
    row_bytes: int,
    replacing: str | None = None,
    compact_row_bytes: int | None = None,
) -> MemoryPlan:
    """The memory plan of a pack whose targets receive ``rows_per_worker`` rows (by address).

    Parameters
    ----------
    rows_per_worker : mapping of str to int
        Target address → rows it receives (:attr:`dvml.placement.Layout.rows_per_worker`).
    targets : sequence of WorkerInfo
        The target workers.
    row_bytes : int
        Bytes of one packed row.
    replacing : str, optional
        The name an ``overwrite=True`` replaces: its bytes per vineyardd enter the plan.
    compact_row_bytes : int, optional
        Bytes of one row with compact storage, when it would apply and is not used.
    """
    by_address = {t.address: t for t in targets}
    chosen = [by_address[a] for a in rows_per_worker
              if by_address[a].vineyard_instance_id is not None]  # fmt: skip
    needed = {t.name: rows_per_worker[t.address] * row_bytes for t in chosen}
    instance_of = {t.name: int(t.vineyard_instance_id or 0) for t in chosen}
    compact = (
        {t.name: rows_per_worker[t.address] * compact_row_bytes for t in chosen}
        if compact_row_bytes is not None and compact_row_bytes < row_bytes
        else None
    )
    return plan_pack(
        needed,
        instance_of,
        _rooms(client, chosen),
        replaced=_replaced_bytes(client, chosen[0], replacing) if replacing and chosen else None,
        compact_needed=compact,
        row_bytes=row_bytes,
    )


def check_pack_fits(
    plan: MemoryPlan,
    name: str,
    rows: int,
    compact: bool,
    x_only: bool = False,
    label_values: int = 0,
) -> None:
    """Raise :class:`MemoryPlanError` when ``plan`` does not fit; its message has the plan.
    ``x_only``: the plan counts the inputs only (:func:`refuse_before_reading`). A full plan
    that fits is then checked by the job that packs, if it asked (:func:`admitting_also`;
    ``label_values``: the classes of the first label)."""
    if plan.fits:
        job_check = None if x_only else _ALSO_ADMIT.get()
        if job_check is not None:
            job_check(plan, label_values)
        return
    short = plan.short
    counted = ", the inputs alone, counted before reading the source" if x_only else ""
    raise MemoryPlanError(
        f"The dataset {name!r} does not fit in vineyard shared memory: {len(short)} of "
        f"{len(plan.rows)} vineyardds lack room. Nothing was written. Received: {rows} rows of "
        f"{plan.row_bytes} bytes ({format_size(plan.needed)}, "
        f"{'compact' if compact else 'float32'} layout{counted}) over "
        f"{sum(len(r.workers) for r in plan.rows)} target workers. The plan, per vineyardd:\n"
        f"{plan.describe()}",
        plan,
    )


def known_x_bytes(source: Any, x: Any, compact: bool) -> tuple[int, int] | None:
    """``(rows, bytes of one row's inputs as stored)`` of a source whose shapes are known
    without reading it (a dict of Dask or numpy arrays with known chunks); None otherwise.

    Inputs are stored as float32, or as uint8 for a uint8 source packed ``compact``
    (:func:`dvml.preprocess.tasks.storage_dtypes`); the labels are left out (their width
    needs the class values, which only reading finds): a lower bound of the packed bytes.
    """

    if not isinstance(source, Mapping) or x is None:
        return None
    names = (
        [x] if isinstance(x, str) else [n for g in x for n in ([g] if isinstance(g, str) else g)]
    )
    rows, row_bytes = None, 0
    for name in names:
        array = source.get(name)
        shape = getattr(array, "shape", None)
        dtype = getattr(array, "dtype", None)
        if shape is None or dtype is None or not shape or np.dtype(dtype).kind not in "biuf":
            return None
        if not all(isinstance(n, int | np.integer) for n in shape):  # unknown chunk sizes
            return None
        if rows is not None and int(shape[0]) != rows:
            return None  # the preprocessor names the mismatch
        rows = int(shape[0])
        itemsize = 1 if compact and np.dtype(dtype) == np.uint8 else 4
        row_bytes += math.prod(int(n) for n in shape[1:]) * itemsize
    return None if rows is None else (rows, row_bytes)


def refuse_before_reading(
    client: Client,
    bound: tuple[int, int],
    targets: Sequence[WorkerInfo],
    name: str,
    replacing: str | None,
    compact: bool,
) -> None:
    """Refuse a pack whose inputs alone (``bound``: :func:`known_x_bytes`) exceed the free
    shared memory of its targets' vineyardds together, before its source is read.

    A source several times larger than shared memory would otherwise be computed into the
    workers' memory first, to count its rows and label values. Only the sum is compared: how
    the rows spread over the vineyardds is the full plan's to say, later.
    """
    rows, row_bytes = bound
    addresses = [t.address for t in targets]
    share = {a: rows // len(addresses) + (k < rows % len(addresses))
             for k, a in enumerate(addresses)}  # fmt: skip
    plan = pack_plan(client, share, targets, row_bytes, replacing)
    if plan.needed > sum(r.free for r in plan.rows):
        check_pack_fits(plan, name, rows, compact, x_only=True)


def _rooms(client: Client, chosen: Sequence[WorkerInfo]) -> list[VineyarddRoom]:
    """The status of each vineyardd of ``chosen``: one task per vineyardd, all at once."""
    one_each: dict[int, WorkerInfo] = {}
    for t in chosen:
        one_each.setdefault(int(t.vineyard_instance_id or 0), t)
    futures = [
        client.submit(vineyard_room, workers=[t.address], allow_other_workers=False, pure=False)
        for t in one_each.values()
    ]
    wait_watched(client, futures, "reading the vineyardds' memory")
    return [VineyarddRoom(int(i), int(limit), int(usage))
            for i, limit, usage in client.gather(futures)]  # fmt: skip


def _replaced_bytes(client: Client, worker: WorkerInfo, name: str) -> dict[int, int]:
    """Bytes per vineyard instance of the dataset called ``name`` (empty when there is none),
    read from the catalog through ``worker``."""
    record: dict[str, Any] | None = run_on(client, worker, catalog.find_record, name)
    found: dict[int, int] = {}
    for b in (record or {}).get("layout", {}).get("buffers", []):
        size = sum(int(f.get("nbytes", 0)) for f in b["fields"].values())
        found[int(b["instance_id"])] = found.get(int(b["instance_id"]), 0) + size
    return found
