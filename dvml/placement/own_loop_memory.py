"""The memory plan of ``dvml.run`` (pure): one user training loop per trainer.

dvml cannot see what ``train_fn`` builds (its model, optimizer state, other datasets, Python
objects), so the plan counts what it knows and takes the rest from the caller:

- TensorFlow's runtime in each trainer (a forked trainer's private bytes, its zygote once per
  host; or a process of its own), as a fit's plan counts it;
- the primary dataset's batches in flight: ``BATCHES_HELD`` batches of float32 rows (the
  pipeline that ``context.dataset`` builds prefetches as ``fit``'s does);
- ``built``: the caller's estimate of what ``train_fn`` builds in each trainer
  (``dvml.run(memory=...)``), shown in the ``weights`` column. Without one the plan is a lower
  bound, and its notes say so.

The rows are :class:`~dvml.placement.fit_memory.TrainerMemory`, so admission, reservations,
the accounting and ``dvml cluster status`` treat a run as they treat a fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dvml.placement.fit_memory import (
    BATCHES_HELD,
    FitMemoryPlan,
    HostRoom,
    TrainerMemory,
    host_rows,
    plan_fixes,
    rooms_by_host,
)
from dvml.placement.memory import format_size

__all__ = ["plan_run"]

FLOAT32_BYTES = 4  # a row's values as the model sees them, whatever the storage layout


def plan_run(
    trainers: Sequence[tuple[str, str, int]],
    row_values: int,
    rooms: Sequence[HostRoom],
    *,
    runtime: int,
    zygote: int = 0,
    built: int | None = None,
    margin: float = 0.2,
) -> FitMemoryPlan:
    """The memory plan of a ``dvml.run``.

    Parameters
    ----------
    trainers : sequence of (worker, host, batch rows)
        One per trainer: its worker's name, its host and its share of the global batch.
    row_values : int
        Values of one row of the primary dataset: its x values plus its one-hot labels.
    rooms : sequence of HostRoom
        One per host that ``trainers`` names.
    runtime, zygote : int
        TensorFlow's bytes per trainer, and per host for the zygote the trainers are forked
        from (0: none), as :func:`~dvml.placement.fit_memory.plan_fit` takes them.
    built : int, optional
        Bytes per trainer of what the user's ``train_fn`` builds (None: not counted).
    margin : float
        Fraction added to each host's sum before it is compared with its room.

    Returns
    -------
    FitMemoryPlan
        One row per trainer; ``fixes`` when it does not fit.
    """
    by_host = rooms_by_host(trainers, rooms)
    row = FLOAT32_BYTES * row_values
    hosts: dict[str, list[TrainerMemory]] = {}
    for worker, host, batch in trainers:
        batches = int(batch) * BATCHES_HELD * row
        memory = TrainerMemory(worker, host, int(batch), runtime, built or 0, batches, 0)
        hosts.setdefault(host, []).append(memory)
    if built is None:
        notes = ("what train_fn builds (its model, optimizer state, other datasets) is not "
                 "counted: pass dvml.run(memory=...) with an estimate per trainer; without "
                 "one the plan is a lower bound",)  # fmt: skip
    else:
        notes = (f"weights: the memory= estimate of what train_fn builds, "
                 f"{format_size(built)} per trainer",)  # fmt: skip
    plan = FitMemoryPlan(host_rows(hosts, by_host, margin, zygote), notes=notes)
    if plan.fits:
        return plan
    return dataclasses.replace(plan, fixes=tuple(plan_fixes(plan)))
