"""The memory plan of ``dvml.run`` at the edge: the hosts' room and the configuration's
runtime sizes, around the pure :func:`dvml.placement.run_memory.plan_run`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes

from dvml import config
from dvml.exceptions import ArgumentError
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.placement.run_memory import plan_run
from dvml.train.trainer_memory import host_rooms, label_width, trainer_runtime

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.workers import WorkerInfo

__all__ = ["memory_estimate", "run_memory_plan"]


def memory_estimate(memory: int | str | None) -> int | None:
    """``dvml.run``'s ``memory=`` in bytes: an int, or a size such as ``"300MiB"``; None."""
    if memory is None:
        return None
    try:
        value = int(parse_bytes(memory)) if isinstance(memory, str) else memory
    except (ValueError, TypeError):
        value = None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(
            "memory must be the bytes that train_fn builds in each trainer: a non-negative "
            f"int or a size such as '300MiB'. Received: {memory!r}. Leave it out to plan "
            "without it (the plan is then a lower bound)."
        )
    return value


def run_memory_plan(
    client: Client,
    workers: Sequence[WorkerInfo],
    per_worker_batch: Sequence[int],
    summary: Mapping[str, Any],
    memory: int | None,
    use_gpus: bool,
) -> FitMemoryPlan:
    """The memory plan of a run whose trainers run on ``workers`` with these batches of the
    primary dataset (``summary``: its dataset summary), ``memory`` bytes built by train_fn."""
    rooms, machine_of = host_rooms(client, workers)
    runtime, zygote = trainer_runtime(use_gpus)
    values = sum(math.prod(s) for s in summary["x_shapes"]) + label_width(summary["num_classes"])
    return plan_run(
        [(w.name, machine_of[w.host], b) for w, b in zip(workers, per_worker_batch, strict=True)],
        values,
        rooms,
        runtime=runtime,
        zygote=zygote,
        built=memory,
        margin=float(config.get("memory.margin")),
    )
