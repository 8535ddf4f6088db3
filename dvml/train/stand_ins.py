"""Stand-ins: a live worker that serves a departed trainer's vineyardd takes its place.

On a host of several Dask workers (``cluster/host.sh --workers N``) every worker reaches the
host's one vineyardd, and a fit runs one trainer per vineyard instance that holds rows. When
that trainer's worker dies and the host lives, its rows have not gone anywhere: they sit in
the same vineyardd, which another worker of the host still serves. An elastic fit
(:mod:`dvml.train.elastic`) then goes on with that worker as the trainer of the instance, at
the same row map, instead of copying the rows to another host over the network and leaving
the host's other worker idle.

A worker that left and came back under its name (its Nanny restarted it) is not a stand-in,
as it is not taken back at a join (:mod:`dvml.train.row_map_change`): a flapping worker must
not move the job to and fro.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dvml.cluster.workers import WorkerInfo, discover_workers

if TYPE_CHECKING:
    from collections.abc import Collection

    from distributed import Client

__all__ = ["pick_stand_ins", "stand_ins"]


def pick_stand_ins(
    gone: list[WorkerInfo],
    trainers: list[WorkerInfo],
    live: list[WorkerInfo],
    left: Collection[str] = (),
) -> dict[str, WorkerInfo]:
    """For each departed trainer, a live worker of the same vineyard instance that is not a
    trainer, not one of the departed, and whose name has not left the job (``left``). Pure.

    Returns
    -------
    dict of str to WorkerInfo
        Departed trainer's address -> its stand-in (absent where there is none).
    """
    busy = {w.address for w in (*gone, *trainers)}
    names = {w.name for w in gone} | set(left)
    chosen: dict[str, WorkerInfo] = {}
    for g in gone:
        if g.vineyard_instance_id is None:
            continue
        for w in sorted(live, key=lambda w: w.name):
            if (w.vineyard_instance_id == g.vineyard_instance_id and w.address not in busy
                    and w.name not in names):  # fmt: skip
                chosen[g.address] = w
                busy.add(w.address)
                break
    return chosen


def stand_ins(
    client: Client, gone: list[WorkerInfo], trainers: list[WorkerInfo], left: Collection[str]
) -> dict[str, WorkerInfo]:
    """:func:`pick_stand_ins` over the workers that answer now (a worker whose vineyardd
    does not answer reports no instance, and stands in for no one)."""
    return pick_stand_ins(gone, trainers, discover_workers(client, omit_silent=True), left)
