"""Admission of a fit: its trainers' memory plan against each host's room, before any starts.

The plan is pure (:func:`dvml.placement.fit_memory.plan_fit`); this module reads what it
needs at the edge: each host's available memory and cgroup limit (from the workers'
heartbeats, else one task per host) and the ``dvml.memory`` configuration. A fit whose trainers do
not fit their hosts is refused with :class:`~dvml.exceptions.MemoryPlanError` carrying the
plan and its fixes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes

from dvml import config
from dvml.cluster.health import wait_watched
from dvml.cluster.host_room import host_memory
from dvml.cluster.worker_metrics import HOST_METRIC
from dvml.exceptions import MemoryPlanError
from dvml.placement.fit_memory import FitMemoryPlan, HostRoom, machine_rooms, plan_fit
from dvml.placement.memory import format_size

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

__all__ = ["check_fit_fits", "fit_memory_plan", "host_memory", "host_rooms", "label_width"]


def host_rooms(
    client: Client, workers: Sequence[WorkerInfo]
) -> tuple[list[HostRoom], dict[str, str]]:
    """The room of each machine of ``workers`` and each host's machine (see
    :func:`~dvml.placement.fit_memory.machine_rooms`), capped by ``dvml.memory.host-memory``.

    Read from the workers' last heartbeats (:data:`~dvml.cluster.worker_metrics.HOST_METRIC`,
    at most a heartbeat old) in one scheduler call; where a worker has no such metric (its
    plugin is not installed), from one task per host, all at once.
    """
    one_each: dict[str, WorkerInfo] = {}
    for w in workers:
        one_each.setdefault(w.host, w)
    addresses = [w.address for w in one_each.values()]
    found = client.run_on_scheduler(_heartbeat_memory, addresses=addresses)
    if any(found.get(a) is None for a in addresses):
        futures = [
            client.submit(host_memory, workers=[a], allow_other_workers=False, pure=False)
            for a in addresses
        ]
        wait_watched(client, futures, "reading the hosts' memory")
        found = dict(zip(addresses, client.gather(futures), strict=True))
    cap_value = config.get("memory.host-memory")
    cap = None if cap_value is None else int(parse_bytes(str(cap_value)))
    readings = {host: tuple(found[w.address]) for host, w in one_each.items()}
    return machine_rooms(readings, cap)


def _heartbeat_memory(dask_scheduler: Any, addresses: Sequence[str]) -> dict[str, Any]:
    """On the scheduler: each worker's last host-memory metric (None where it has none)."""
    out = {}
    for address in addresses:
        ws = dask_scheduler.workers.get(address)
        out[address] = None if ws is None else ws.metrics.get(HOST_METRIC)
    return out


def fit_memory_plan(
    client: Client,
    workers: Sequence[WorkerInfo],
    per_worker_batch: Sequence[int],
    dataset_summary: Mapping[str, Any],
    arch: Mapping[str, Any],
    compile_params: Mapping[str, Any],
    weights: Sequence[Any] | None = None,
    *,
    use_gpus: bool = False,
) -> FitMemoryPlan:
    """The memory plan of a fit whose trainers run on ``workers`` with these batches;
    ``weights``, when the fit starts from stored ones, give the parameters' bytes exactly."""
    rooms, machine_of = host_rooms(client, workers)
    runtime, zygote = trainer_runtime(use_gpus)
    return plan_fit(
        [(w.name, machine_of[w.host], b) for w, b in zip(workers, per_worker_batch, strict=True)],
        [list(s) for s in dataset_summary["x_shapes"]],
        label_width(dataset_summary["num_classes"]),
        json.loads(arch["model_json"]),
        compile_params.get("optimizer", "rmsprop"),  # tf-keras' compile default
        rooms,
        runtime=runtime,
        zygote=zygote,
        margin=float(config.get("memory.margin")),
        weights_bytes=sum(int(w.nbytes) for w in weights) if weights is not None else None,
    )


def trainer_runtime(use_gpus: bool, serving: bool = False) -> tuple[int, int]:
    """TensorFlow's runtime in a job's plan: bytes per trainer and per host (its zygote).

    CPU trainers are forked from their machine's zygote where ``dvml.train.fork-trainers``
    allows (Linux): each counts its private bytes (``memory.trainer-runtime-forked``; a
    ``serving`` trainer of a model-hopper job, which runs no distribution strategy,
    ``memory.serving-runtime-forked``) and the host its zygote once (``memory.zygote``). GPU
    trainers, and every trainer without the zygote, are processes of their own
    (``memory.trainer-runtime`` each, no zygote).
    """
    if use_gpus or not config.get("train.fork-trainers") or not sys.platform.startswith("linux"):
        return _size("memory.trainer-runtime"), 0
    forked = "memory.serving-runtime-forked" if serving else "memory.trainer-runtime-forked"
    return _size(forked), _size("memory.zygote")


def _size(key: str) -> int:
    return int(parse_bytes(str(config.get(key))))


def label_width(num_classes: Any) -> int:
    """The one-hot width of a row's labels: a multi-output dataset's ``num_classes`` is one
    count per output, and their sum is what a row carries."""
    if isinstance(num_classes, list | tuple):
        return sum(int(n or 0) for n in num_classes)
    return int(num_classes or 0)


def check_fit_fits(
    plan: FitMemoryPlan, model: str, batch_size: int, job: str | None = None
) -> None:
    """Raise :class:`MemoryPlanError` when ``plan`` does not fit; its message has the plan.
    ``job`` names it (default: the fit of ``model``)."""
    if plan.fits:
        return
    short, job = plan.short, job or f"fit of model {model!r}"
    raise MemoryPlanError(
        f"The {job} does not fit in its hosts' memory: {len(short)} of "
        f"{len(plan.hosts)} hosts lack room for their trainers. No trainer was started. "
        f"Received: {len(plan.trainers)} trainers, batch_size={batch_size}, host room "
        f"{', '.join(f'{h.host}: {format_size(h.room.room)}' for h in plan.hosts)}. The plan, "
        f"per host and trainer:\n{plan.describe()}",
        plan,
    )
