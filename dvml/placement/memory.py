"""The memory plan of a pack: the shared-memory bytes each vineyardd receives, against its room.

Pure: plain values in (bytes per target worker, each vineyardd's limit and usage, the bytes an
``overwrite=True`` replaces), a :class:`MemoryPlan` out. The preprocessor computes it before any
buffer is written and refuses a pack that does not fit (:mod:`dvml.preprocess.admission`).

What a pack writes into a vineyardd is exactly its buffers: each buffer is allocated in the
daemon and filled in place (:func:`dvml.store.tensors.write_buffers`), with no staging copy in
shared memory (the staged wrapper is metadata). Several workers may share one vineyardd (one
per host in some deployments), so the plan has one row per vineyardd, summing its workers.
``overwrite=True`` keeps the dataset it replaces until the new one is complete: its bytes are
part of the daemon's usage while the new buffers are written, and dropping it first frees them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MemoryPlan", "PlanRow", "VineyarddRoom", "format_size", "plan_pack"]

_MiB = 2**20


def format_size(n: int) -> str:
    """``n`` bytes for people: ``"512 bytes"``, ``"3.2 KiB"``, ``"48.0 MiB"``, ``"1.50 GiB"``."""
    if abs(n) < 1024:
        return f"{n} bytes"
    for unit, scale, digits in (("TiB", 2**40, 2), ("GiB", 2**30, 2), ("MiB", 2**20, 1)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n / 1024:.1f} KiB"


def _round_up_mib(n: int) -> int:
    return -(-n // _MiB) * _MiB


@dataclasses.dataclass(frozen=True)
class VineyarddRoom:
    """One vineyardd as its status reports it: ``limit`` and ``usage`` in bytes."""

    instance_id: int
    limit: int
    usage: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.usage)


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One vineyardd of the plan.

    Attributes
    ----------
    instance_id : int
        The vineyard instance.
    workers : tuple of str
        The target workers it serves (their buffers all go into it).
    needed : int
        Bytes the pack writes into it.
    free, limit, usage : int
        Its room before the pack, from its status.
    replaced : int
        Bytes of the dataset that ``overwrite=True`` replaces held in it (freed only after
        the new dataset is complete).
    """

    instance_id: int
    workers: tuple[str, ...]
    needed: int
    free: int
    limit: int
    usage: int
    replaced: int = 0

    @property
    def fits(self) -> bool:
        return self.needed <= self.free

    @property
    def short(self) -> int:
        """Bytes missing (0 when it fits)."""
        return max(0, self.needed - self.free)

    def line(self) -> str:
        """One line of the refusal: who, needed, free of limit, short by."""
        who = ", ".join(self.workers)
        state = "fits" if self.fits else f"short by {format_size(self.short)}"
        old = f" ({format_size(self.replaced)} of it the dataset replaced)" if self.replaced else ""
        return (
            f"{who} (vineyardd {self.instance_id}): needs {format_size(self.needed)}, "
            f"{format_size(self.free)} free of {format_size(self.limit)}{old}: {state}"
        )


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Where a pack's bytes go and whether they fit, with the fixes that would make them fit.

    Attributes
    ----------
    rows : tuple of PlanRow
        One per vineyardd that receives buffers.
    fixes : tuple of str
        What would make the pack fit, with numbers (empty when it fits).
    row_bytes : int
        Bytes of one packed row.
    """

    rows: tuple[PlanRow, ...]
    fixes: tuple[str, ...] = ()
    row_bytes: int = 0

    @property
    def fits(self) -> bool:
        """Whether every vineyardd has room for what it receives."""
        return all(r.fits for r in self.rows)

    @property
    def needed(self) -> int:
        """Bytes of the whole pack."""
        return sum(r.needed for r in self.rows)

    @property
    def short(self) -> tuple[PlanRow, ...]:
        """The vineyardds without room."""
        return tuple(r for r in self.rows if not r.fits)

    def table(self) -> pd.DataFrame:
        """The plan as a table: one row per vineyardd, bytes as integers."""
        import pandas as pd

        return pd.DataFrame(
            [
                {"workers": ", ".join(r.workers), "instance_id": r.instance_id,
                 "needed": r.needed, "free": r.free, "limit": r.limit, "usage": r.usage,
                 "replaced": r.replaced, "fits": r.fits}
                for r in self.rows
            ],
            columns=["workers", "instance_id", "needed", "free", "limit", "usage", "replaced",
                     "fits"],
        )  # fmt: skip

    def describe(self) -> str:
        """The plan in words: one line per vineyardd, then the fixes."""
        lines = [f"  {r.line()}" for r in self.rows]
        if self.fixes:
            lines.append("What would make it fit:")
            lines.extend(f"  - {fix}" for fix in self.fixes)
        return "\n".join(lines)


def plan_pack(
    needed: Mapping[str, int],
    instance_of: Mapping[str, int],
    rooms: Sequence[VineyarddRoom],
    replaced: Mapping[int, int] | None = None,
    compact_needed: Mapping[str, int] | None = None,
    row_bytes: int = 0,
) -> MemoryPlan:
    """The memory plan of a pack.

    Parameters
    ----------
    needed : mapping of str to int
        Target worker name → bytes of the buffers placed on it.
    instance_of : mapping of str to int
        Target worker name → the vineyard instance it writes into.
    rooms : sequence of VineyarddRoom
        The status of every vineyardd that ``instance_of`` names.
    replaced : mapping of int to int, optional
        Instance → bytes of the dataset that ``overwrite=True`` replaces there.
    compact_needed : mapping of str to int, optional
        Worker → bytes with compact storage, when the data is stored as float32 but compact
        storage would apply (uint8 data): offered as a fix with its numbers.
    row_bytes : int
        Bytes of one packed row (recorded in the plan).

    Returns
    -------
    MemoryPlan
    """
    from dvml.exceptions import ArgumentError

    by_id = {r.instance_id: r for r in rooms}
    missing = sorted({instance_of[w] for w in needed} - set(by_id))
    if missing:
        raise ArgumentError(
            f"No status for the vineyardds {missing} of the target workers. Received: rooms "
            f"for {sorted(by_id)}. Pass the status of every target's vineyardd."
        )
    replaced = dict(replaced or {})
    rows = _rows(needed, instance_of, by_id, replaced)
    plan = MemoryPlan(rows=rows, row_bytes=row_bytes)
    if plan.fits:
        return plan
    compact_rows = (
        _rows(compact_needed, instance_of, by_id, replaced) if compact_needed is not None else None
    )
    return dataclasses.replace(plan, fixes=tuple(_fixes(rows, compact_rows)))


def _rows(
    needed: Mapping[str, int],
    instance_of: Mapping[str, int],
    by_id: Mapping[int, VineyarddRoom],
    replaced: Mapping[int, int],
) -> tuple[PlanRow, ...]:
    workers: dict[int, list[str]] = {}
    for w in needed:
        workers.setdefault(instance_of[w], []).append(w)
    return tuple(
        PlanRow(
            instance_id=iid,
            workers=tuple(names),
            needed=sum(int(needed[w]) for w in names),
            free=by_id[iid].free,
            limit=by_id[iid].limit,
            usage=by_id[iid].usage,
            replaced=int(replaced.get(iid, 0)),
        )
        for iid, names in workers.items()
    )


def _fixes(rows: Sequence[PlanRow], compact_rows: Sequence[PlanRow] | None) -> list[str]:
    short = [r for r in rows if not r.fits]
    fixes = []
    at_least = _round_up_mib(max(r.usage + r.needed for r in short))
    fixes.append(
        f"a larger vineyard_memory: at least {format_size(at_least)} per vineyardd (its usage "
        "now plus what this pack writes into the fullest one)"
    )
    more = _more_workers(rows)
    if more is not None:
        total, extra, room = more
        fixes.append(
            f"more target workers (distribution_rules): at least {total} in all ({extra} more), "
            f"each with {format_size(room)} free like the fullest target now, so each holds less"
        )
    if compact_rows is not None:
        ratio = sum(r.needed for r in compact_rows) / max(1, sum(r.needed for r in rows))
        if all(r.fits for r in compact_rows):
            fixes.append(
                f"compact=True: uint8 data stored as uint8, {ratio:.2f}x the bytes of this "
                f"float32 layout; the pack then needs "
                f"{format_size(max(r.needed for r in compact_rows))} on the fullest vineyardd, "
                "and fits"
            )
        else:
            fixes.append(
                f"compact=True stores this uint8 data in {ratio:.2f}x the bytes (not enough "
                "alone: combine it with another fix)"
            )
    if all(r.needed <= r.free + r.replaced for r in rows) and any(r.replaced for r in short):
        freed = sum(r.replaced for r in short)
        fixes.append(
            f"drop the dataset being replaced first (dvml.datasets.drop) instead of "
            f"overwrite=True, which keeps it until the new one is complete: that frees "
            f"{format_size(freed)} where room is short, and the pack fits"
        )
    in_use = sum(r.usage - r.replaced for r in short)
    if all(r.usage - r.replaced >= r.short for r in short):  # dropping other data would do
        fixes.append(
            f"drop datasets these vineyardds hold ({format_size(in_use)} in use where room is "
            "short; dvml datasets list / drop)"
        )
    fixes.append("(a smaller buffer_size does not help: the bytes per worker stay the same)")
    return fixes


def _more_workers(rows: Sequence[PlanRow]) -> tuple[int, int, int] | None:
    """Target workers in all, how many more, and the free room per worker assumed: the pack
    balanced over them fits when each has the free room of the fullest target now (None when
    that target has no room at all)."""
    per_worker_free = min(r.free // len(r.workers) for r in rows)
    n = sum(len(r.workers) for r in rows)
    total = sum(r.needed for r in rows)
    if per_worker_free <= 0:
        return None
    wanted = math.ceil(total / per_worker_free)
    return (wanted, wanted - n, per_worker_free) if wanted > n else None
