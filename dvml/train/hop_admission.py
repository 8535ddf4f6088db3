"""Admission of a model-hopper job (``fit_multiple``, the searches): its plan, before any
trainer starts, and its reservation while it runs.

The plan is pure (:func:`dvml.placement.hop_memory.plan_hop`); this module reads the hosts'
room (:func:`dvml.train.trainer_memory.host_rooms`) and the ``dvml.memory`` configuration,
refuses a job that does not fit with :class:`~dvml.exceptions.MemoryPlanError`, and reserves
an admitted job's bytes on the scheduler beside the fits' (:func:`dvml.train.fit_admission.
reserved`), so a fit and a fit_multiple count against each other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.exceptions import MemoryPlanError
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.placement.hop_memory import HopConfig, plan_hop
from dvml.placement.memory import format_size
from dvml.train.runtime.plan import rows_per_worker
from dvml.train.trainer_memory import host_rooms, label_width, trainer_runtime

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo
    from dvml.store.datasets import Dataset

__all__ = ["check_hop_fits", "hop_configs", "hop_memory_plan"]


def hop_configs(configs: Sequence[Mapping[str, Any]]) -> list[HopConfig]:
    """The :class:`HopConfig` of each trainer configuration (``model_json`` text, the parsed
    ``compile_params`` and ``fit_params``: :meth:`~dvml.train.runtime.plan.ModelSpec.config`)."""
    return [
        HopConfig(
            json.loads(c["model_json"]),
            c["compile_params"].get("optimizer", "rmsprop"),  # tf-keras' compile default
            int(c["fit_params"].get("batch_size", 32)),  # the serving trainer's default
        )
        for c in configs
    ]


def hop_memory_plan(
    client: Client,
    workers: Sequence[WorkerInfo],
    train: Dataset,
    configs: Sequence[Mapping[str, Any]],
    *,
    use_gpus: bool = False,
) -> FitMemoryPlan:
    """The memory plan of a hopper job training ``configs`` (trainer configurations, see
    :func:`hop_configs`) on ``workers`` (one trainer each) over ``train``."""
    rooms, machine_of = host_rooms(client, workers)
    runtime, zygote = trainer_runtime(use_gpus, serving=True)
    rows = rows_per_worker(train, list(workers))
    return plan_hop(
        [(w.name, machine_of[w.host], rows[w.name]) for w in workers],
        [list(s) for s in train.summary["x_shapes"]],
        label_width(train.summary["num_classes"]),
        hop_configs(configs),
        rooms,
        runtime=runtime,
        zygote=zygote,
        margin=float(config.get("memory.margin")),
    )


def check_hop_fits(plan: FitMemoryPlan, job: str, configs: int) -> None:
    """Raise :class:`MemoryPlanError` when the hopper job ``job``'s ``plan`` does not fit its
    hosts alone; its message has the plan, with the fixes."""
    if plan.fits:
        return
    short = plan.short
    largest = max(t.batch for t in plan.trainers)
    raise MemoryPlanError(
        f"{job} does not fit in its hosts' memory: {len(short)} of {len(plan.hosts)} hosts "
        f"lack room for their trainers. No trainer was started. Received: {configs} "
        f"configurations on {len(plan.trainers)} trainers (largest batch {largest} rows), host "
        f"room {', '.join(f'{h.host}: {format_size(h.room.room)}' for h in plan.hosts)}. The "
        f"plan, per host and trainer:\n{plan.describe()}",
        plan,
    )
