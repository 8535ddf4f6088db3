"""The trainer protocol: typed messages, one encoder, one parser, one ``emit``.

A trainer process and the worker that supervises it talk in lines: the worker writes
*commands* to the trainer's stdin and the trainer prints *messages* on stdout, each one line
``DVML {"kind": ..., ...}``. Everything else a trainer prints (TensorFlow's chatter) is not
protocol and is kept only as the tail quoted in errors. As distributed's worker state machine
does with its instruction and event classes, every line is a frozen dataclass here, encoded by
:func:`encode` and read back by :func:`parse`; no module builds or reads these dicts by hand.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, ClassVar

from dvml.exceptions import ProtocolError

__all__ = [
    "PREFIX",
    "Evaluate",
    "Evaluated",
    "Failed",
    "Finished",
    "Handover",
    "Iteration",
    "Line",
    "Predict",
    "Predicted",
    "Ready",
    "Report",
    "Resolved",
    "Returned",
    "SavedModel",
    "Score",
    "Scored",
    "Startup",
    "Train",
    "Trained",
    "emit",
    "encode",
    "parse",
]

PREFIX = "DVML "


@dataclasses.dataclass(frozen=True)
class Line:
    """A protocol line; each subclass names its ``kind``."""

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The fields, without those left at None (they are optional on the wire)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


# ---- trainer -> worker -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ready(Line):
    """A serving trainer imported TensorFlow and opened its local partitions."""

    kind: ClassVar[str] = "ready"
    rows: int
    validation_rows: int = 0


@dataclasses.dataclass(frozen=True)
class Resolved(Line):
    """What a trainer read: its vineyard instance and the buffers it resolved locally."""

    kind: ClassVar[str] = "resolved"
    rows: int
    buffers: list[int]
    instance_id: Any
    validation_rows: int = 0


@dataclasses.dataclass(frozen=True)
class Startup(Line):
    """Where a trainer's seconds before its first step went."""

    kind: ClassVar[str] = "startup"
    seconds: dict[str, float]
    total: float
    standby: bool
    standby_imports: dict[str, float] | None = None


@dataclasses.dataclass(frozen=True)
class Iteration(Line):
    """One iteration of a synchronous fit on one trainer (metrics over its local rows)."""

    kind: ClassVar[str] = "iteration"
    iteration: int
    fit_seconds: float
    elapsed: float
    fit_loss: float
    sync: str | int
    averages: int | None = None
    averaging_seconds: float | None = None
    training: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    metrics_seconds: float | None = None
    # steps trained in the iteration (every epoch): the straggler rule's unit (train.stragglers)
    steps: int | None = None
    # the local rows it trained on, each once per epoch (an elastic fit sums them: every row
    # of the dataset, before and after a departure; dvml.train.elastic)
    rows: int | None = None
    # the trainer's resident bytes at the iteration's end, and its zygote's (forked trainers;
    # train.runtime.memory_sample)
    resident_bytes: int | None = None
    zygote_bytes: int | None = None
    # its local batch (sync="step": unequal once an elastic fit moved rows for speed; its
    # averaging_seconds are then its steps' wait in the all-reduce, train.runtime.collective_wait)
    batch: int | None = None
    # sync="step": the fit's steps in lock-step, after its first call of the train function
    # (tracing, the collectives' set-up) and up to its last: their seconds, their wait in the
    # all-reduce and their count, which the straggler rule reads (train.stragglers)
    steady: dict[str, float] | None = None


@dataclasses.dataclass(frozen=True)
class Finished(Line):
    """A synchronous fit's trainer is done: its final weights are in ``weights_path``."""

    kind: ClassVar[str] = "done"
    weights_path: str
    weights_sha256: str
    local_rows: int


@dataclasses.dataclass(frozen=True)
class Trained(Line):
    """A serving trainer trained one model for one step of a schedule (a hop, a rung)."""

    kind: ClassVar[str] = "trained"
    mst_key: int
    iteration: int
    fit_loss: float
    train_s: float
    load_s: float
    save_s: float
    steps: int
    rows: int
    loaded_sha256: str  # of the weights it started from: what a resumed model continued from
    # the trainer's resident bytes at the hop's end, and its zygote's (memory_sample)
    resident_bytes: int | None = None
    zygote_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Evaluated(Line):
    """Loss and metrics of one model's state over a trainer's local rows."""

    kind: ClassVar[str] = "evaluated"
    mst_key: int
    training: dict[str, Any]
    validation: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Scored(Line):
    """Loss and metrics of a registered model over the trainer's LOCAL rows of a dataset
    (``rows`` 0 and no values when this worker holds none)."""

    kind: ClassVar[str] = "scored"
    rows: int
    values: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Predicted(Line):
    """A model's raw outputs for the rows of a :class:`Predict` command are in ``output``."""

    kind: ClassVar[str] = "predicted"
    rows: int
    output: str


