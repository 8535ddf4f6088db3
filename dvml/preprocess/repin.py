"""Re-pin the rows of workers that left an elastic job onto the survivors.

When a worker of an elastic job (``dvml.fit(..., elastic=True)``) leaves, its buffers are
copied whole onto the surviving trainers' vineyardds before they go on, so every later
iteration still trains every row once per epoch. The bytes come only from the departed
worker's own vineyardd: a Dask worker process that died (SIGKILL, a crash) leaves its
vineyardd and the buffers in it running, and any live worker of the same machine reads them
through that daemon's IPC socket (RPC is off between dvml's daemons). Which buffer goes where is
the pure plan of :func:`dvml.placement.repin_plan.plan_repin`; the copy and the publication of
the dataset's next version (same buffers, same digests, new placement, its version record
carrying ``"repin"``) are the rebalance's (:mod:`dvml.preprocess.rebalance`).

When no live worker reaches the departed vineyardd (its host died), its rows cannot be
copied: they are left out and :func:`repin` says how many. Re-packing them from the source is
not done (yet): the job goes on without them and says so.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dvml.cluster.connection import unix_socket_answers
from dvml.cluster.workers import WorkerInfo, discover_workers
from dvml.placement.repin_plan import RepinPlan, plan_repin
from dvml.preprocess.rebalance import copy_and_publish, move_record
from dvml.store.datasets import describe

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["repin", "store_answers"]


def store_answers(socket: str) -> bool:
    """(Runs on a worker.) Whether the vineyardd listening on ``socket`` accepts connections
    from this worker's machine."""
    return bool(socket) and unix_socket_answers(socket)


def _machine(address: str) -> str:
    return address.split("://")[-1].rsplit(":", 1)[0]


def _readers(
    client: Client, gone: list[WorkerInfo], survivors: list[WorkerInfo]
) -> dict[str, tuple[str, str | None]]:
    """For each departed worker whose vineyardd still answers: a live worker of its machine
    that reads it (a survivor first), and the daemon's socket."""
    live = {w.address: w for w in survivors}
    for w in discover_workers(client, omit_silent=True):  # a worker restarted meanwhile, too
        live.setdefault(w.address, w)
    gone_addresses = {g.address for g in gone}
    readers: dict[str, tuple[str, str | None]] = {}
    for g in gone:
        if not g.vineyard_socket:
            continue
        for w in live.values():
            if w.address in gone_addresses or _machine(w.address) != _machine(g.address):
                continue
            answers = client.submit(
                store_answers, g.vineyard_socket, workers=[w.address],
                allow_other_workers=False, pure=False,
            )  # fmt: skip
            try:
                if answers.result(timeout=30):
                    readers[g.address] = (w.address, g.vineyard_socket)
                    break
            except Exception:  # that worker went too: try the next one
                continue
    return readers


def repin(
    client: Client,
    name: str,
    gone: list[WorkerInfo],
    survivors: list[WorkerInfo],
) -> dict[str, Any]:
    """Copy the buffers of dataset ``name`` held by the ``gone`` workers onto ``survivors``.

    Parameters
    ----------
    client : distributed.Client
    name : str
        The dataset (its latest version).
    gone : list of WorkerInfo
        The workers that left (their vineyard instance identifies their buffers).
    survivors : list of WorkerInfo
        The workers the job goes on with (the copies' targets).

    Returns
    -------
    dict
        ``dataset``, ``path`` (``"copied"``: every departed row was copied; ``"left_out"``:
        none could be; ``"partly"``; ``"none"``: the departed held no row of it),
        ``repinned_rows``, ``repinned_buffers``, ``bytes_moved``, ``rows_left_out``,
        ``buffers_left_out``, ``left_out_reason`` (None when none), ``moves`` (``{"buffer",
        "from", "to", "rows", "nbytes"}``), ``version`` (the one published, else the
        current one) and ``repin_seconds`` (the copy and the publication).
    """
    started = time.monotonic()
    dataset = describe(name, client=client)
    worker_of = {w.vineyard_instance_id: w.address for w in (*gone, *survivors)}
    buffers = [{"index": b["index"], "worker": worker_of.get(b["instance_id"], b["worker"]),
                "rows": b["rows"],
                "nbytes": sum(int(f["nbytes"]) for f in b["fields"].values())}
               for b in dataset.layout["buffers"]]  # fmt: skip
    departed = [g.address for g in gone]
    readers = (
        _readers(client, gone, survivors) if any(b["worker"] in departed for b in buffers) else {}
    )
    plan = plan_repin(buffers, departed, [w.address for w in survivors], readers)
    result = _result(name, plan, dataset.version, gone, readers)
    if plan.moves:
        by_address = {w.address: w for w in survivors}
        published, _ = copy_and_publish(
            client, dataset, plan.moves, by_address, result, True, readers, "repin"
        )
        result["version"] = published["version"]
    result["repin_seconds"] = round(time.monotonic() - started, 3)
    return result


def _result(
    name: str,
    plan: RepinPlan,
    version: int,
    gone: list[WorkerInfo],
    readers: dict[str, Any],
) -> dict[str, Any]:
    unread = [g.name for g in gone if g.address not in readers]
    path = "none"
    if plan.moves and plan.left_out:
        path = "partly"
    elif plan.moves:
        path = "copied"
    elif plan.left_out:
        path = "left_out"
    reason = None
    if plan.left_out:
        reason = (
            f"the vineyardd of {unread} does not answer from any live worker of its machine "
            "(its host died or it was stopped): its buffers could not be copied"
        )
    return {
        "dataset": name,
        "path": path,
        "repinned_rows": plan.repinned_rows,
        "repinned_buffers": len(plan.moves),
        "bytes_moved": plan.bytes_moved,
        "rows_left_out": plan.rows_left_out,
        "buffers_left_out": list(plan.left_out),
        "left_out_reason": reason,
        "moves": [move_record(m) for m in plan.moves],
        "version": version,
    }
