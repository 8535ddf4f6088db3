"""The memory plan of a model-hopper job (``fit_multiple``, Hyperband, hyperopt, ASHA).

Pure: plain values in (each trainer's worker, host and local rows, the dataset's row shapes,
each configuration's architecture JSON, optimizer and batch, each host's room), a
:class:`~dvml.placement.fit_memory.FitMemoryPlan` out (the table type of a fit's plan).
:func:`dvml.train.hop_admission.hop_memory_plan` gathers the rooms and admits the job.

A hopper job runs ONE serving trainer per worker holding data for the whole job
(:mod:`dvml.train.runtime.sessions`), and every configuration visits every trainer. Where
each configuration's weights and optimizer slots (its *state*) live:

- **in the step**: the model being trained, with its gradients (one at a time per trainer):
  the largest configuration's weights, gradients and slots (``weights``), its batches in
  flight and their activations (``batches``, the largest of the configurations') and its
  evaluation (``evaluation``), as in a fit (:func:`~dvml.placement.fit_memory.plan_fit`);
- **compiled in the trainer**: the serving trainer keeps one compiled Keras model per
  configuration it has trained (``serve_program.Models``), so once every configuration has
  visited it, it holds every other configuration's weights and slots too (``models``);
- **parked in the Dask worker**: a parked model's state is the result of the task that last
  trained it, bytes in that worker's Dask process until a hop moves it (``parked``). States
  are spread over the workers by the round robin; each worker is planned its share of all
  the states, rounded up, plus one more of the largest (the state arriving for the next hop);
- **on disk**: each model's last two checkpoints, in the workers' state directory: no memory
  (a note gives their bytes).

The dataset adds nothing: trainers read its buffers zero-copy from vineyardd's shared memory,
counted when it was packed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dvml.placement.fit_memory import (
    BATCHES_HELD,
    TRAINER_RUNTIME_BYTES,
    FitMemoryPlan,
    HostRoom,
    TrainerMemory,
    count_model,
    host_rows,
    optimizer_slots,
    plan_fixes,
)
from dvml.placement.memory import format_size
from dvml.placement.metrics_batch import evaluation_batch

__all__ = ["HopConfig", "plan_hop"]

_FLOAT = 4  # bytes of one float32


@dataclasses.dataclass(frozen=True)
class HopConfig:
    """One configuration of a hopper job, as its memory sees it.

    Attributes
    ----------
    model : mapping
        The architecture's JSON, parsed.
    optimizer : str or mapping
        The compile parameters' optimizer.
    batch_size : int
        The batch of the one trainer that holds the model (``fit_params``' ``batch_size``).
    weights_bytes : int, optional
        Bytes of its starting weights when known exactly (a warm start); else counted.
    """

    model: Mapping[str, Any]
    optimizer: Any
    batch_size: int
    weights_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class _Sized:
    params: int
    activations: int
    slots: int
    batch_size: int
    unknown: str | None

    @property
    def state(self) -> int:
        """Weights and optimizer slots: a parked model, compiled or as state bytes."""
        return _FLOAT * self.params * (1 + self.slots)

    @property
    def training(self) -> int:
        """Weights, gradients and slots: the model in the step."""
        return _FLOAT * self.params * (2 + self.slots)


def _size(c: HopConfig, x_shapes: Sequence[Sequence[int]]) -> _Sized:
    count = count_model(c.model, x_shapes[0]) if len(x_shapes) == 1 else None
    unknown = "a model of several inputs" if count is None else count.unknown
    params = (c.weights_bytes // _FLOAT) if c.weights_bytes else (count.params if count else 0)
    acts = count.activations_per_row if count else 0
    return _Sized(params, acts, optimizer_slots(c.optimizer), int(c.batch_size), unknown)


def plan_hop(
    trainers: Sequence[tuple[str, str, int]],
    x_shapes: Sequence[Sequence[int]],
    num_classes: int,
    configs: Sequence[HopConfig],
    rooms: Sequence[HostRoom],
    *,
    runtime: int = TRAINER_RUNTIME_BYTES,
    zygote: int = 0,
    margin: float = 0.2,
) -> FitMemoryPlan:
    """The memory plan of a model-hopper job (see the module's docstring for what it counts).

    Parameters
    ----------
    trainers : sequence of (worker, host, local rows)
        One per trainer: its worker's name, its host (machine) and the training rows it holds
        (a configuration's batch is capped by them, as the serving trainer does).
    x_shapes : sequence of shapes
        One row's x shape per model input (the dataset's ``x_shapes``).
    num_classes : int
        Classes of y (one-hot float32 in the trainers).
    configs : sequence of HopConfig
        Every configuration the job trains (at least one).
    rooms : sequence of HostRoom
        One per host that ``trainers`` names.
    runtime : int
        Bytes of TensorFlow's runtime per trainer (as in
        :func:`~dvml.placement.fit_memory.plan_fit`).
    zygote : int
        Bytes of the zygote the trainers are forked from, counted once per host (0: none).
    margin : float
        Fraction added to each host's sum before it is compared with its room.

    Returns
    -------
    FitMemoryPlan
        One :class:`~dvml.placement.fit_memory.TrainerMemory` per trainer; ``fixes`` when it
        does not fit (with fewer configurations among them).
    """
    from dvml.exceptions import ArgumentError

    by_host = {r.host: r for r in rooms}
    missing = sorted({h for _, h, _ in trainers} - set(by_host))
    if missing or not configs or not trainers:
        raise ArgumentError(
            "A hopper job's plan needs at least one trainer, one configuration and a room for "
            f"every trainer's host. Received: {len(trainers)} trainers, {len(configs)} "
            f"configurations, rooms for {sorted(by_host)} (missing {missing})."
        )
    sized = [_size(c, x_shapes) for c in configs]
    values = sum(math.prod(s) for s in x_shapes)
    row = _FLOAT * (values + num_classes)
    largest = max(sized, key=lambda s: s.training)
    states = sum(s.state for s in sized)
    share = math.ceil(states / len(trainers)) + max(s.state for s in sized)

    def trainer(worker: str, host: str, rows: int) -> TrainerMemory:
        batch = {id(s): min(s.batch_size, max(1, int(rows))) for s in sized}
        return TrainerMemory(
            worker, host, max(batch.values()), runtime, largest.training,
            max(batch[id(s)] * (BATCHES_HELD * row + 2 * _FLOAT * s.activations) for s in sized),
            max(min(int(rows), evaluation_batch(batch[id(s)], values)) for s in sized)
            * (row + _FLOAT * num_classes),
            models=states - largest.state, parked=share,
        )  # fmt: skip

    hosts: dict[str, list[TrainerMemory]] = {}
    for worker, host, rows in trainers:
        hosts.setdefault(host, []).append(trainer(worker, host, rows))
    host_plan = host_rows(hosts, by_host, margin, zygote)
    plan = FitMemoryPlan(host_plan, notes=tuple(_notes(sized, states)))
    if plan.fits:
        return plan
    return dataclasses.replace(
        plan, fixes=tuple(plan_fixes(plan, global_batch=False) + _fewer(plan, sized))
    )


def _notes(sized: Sequence[_Sized], states: int) -> list[str]:
    notes = [
        "the dataset adds nothing here: trainers read its buffers zero-copy from vineyardd's "
        "shared memory, already counted when it was packed",
        f"{len(sized)} configurations: each trainer keeps every one compiled once it has "
        f"trained it; their states ({format_size(states)} in all) are parked in the workers' "
        f"Dask processes between hops, and each model's last two checkpoints take "
        f"{format_size(2 * states)} of the workers' disks in all (no memory)",
    ]
    unknown = sorted({s.unknown for s in sized if s.unknown})
    if unknown:
        notes.append(f"weights and activations beyond {', '.join(unknown)} are not counted "
                     "(not read from the JSON): the plan is a lower bound")  # fmt: skip
    return notes


def _fewer(plan: FitMemoryPlan, sized: Sequence[_Sized]) -> list[str]:
    """How many configurations of this job would fit on its tightest host, if fewer do."""
    worst = max(plan.short, key=lambda h: h.with_margin - h.room.room)
    usable = worst.usable / len(worst.trainers)
    one = worst.trainers[0]
    fixed = one.runtime + one.weights + one.batches + one.evaluation
    # n configurations of the largest's size S take (n - 1) S compiled beside the one in the
    # step, and n S / W + S parked (the share and the one arriving): n S (1 + 1/W) in all
    per = max(s.state for s in sized) * (1 + 1 / len(plan.trainers))
    n = int((usable - fixed) // per) if usable > fixed and per else 0
    if 1 <= n < len(sized):
        return [
            f"fewer configurations in parallel: at most {n} of these {len(sized)} fit "
            f"({format_size(int(per))} each per trainer, compiled and parked); run them in "
            "several fit_multiple calls, or an automl search that trains fewer at once"
        ]
    return []