@dataclasses.dataclass(frozen=True)
class Report(Line):
    """A user's training loop reported metrics (``context.report``), maybe with a checkpoint."""

    kind: ClassVar[str] = "report"
    step: int
    metrics: dict[str, Any]
    elapsed: float
    checkpointed: bool = False
    # the trainer's resident bytes and its zygote's (memory_sample), at most once a second
    resident_bytes: int | None = None
    zygote_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class SavedModel(Line):
    """A user's training loop saved a Keras model (``context.save_model``) into files."""

    kind: ClassVar[str] = "saved_model"
    name: str
    json_path: str
    weights_path: str
    compile_params: str
    description: str | None = None


@dataclasses.dataclass(frozen=True)
class Returned(Line):
    """A user's training loop returned; on the chief ``result_path`` holds its value."""

    kind: ClassVar[str] = "returned"
    local_rows: int
    result_path: str | None = None


@dataclasses.dataclass(frozen=True)
class Failed(Line):
    """A trainer's error: a command failed (it keeps serving) or, ``fatal``, the trainer."""

    kind: ClassVar[str] = "error"
    type: str
    message: str
    fatal: bool = False


# ---- worker -> trainer -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Handover(Line):
    """A job for a standby trainer: its job file, working directory and per-job environment."""

    kind: ClassVar[str] = "handover"
    job_path: str
    cwd: str
    env: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Train(Line):
    """Train model ``mst_key`` from the state in ``state_in``; write the new state to
    ``state_out``. ``config`` (model JSON, parsed compile and fit params) comes with a model
    the trainer has not seen yet: models can join a running job."""

    kind: ClassVar[str] = "train"
    mst_key: int
    iteration: int
    state_in: str
    state_out: str
    config: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Evaluate(Line):
    """Evaluate model ``mst_key``'s state in ``state_in`` on the local rows."""

    kind: ClassVar[str] = "evaluate"
    mst_key: int
    state_in: str
    config: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Score(Line):
    """Evaluate the registered model ``model`` (a model spec, :mod:`dvml.train.runtime.served`)
    on this worker's LOCAL rows of ``dataset``. ``spec`` is the spec's file, read only when the
    trainer does not hold that model yet."""

    kind: ClassVar[str] = "score"
    model: str
    spec: str
    dataset: str
    batch_size: int


@dataclasses.dataclass(frozen=True)
class Predict(Line):
    """Predict rows with the registered model ``model``: ``inputs`` are ``.npy`` files, one per
    model input, written by the worker; the outputs go to the ``.npy`` file ``output``."""

    kind: ClassVar[str] = "predict"
    model: str
    spec: str
    inputs: list[str]
    output: str
    batch_size: int


_KINDS: dict[str, type[Line]] = {
    cls.kind: cls
    for cls in (
        Ready,
        Resolved,
        Startup,
        Iteration,
        Finished,
        Trained,
        Evaluated,
        Scored,
        Predicted,
        Report,
        SavedModel,
        Returned,
        Failed,
        Handover,
        Train,
        Evaluate,
        Score,
        Predict,
    )
}


def encode(line: Line) -> str:
    """One protocol line (without the newline) for ``line``."""
    return PREFIX + json.dumps({"kind": line.kind, **line.to_dict()})


def parse(text: str) -> Line | None:
    """The message or command on one line of output, or None when it is not protocol.

    Raises
    ------
    ProtocolError
        The line starts with :data:`PREFIX` but its kind or fields are not known.
    """
    if not text.startswith(PREFIX):
        return None
    try:
        payload = json.loads(text[len(PREFIX) :])
        cls = _KINDS[payload.pop("kind")]
        return cls(**payload)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(
            f"Not a dvml protocol line: {text[:200]!r} ({type(exc).__name__}: {exc}). Trainer "
            "and worker run different dvml versions? Install the same dvml on every host."
        ) from None


def emit(line: Line) -> None:
    """Print one protocol line on stdout (the trainer side) and flush it."""
    sys.stdout.write(encode(line) + "\n")
    sys.stdout.flush()
