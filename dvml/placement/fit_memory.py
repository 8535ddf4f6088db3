"""The memory plan of a fit: each trainer's resident bytes, summed per host, against its room.

Pure: plain values in (the architecture's JSON, the optimizer, each trainer's batch, the
dataset's row shapes, each host's room), a :class:`FitMemoryPlan` out.
:mod:`dvml.train.trainer_memory` gathers the hosts' room and refuses a fit that does not fit.

A trainer's resident bytes are:

- **runtime**: TensorFlow and tf-keras imported and one small fit run. A trainer forked from
  its machine's *zygote* (:mod:`dvml.cluster.zygote`: CPU fits, the default on Linux) shares
  the import's pages with it: it counts its private bytes (:data:`FORKED_RUNTIME_BYTES`,
  config ``dvml.memory.trainer-runtime-forked``), and its host counts the zygote once
  (:data:`ZYGOTE_BYTES`, ``dvml.memory.zygote``). A trainer started as a process of its own
  (GPU fits, ``dvml.train.fork-trainers: false``) counts the whole runtime
  (:data:`TRAINER_RUNTIME_BYTES`, ``dvml.memory.trainer-runtime``);
- **weights**: the model's parameters (float32), their gradients (one more copy) and the
  optimizer's slots (:func:`optimizer_slots`: Adam 2 per weight, SGD with momentum 1, ...);
- **batches**: the trainer's share of the global batch, as the model reads it (float32 x and
  one-hot y, whatever the storage layout), times the batches held at once: two prefetched by
  tf.data plus the one in the step; and the activations of that batch, forward and backward;
- **evaluation**: the metrics at the end of an iteration: one batch of the metrics pass
  (:func:`dvml.placement.metrics_batch.evaluation_batch`) and its predictions.

The dataset itself adds nothing: trainers read its buffers where they lie, in vineyardd's
shared memory, already counted in the pack's plan (:mod:`dvml.placement.memory`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dvml.placement.memory import format_size
from dvml.placement.metrics_batch import evaluation_batch

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BATCHES_HELD",
    "FORKED_RUNTIME_BYTES",
    "TRAINER_RUNTIME_BYTES",
    "ZYGOTE_BYTES",
    "FitMemoryPlan",
    "HostRoom",
    "HostRow",
    "TrainerMemory",
    "count_model",
    "host_rows",
    "machine_rooms",
    "optimizer_slots",
    "plan_fit",
    "plan_fixes",
    "room_line",
    "rooms_by_host",
]

_MiB = 2**20
_FLOAT = 4  # bytes of one float32: weights, gradients, slots and batches as the model sees them

#: PSS of one trainer process after importing TensorFlow 2.21 + tf-keras and running a tiny
#: fit and evaluate (CPU, measured here: 650 MiB after the import, 682 MiB after the fit),
#: rounded up. Config ``dvml.memory.trainer-runtime`` overrides it.
TRAINER_RUNTIME_BYTES = 700 * _MiB

#: Private bytes (``Private_Clean + Private_Dirty``) of a trainer forked from the zygote, after
#: a tiny fit and its metrics (CPU, measured here: 118 MiB), rounded up; the pages it shares
#: with the zygote are the zygote's. Config ``dvml.memory.trainer-runtime-forked``.
FORKED_RUNTIME_BYTES = 128 * _MiB

#: Resident set of a machine's zygote, the process that imported TensorFlow and tf-keras once
#: and forks the trainers (CPU, measured here: 644 MiB), rounded up; counted once per host.
#: Config ``dvml.memory.zygote``.
ZYGOTE_BYTES = 650 * _MiB

#: Batches a trainer holds at once: tf.data's ``prefetch(2)`` (dvml.resolve.tfdata) plus the
#: one in the step.
BATCHES_HELD = 3

# Slots per weight of each optimizer (tf-keras' names; MADlib users write them in lower case).
_SLOTS = {
    "adam": 2, "adamw": 2, "adamax": 2, "nadam": 2, "adadelta": 2, "ftrl": 2, "lion": 1,
    "adagrad": 1, "rmsprop": 1, "adafactor": 2, "sgd": 0,
}  # fmt: skip


def optimizer_slots(optimizer: Any) -> int:
    """Slot variables per weight of ``optimizer`` (a name or ``{"class_name", "config"}``).

    Adam keeps two (``m``, ``v``; three with ``amsgrad``), SGD none (one with momentum),
    RMSprop one (two with momentum, three when also centered). An optimizer not known here
    counts two, Adam's.
    """
    name, conf = optimizer, {}
    if isinstance(optimizer, Mapping):
        name, conf = optimizer.get("class_name", ""), dict(optimizer.get("config") or {})
    key = str(name).lower().replace("_", "")
    slots = _SLOTS.get(key, 2)
    if key == "sgd" and conf.get("momentum"):
        slots = 1
    if key == "adam" and conf.get("amsgrad"):
        slots = 3
    if key == "rmsprop":
        slots += bool(conf.get("momentum")) + bool(conf.get("centered"))
    return slots


@dataclasses.dataclass(frozen=True)
class ModelCount:
    """What :func:`count_model` read from an architecture: parameters, and the float32
    elements the layers output per row (activations); ``unknown`` names a layer it could not
    count (then both figures cover the layers before it only)."""

    params: int
    activations_per_row: int
    unknown: str | None = None


def count_model(model: Mapping[str, Any], input_shape: Sequence[int]) -> ModelCount:
    """Parameters and per-row activations of a Sequential Keras model, from its JSON.

    Counts Dense, Conv1D/2D/3D, Embedding, BatchNormalization, LayerNormalization, pooling,
    Flatten, Reshape and the layers that keep their input's shape; anything else stops the
    count and is named in ``unknown`` (then the figures are lower bounds). ``input_shape`` is
    one row's x shape, without the batch dimension.
    """
    config = model.get("config")
    layers = config if isinstance(config, list) else (config or {}).get("layers", [])
    if model.get("class_name") not in (None, "Sequential") and not isinstance(config, list):
        return ModelCount(0, 0, f"a {model.get('class_name')} model")
    shape = [int(d) for d in input_shape]
    params = acts = 0
    for layer in layers:
        kind, conf = layer.get("class_name", ""), layer.get("config") or {}
        step = _layer(kind, conf, shape)
        if step is None:
            return ModelCount(params, acts, f"layer {kind}")
        p, shape = step
        params += p
        acts += math.prod(shape) if kind != "InputLayer" else 0
    return ModelCount(params, acts)


_SHAPE_KEEPING = frozenset({
    "Activation", "ActivityRegularization", "AlphaDropout", "Dropout", "ELU", "GaussianDropout",
    "GaussianNoise", "LeakyReLU", "ReLU", "Softmax", "ThresholdedReLU", "SpatialDropout1D",
    "SpatialDropout2D", "SpatialDropout3D", "InputLayer", "RandomFlip", "RandomRotation",
    "RandomZoom", "RandomTranslation", "Rescaling", "Normalization",
})  # fmt: skip


def _layer(kind: str, conf: Mapping[str, Any], shape: list[int]) -> tuple[int, list[int]] | None:
    """(parameters, output shape) of one layer given its input ``shape``; None: not known."""
    bias = 1 if conf.get("use_bias", True) else 0
    if kind in _SHAPE_KEEPING:
        return 0, shape
    if kind == "Dense":
        units = int(conf["units"])
        return (shape[-1] + bias) * units, [*shape[:-1], units]
    if kind in ("Conv1D", "Conv2D", "Conv3D"):
        dims = int(kind[4])
        kernel = _tuple(conf.get("kernel_size"), dims)
        filters = int(conf["filters"])
        out = _spatial(shape[:dims], kernel, _tuple(conf.get("strides", 1), dims),
                       conf.get("padding", "valid"))  # fmt: skip
        return (math.prod(kernel) * shape[-1] + bias) * filters, [*out, filters]
    if kind in ("BatchNormalization", "LayerNormalization"):
        return (4 if kind == "BatchNormalization" else 2) * shape[-1], shape
    if kind == "Embedding":
        return int(conf["input_dim"]) * int(conf["output_dim"]), [*shape, int(conf["output_dim"])]
    if kind == "Flatten":
        return 0, [math.prod(shape)]
    if kind == "Reshape":
        target = [int(d) for d in conf["target_shape"]]
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            target = [math.prod(shape) // known if d == -1 else d for d in target]
        return 0, target
    if kind.startswith("Global") and "Pooling" in kind:
        return 0, [shape[-1]]
    if kind[-9:-2] == "Pooling" and kind[-2:] in ("1D", "2D", "3D"):
        dims = int(kind[-2])
        pool = _tuple(conf.get("pool_size", 2), dims)
        strides = _tuple(conf.get("strides") or pool, dims)
        out = _spatial(shape[:dims], pool, strides, conf.get("padding", "valid"))
        return 0, [*out, shape[-1]]
    return None


def _tuple(value: Any, dims: int) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)] * dims


def _spatial(size: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
             padding: str) -> list[int]:  # fmt: skip
    if padding == "same":
        return [math.ceil(n / s) for n, s in zip(size, strides, strict=True)]
    return [max(0, (n - k) // s + 1) for n, k, s in zip(size, kernel, strides, strict=True)]


@dataclasses.dataclass(frozen=True)
class TrainerMemory:
    """One trainer's planned resident bytes, by what holds them (see the module's docstring).

    ``models`` and ``parked`` are a model hopper's (:mod:`dvml.placement.hop_memory`; 0 in a
    fit): the other configurations' weights and slots kept compiled in the trainer, and the
    parked states its worker's Dask process holds.
    """

    worker: str
    host: str
    batch: int  # rows of its batch
    runtime: int
    weights: int  # parameters, gradients and optimizer slots
    batches: int  # batches held and their activations
    evaluation: int
    models: int = 0
    parked: int = 0

    @property
    def total(self) -> int:
        """The bytes on its host: the trainer's and its worker's parked states."""
        return self.trainer_bytes + self.parked

    @property
    def trainer_bytes(self) -> int:
        """The trainer process's own bytes, what it samples (its worker's parked states
        left out)."""
        return self.runtime + self.weights + self.models + self.batches + self.evaluation


@dataclasses.dataclass(frozen=True)
class HostRoom:
    """What one host has for new processes: its available memory (``MemAvailable``) and, when
    its processes run in a cgroup with a limit, that limit less the cgroup's usage; ``cap`` is
    the config's ``dvml.memory.host-memory`` (None: none)."""

    host: str
    available: int
    cgroup_free: int | None = None
    cap: int | None = None

    @property
    def room(self) -> int:
        return min(v for v in (self.available, self.cgroup_free, self.cap) if v is not None)


