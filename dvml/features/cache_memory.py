"""Admission of a feature cache: its memory plan against the live vineyardds and hosts, before
any feature is computed or written.

The plan is pure (:func:`dvml.placement.feature_memory.plan_features`); this module reads what
it needs at the edge, in one round of tasks: one per worker that holds images (all at once),
each returning its vineyardd's limit and usage, its host's available memory and cgroup room,
and whether TensorFlow is imported in that worker process already. A cache whose plan does not
fit is refused with :class:`~dvml.exceptions.MemoryPlanError` carrying the plan and its fixes.
The late check of each write (:func:`dvml.store.tensors.write_buffers`) stays as the backstop.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes

from dvml import config
from dvml.cluster.health import wait_watched
from dvml.cluster.host_room import host_memory
from dvml.cluster.workers import discover_workers
from dvml.exceptions import MemoryPlanError
from dvml.placement.feature_memory import (
    BackboneSize,
    FeatureMemoryPlan,
    FeatureTarget,
    plan_features,
)
from dvml.placement.fit_memory import machine_rooms
from dvml.placement.memory import MemoryPlan, VineyarddRoom, format_size
from dvml.store.tensors import vineyard_room

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo
    from dvml.features.backbone import Backbone

__all__ = [
    "admit",
    "backbone_size",
    "cache_memory_plan",
    "check_cache_fits",
    "dataset_rows",
    "source_cache_plan",
    "worker_room",
]


def worker_room() -> tuple[int, int, int, str, int, int | None, bool]:
    """On a worker: its vineyardd's ``(instance id, limit, usage)``, its host's ``(boot id,
    available, cgroup free)`` (:func:`dvml.cluster.host_room.host_memory`) and whether
    TensorFlow is imported in this process."""
    instance, limit, usage = vineyard_room()
    boot, available, cgroup = host_memory()
    return instance, limit, usage, boot, available, cgroup, "tensorflow" in sys.modules


def backbone_size(bb: Backbone, label_values: int) -> BackboneSize:
    """The plan's view of a checked backbone."""
    return BackboneSize(
        params=int(bb.n_params),
        activations_per_row=int(bb.activations_per_row),
        input_values=math.prod(bb.input_shape),
        feature_values=math.prod(bb.feature_shape),
        label_values=int(label_values),
    )


def cache_memory_plan(
    client: Client,
    bb: Backbone,
    label_values: int,
    batch_size: int,
    rows: Mapping[str, Sequence[int]],
    workers: Sequence[WorkerInfo],
    *,
    compact: bool = False,
    source_bytes: Mapping[str, int] | None = None,
) -> FeatureMemoryPlan:
    """The memory plan of featurizing ``rows`` (worker address → the rows of each of its
    buffers) on ``workers`` with ``bb``; ``source_bytes``: a raw source's packed bytes per
    worker address, written first (none for a packed dataset)."""
    chosen = [w for w in workers if w.address in rows]
    futures = [
        client.submit(worker_room, workers=[w.address], allow_other_workers=False, pure=False)
        for w in chosen
    ]
    wait_watched(client, futures, "reading the workers' memory")
    readings = dict(zip((w.address for w in chosen), client.gather(futures), strict=True))
    vineyardds = {r[0]: VineyarddRoom(r[0], r[1], r[2]) for r in readings.values()}
    cap_value = config.get("memory.host-memory")
    rooms, machine_of = machine_rooms(
        {w.host: readings[w.address][3:6] for w in chosen},
        None if cap_value is None else int(parse_bytes(str(cap_value))),
    )
    targets = [
        FeatureTarget(w.name, machine_of[w.host], readings[w.address][0],
                      tuple(int(n) for n in rows[w.address]), readings[w.address][6],
                      int((source_bytes or {}).get(w.address, 0)))
        for w in chosen
    ]  # fmt: skip
    pooled = bb.feature_shape[-1] if bb.pooling is None and len(bb.feature_shape) > 1 else None
    return plan_features(
        targets, backbone_size(bb, label_values), batch_size, list(vineyardds.values()), rooms,
        compact=compact, runtime=int(parse_bytes(str(config.get("memory.featurize-runtime")))),
        margin=float(config.get("memory.margin")), pooled_values=pooled,
    )  # fmt: skip


def check_cache_fits(plan: FeatureMemoryPlan, name: str, batch_size: int) -> None:
    """Raise :class:`MemoryPlanError` when ``plan`` does not fit; its message has the plan."""
    if plan.fits:
        return
    short_v = [r for r in plan.vineyardds if not r.fits]
    short_h = [h for h in plan.hosts if not h.fits]
    raise MemoryPlanError(
        f"The feature cache {name!r} does not fit: {len(short_v)} of {len(plan.vineyardds)} "
        f"vineyardds lack room for its features, {len(short_h)} of {len(plan.hosts)} hosts "
        f"for the Dask workers that run the backbone. Nothing was computed or written. "
        f"Received: {sum(w.rows for w in plan.workers)} rows of {plan.row_bytes} bytes "
        f"({format_size(plan.shared)} of features and labels), batch_size={batch_size}, "
        f"{len(plan.workers)} workers. The plan:\n{plan.describe()}",
        plan,
    )


def dataset_rows(layout: Mapping[str, Any], targets: Sequence[WorkerInfo],
                 positions: Sequence[int]) -> dict[str, list[int]]:  # fmt: skip
    """Worker address → the rows of each buffer at ``positions`` it featurizes."""
    rows: dict[str, list[int]] = {}
    for i in positions:
        rows.setdefault(targets[i].address, []).append(int(layout["buffers"][i]["rows"]))
    return rows


def admit(
    client: Client,
    src: Any,
    bb: Backbone,
    batch_size: int,
    name: str,
    targets: Sequence[WorkerInfo],
    positions: Sequence[int],
) -> FeatureMemoryPlan:
    """Plan featurizing the buffers of dataset ``src`` at ``positions`` (held by ``targets``,
    one per buffer) and refuse it when it does not fit; returns the plan."""
    s = src.summary
    plan = cache_memory_plan(
        client, bb, math.prod(s["y_shape"]), batch_size,
        dataset_rows(src.layout, targets, positions), targets,
        compact=bool((s.get("storage") or {}).get("compact")),
    )  # fmt: skip
    check_cache_fits(plan, name, batch_size)
    return plan


def source_cache_plan(
    client: Client,
    bb: Backbone,
    packed: MemoryPlan,
    label_values: int,
    batch_size: int,
) -> FeatureMemoryPlan:
    """The memory plan of a cache of a raw source, from the plan of the source's pack
    (``packed``, with ``label_values`` classes): each worker's rows taken as one buffer, its
    packed bytes written first (the plan's ``source`` column)."""
    by_name = {w.name: w for w in discover_workers(client)}
    rows, source_bytes, workers = {}, {}, []
    for row in packed.rows:
        total = row.needed // max(1, packed.row_bytes)
        for k, name in enumerate(row.workers):  # a vineyardd's rows split over its workers
            n = total // len(row.workers) + (k < total % len(row.workers))
            w = by_name[name]
            rows[w.address], source_bytes[w.address] = [n], n * packed.row_bytes
            workers.append(w)
    return cache_memory_plan(client, bb, label_values, batch_size, rows, workers,
                             source_bytes=source_bytes)  # fmt: skip