def machine_rooms(
    readings: Mapping[str, tuple[str, int, int | None]], cap: int | None = None
) -> tuple[list[HostRoom], dict[str, str]]:
    """The rooms of the machines behind ``readings`` (host → (boot id, available, cgroup
    free)), and each host's machine name.

    Hosts that report one boot id run on one kernel, so they share its memory (simulated
    hosts of a LocalCluster, network namespaces, pods of one node): their trainers add up
    against one room, named by its hosts joined with " + ". That room takes the smallest
    cgroup room of its hosts (safe when their pods have limits of their own). An empty boot
    id (unreadable) keeps the host on its own.
    """
    by_machine: dict[str, list[str]] = {}
    for host, (boot, _, _) in readings.items():
        by_machine.setdefault(boot or f"host:{host}", []).append(host)
    rooms, name_of = [], {}
    for hosts in by_machine.values():
        name = " + ".join(hosts)
        cgroups = [cg for h in hosts if (cg := readings[h][2]) is not None]
        available = min(readings[h][1] for h in hosts)
        rooms.append(HostRoom(name, available, min(cgroups) if cgroups else None, cap))
        name_of.update(dict.fromkeys(hosts, name))
    return rooms, name_of


@dataclasses.dataclass(frozen=True)
class HostRow:
    """One host of a fit's plan: its trainers, their sum with the margin, and its room;
    ``zygote``: the bytes of the process its trainers are forked from, counted once (0 when
    they are processes of their own)."""

    host: str
    trainers: tuple[TrainerMemory, ...]
    room: HostRoom
    margin: float
    zygote: int = 0

    @property
    def needed(self) -> int:
        """The trainers' planned bytes and their zygote's, summed."""
        return self.zygote + sum(t.total for t in self.trainers)

    @property
    def process_bytes(self) -> int:
        """What its processes sample: the zygote's bytes and each trainer's own
        (:attr:`TrainerMemory.trainer_bytes`; a hopper's states parked in the Dask workers are
        left out), without the margin."""
        return self.zygote + sum(t.trainer_bytes for t in self.trainers)

    @property
    def usable(self) -> int:
        """What the room leaves for the trainers, once the margin and the zygote are taken."""
        return max(0, math.floor(self.room.room / (1 + self.margin)) - self.zygote)

    @property
    def with_margin(self) -> int:
        return math.ceil(self.needed * (1 + self.margin))

    @property
    def fits(self) -> bool:
        return self.with_margin <= self.room.room

    def line(self) -> str:
        zygote = f" and their zygote {format_size(self.zygote)}" if self.zygote else ""
        what = f"{len(self.trainers)} trainer(s){zygote} need"
        return room_line(self.host, what, self.needed, self.with_margin, self.margin, self.room)


def room_line(
    host: str, what: str, needed: int, with_margin: int, margin: float, room: HostRoom
) -> str:
    """A host's line of a plan: what its processes need, with the margin, against its room."""
    short = with_margin - room.room
    state = "fits" if short <= 0 else f"short by {format_size(short)}"
    return (
        f"host {host}: {what} {format_size(needed)} ({format_size(with_margin)} with the "
        f"{margin:.0%} margin), {format_size(room.room)} available: {state}"
    )


@dataclasses.dataclass(frozen=True)
class FitMemoryPlan:
    """A fit's trainers per host and whether they fit, with the fixes that would make them.

    Attributes
    ----------
    hosts : tuple of HostRow
        One per host that runs trainers.
    fixes : tuple of str
        What would make the fit fit, with numbers (empty when it fits).
    notes : tuple of str
        What the plan assumed (a layer it could not count, the shared memory it leaves out).
    """

    hosts: tuple[HostRow, ...]
    fixes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return all(h.fits for h in self.hosts)

    @property
    def short(self) -> tuple[HostRow, ...]:
        return tuple(h for h in self.hosts if not h.fits)

    @property
    def trainers(self) -> tuple[TrainerMemory, ...]:
        return tuple(t for h in self.hosts for t in h.trainers)

    def table(self) -> pd.DataFrame:
        """One row per trainer: its bytes by part, its host's room, and whether the host fits."""
        import pandas as pd

        columns = ["worker", "host", "batch", "runtime", "weights", "models", "batches",
                   "evaluation", "parked", "total", "host_zygote", "host_needed", "host_room",
                   "fits"]  # fmt: skip
        return pd.DataFrame(
            [
                {**{k: getattr(t, k) for k in columns[:9]}, "total": t.total,
                 "host_zygote": h.zygote, "host_needed": h.with_margin,
                 "host_room": h.room.room, "fits": h.fits}
                for h in self.hosts for t in h.trainers
            ],
            columns=columns,
        )  # fmt: skip

    def describe(self) -> str:
        """The plan in words: each trainer, each host, then the fixes and notes."""
        lines = []
        for h in self.hosts:
            lines.append(f"  {h.line()}")
            for t in h.trainers:
                lines.append(
                    f"    {t.worker}: {format_size(t.total)} = runtime "
                    f"{format_size(t.runtime)} + weights, gradients and optimizer slots "
                    f"{format_size(t.weights)} + {t.batch}-row batches in flight "
                    f"{format_size(t.batches)} + evaluation {format_size(t.evaluation)}"
                    + _hopper_parts(t)
                )
        if self.fixes:
            lines.append("What would make it fit:")
            lines.extend(f"  - {fix}" for fix in self.fixes)
        lines.extend(f"Note: {n}" for n in self.notes)
        return "\n".join(lines)


def _hopper_parts(t: TrainerMemory) -> str:
    parts = ""
    if t.models:
        parts += f" + the other configurations kept compiled {format_size(t.models)}"
    if t.parked:
        parts += f" + parked states in its Dask worker {format_size(t.parked)}"
    return parts


def plan_fit(
    trainers: Sequence[tuple[str, str, int]],
    x_shapes: Sequence[Sequence[int]],
    num_classes: int,
    model: Mapping[str, Any],
    optimizer: Any,
    rooms: Sequence[HostRoom],
    *,
    runtime: int = TRAINER_RUNTIME_BYTES,
    zygote: int = 0,
    margin: float = 0.2,
    weights_bytes: int | None = None,
) -> FitMemoryPlan:
    """The memory plan of a fit.

    Parameters
    ----------
    trainers : sequence of (worker, host, batch rows)
        One per trainer: its worker's name, its host and its share of the global batch.
    x_shapes : sequence of shapes
        One row's x shape per model input (the dataset's ``x_shapes``).
    num_classes : int
        Classes of y (one-hot float32 in the trainers).
    model : mapping
        The architecture's JSON, parsed.
    optimizer : str or mapping
        The optimizer of the compile parameters.
    rooms : sequence of HostRoom
        One per host that ``trainers`` names.
    runtime : int
        Bytes of TensorFlow's runtime per trainer: a process of its own's, or a forked
        trainer's private bytes (then pass ``zygote``).
    zygote : int
        Bytes of the zygote the trainers are forked from, counted once per host (0: none).
    margin : float
        Fraction added to each host's sum before it is compared with its room.
    weights_bytes : int, optional
        Bytes of the weights when known exactly (stored with the architecture); else counted
        from the JSON.
    """
    by_host = rooms_by_host(trainers, rooms)
    count = count_model(model, x_shapes[0]) if len(x_shapes) == 1 else None
    notes = ["the dataset adds nothing here: trainers read its buffers zero-copy from "
             "vineyardd's shared memory, already counted when it was packed"]  # fmt: skip
    if count is None or count.unknown:
        what = count.unknown if count else "a model of several inputs"
        notes.append(f"weights and activations beyond {what} are not counted (not read from "
                     "the JSON): the plan is a lower bound")  # fmt: skip
    params = (weights_bytes // _FLOAT) if weights_bytes else (count.params if count else 0)
    acts = count.activations_per_row if count else 0
    values = sum(math.prod(s) for s in x_shapes)
    row = _FLOAT * (values + num_classes)
    per_weight = _FLOAT * (2 + optimizer_slots(optimizer))  # weight, gradient, slots

    def trainer(worker: str, host: str, batch: int) -> TrainerMemory:
        return TrainerMemory(
            worker, host, batch, runtime, params * per_weight,
            batch * (BATCHES_HELD * row + 2 * _FLOAT * acts),
            evaluation_batch(batch, values) * (row + _FLOAT * num_classes),
        )  # fmt: skip

    hosts: dict[str, list[TrainerMemory]] = {}
    for worker, host, batch in trainers:
        hosts.setdefault(host, []).append(trainer(worker, host, int(batch)))
    plan = FitMemoryPlan(host_rows(hosts, by_host, margin, zygote), notes=tuple(notes))
    if plan.fits:
        return plan
    return dataclasses.replace(plan, fixes=tuple(plan_fixes(plan)))


def rooms_by_host(
    trainers: Sequence[tuple[str, str, int]], rooms: Sequence[HostRoom]
) -> dict[str, HostRoom]:
    """Host -> its room, checked to cover every host that ``trainers`` names."""
    from dvml.exceptions import ArgumentError

    by_host = {r.host: r for r in rooms}
    missing = sorted({h for _, h, _ in trainers} - set(by_host))
    if missing:
        raise ArgumentError(
            f"No room given for the hosts {missing} of the trainers. Received: rooms for "
            f"{sorted(by_host)}. Pass one HostRoom per host that runs a trainer."
        )
    return by_host


def host_rows(
    hosts: Mapping[str, Sequence[TrainerMemory]],
    rooms: Mapping[str, HostRoom],
    margin: float,
    zygote: int,
) -> tuple[HostRow, ...]:
    """One row per host of ``hosts`` (host → its trainers), with its room and zygote."""
    return tuple(HostRow(h, tuple(ts), rooms[h], margin, zygote) for h, ts in hosts.items())


def plan_fixes(plan: FitMemoryPlan, global_batch: bool = True) -> list[str]:
    """What would make a plan that does not fit fit: more room, fewer trainers per host, a
    smaller batch (numbers included). ``global_batch``: ``batch_size`` is split over the
    trainers (a fit), else it is each model's batch in its one trainer (a model hopper)."""
    fixes = []
    worst = max(plan.short, key=lambda h: h.with_margin - h.room.room)
    fixes.append(
        f"more memory on the hosts: at least {format_size(worst.with_margin)} available on "
        f"{worst.host} (now {format_size(worst.room.room)}); stop other processes there, or "
        "raise dvml.memory.host-memory if it caps the plan"
    )
    one = worst.trainers[0]
    usable = worst.usable
    fit_n = usable // one.total if one.total else 0
    if 0 < fit_n < len(worst.trainers):
        fixes.append(
            f"fewer trainers per host: {fit_n} of {len(worst.trainers)} fit on {worst.host} "
            f"({format_size(one.total)} each{' beside their zygote' if worst.zygote else ''}); "
            "pack the dataset onto workers of more hosts "
            "(distribution_rules)"
        )
    fixed = one.total - one.batches - one.evaluation
    per_row = (one.batches + one.evaluation) / max(1, one.batch)
    room_per_trainer = usable / len(worst.trainers)
    if per_row and room_per_trainer > fixed:
        rows = int((room_per_trainer - fixed) // per_row)
        n = len(plan.trainers)
        if 1 <= rows < one.batch and global_batch:
            fixes.append(
                f"a smaller batch_size: at most {rows * n} (global; {rows} rows per trainer, "
                f"{format_size(int(per_row))} each in flight) fits"
            )
        elif 1 <= rows < one.batch:
            fixes.append(
                f"a smaller batch_size: at most {rows} in every configuration (each model's "
                f"batch in its trainer, {format_size(int(per_row))} a row in flight) fits"
            )
    if room_per_trainer <= fixed:
        zygote = f" beside their zygote's {format_size(worst.zygote)}" if worst.zygote else ""
        fixes.append(
            f"(a smaller batch_size does not help: TensorFlow and the model alone take "
            f"{format_size(fixed)} per trainer{zygote}, {format_size(int(room_per_trainer))} "
            "is left for each)"
        )
    return fixes
