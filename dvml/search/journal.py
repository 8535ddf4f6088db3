"""The journal of a search: every event and decision, as plain dataclasses and JSON.

A scheduler (:class:`~dvml.search.asha.Asha`, :class:`~dvml.search.hyperband.HyperbandRun`)
takes one event at a time (its ``apply``) and returns one decision; the journal keeps both, in
order, after a header that says how to build the scheduler again (method, parameters, seed, the
grids). That is everything a search decided:
its trials and their configurations (the sampler's points), the rungs and losses, the
checkpoint each result left, the random state (the seed; draws are replayed, not stored).

Resume is :func:`replay`: a fresh scheduler built from the header takes the journal's events in
order and must return the journal's decisions, one for one (a difference means the journal is
not this search's, and is refused). Then a :class:`Resume` event puts the models that were in
flight when the search died back in the queue: they restart from their last checkpoint, so
each loses at most the rung it was training.

Losses that are not finite numbers (NaN, inf) are written as ``null``: the JSON stays standard
and the scheduler treats both alike (a failed configuration, ranked last). Pure: the journal is
a string; the driver decides where it is stored.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from dvml.exceptions import ArgumentError

__all__ = [
    "FORMAT",
    "Ask",
    "Departed",
    "Fail",
    "Failure",
    "Finish",
    "Journal",
    "Park",
    "Promote",
    "Queued",
    "Result",
    "Resume",
    "Start",
    "Stop",
    "Wait",
    "decode",
    "encode",
    "record_type",
    "replay",
]

FORMAT = "dvml-search-journal"
VERSION = 1

TYPES: dict[str, type] = {}
T = TypeVar("T")


def record_type(name: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: a dataclass that journals as ``{"type": name, ...its fields}``."""

    def register(cls: type[T]) -> type[T]:
        if name in TYPES and TYPES[name] is not cls:
            raise ArgumentError(f"Journal record type {name!r} is defined twice.")
        TYPES[name] = cls
        cls.TYPE = name  # type: ignore[attr-defined]
        return cls

    return register


def finite(loss: float | None) -> float | None:
    """A loss as journaled: a finite float, or None (NaN, inf, missing)."""
    if loss is None:
        return None
    value = float(loss)
    return value if math.isfinite(value) else None


def encode(item: Any) -> dict[str, Any]:
    """A journal record: the dataclass's fields and its ``type``."""
    return {"type": type(item).TYPE, **dataclasses.asdict(item)}


def decode(data: dict[str, Any]) -> Any:
    """The dataclass of a journal record.

    Raises
    ------
    ArgumentError
        When the record has no known ``type`` or its fields do not match.
    """
    kind = data.get("type")
    cls = TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ArgumentError(
            f"A journal record has an unknown type. Received: {data!r:.120}. Known types: "
            f"{sorted(TYPES)}. Is the journal from a newer dvml?"
        )
    fields = {k: v for k, v in data.items() if k != "type"}
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ArgumentError(
            f"A journal record of type {kind!r} does not match its fields ({exc}). Received: "
            f"{data!r:.200}."
        ) from None


# --------------------------------------------------------------------------- events


@record_type("ask")
@dataclasses.dataclass(frozen=True)
class Ask:
    """A worker is idle and asks for work, ``now`` seconds into the search."""

    worker: str
    now: float = 0.0


@record_type("result")
@dataclasses.dataclass(frozen=True)
class Result:
    """A model finished its job: it has trained ``iterations`` in all, with ``loss``.

    ``loss`` is the validation loss when there is a validation set, else the training loss;
    None (or NaN) means it diverged. ``elapsed_s`` is the job's time on ``worker`` (it measures
    the worker's speed); ``checkpoint`` names where its weights and optimizer state are kept.
    """

    trial_id: int
    iterations: int
    loss: float | None
    worker: str = ""
    now: float = 0.0
    elapsed_s: float = 0.0
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss", finite(self.loss))


@record_type("failure")
@dataclasses.dataclass(frozen=True)
class Failure:
    """A model's trainer failed (out of memory, an error): the configuration is failed."""

    trial_id: int
    reason: str
    worker: str = ""
    now: float = 0.0


@record_type("resume")
@dataclasses.dataclass(frozen=True)
class Resume:
    """The search restarts after a crash: jobs in flight are queued again."""

    now: float = 0.0


@record_type("departed")
@dataclasses.dataclass(frozen=True)
class Departed:
    """``workers`` left the cluster: every job in flight was interrupted. ``requeue``: running
    trials given out again from their last checkpoint (or from scratch, when none trained yet);
    ``lost``: trials whose state went with the workers and no checkpoint is left (failed)."""

    workers: list[str]
    requeue: list[int]
    lost: list[int]
    now: float = 0.0


# --------------------------------------------------------------------------- decisions


@record_type("start")
@dataclasses.dataclass(frozen=True)
class Start:
    """Train configuration ``trial_id`` from scratch on ``worker`` for ``iterations``."""

    trial_id: int
    worker: str
    iterations: int
    model_id: int
    compile_params: str
    fit_params: str
    values: dict[str, Any]
    number: int
    """The sampler's number of the point (its ask/tell id)."""
    retry: bool = False


@record_type("promote")
@dataclasses.dataclass(frozen=True)
class Promote:
    """Resume parked ``trial_id`` from ``checkpoint`` on ``worker``: ``iterations`` more, to
    reach rung ``rung``."""

    trial_id: int
    worker: str
    rung: int
    iterations: int
    checkpoint: str | None
    retry: bool = False


@record_type("park")
@dataclasses.dataclass(frozen=True)
class Park:
    """``trial_id`` reached rung ``rung``: keep its weights; it may be promoted later."""

    trial_id: int
    rung: int
    loss: float | None


@record_type("finish")
@dataclasses.dataclass(frozen=True)
class Finish:
    """``trial_id`` reached the top rung (``max_t`` iterations)."""

    trial_id: int
    loss: float | None


@record_type("fail")
@dataclasses.dataclass(frozen=True)
class Fail:
    """``trial_id`` failed: ranked last, never promoted; the search goes on."""

    trial_id: int
    reason: str


@record_type("wait")
@dataclasses.dataclass(frozen=True)
class Wait:
    """Nothing for ``worker`` now: ask again after the next result."""

    worker: str


@record_type("stop")
@dataclasses.dataclass(frozen=True)
class Stop:
    """The search is over: start and promote nothing more."""

    reason: str


@record_type("queued")
@dataclasses.dataclass(frozen=True)
class Queued:
    """After a :class:`Resume` or :class:`Departed`: these jobs were in flight and will be
    given out again."""

    trial_ids: list[int]


# --------------------------------------------------------------------------- the journal


class Scheduler(Protocol):
    def apply(self, event: Any) -> Any: ...


@dataclasses.dataclass
class Journal:
    """A header (how to build the scheduler again) and the events and decisions, in order."""

    header: dict[str, Any]
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def append(self, event: Any, decision: Any) -> None:
        self.records.append({"event": encode(event), "decision": encode(decision)})

    def pairs(self) -> Iterable[tuple[Any, Any]]:
        for record in self.records:
            yield decode(record["event"]), decode(record["decision"])

    def dumps(self) -> str:
        """The journal as standard JSON (no NaN)."""
        return json.dumps(
            {"format": FORMAT, "version": VERSION, "header": self.header, "records": self.records},
            allow_nan=False,
            sort_keys=True,
        )

    @classmethod
    def loads(cls, text: str) -> Journal:
        """A journal from :meth:`dumps`'s text.

        Raises
        ------
        ArgumentError
            When the text is not a dvml search journal.
        """
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ArgumentError(
                f"The search journal is not JSON ({exc}). Received: {str(text)[:80]!r}. Give the "
                "text Journal.dumps() wrote."
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ArgumentError(
                f"The text is not a dvml search journal (no format {FORMAT!r}). Received: "
                f"{str(text)[:80]!r}."
            )
        if data.get("version") != VERSION:
            raise ArgumentError(
                f"The search journal has version {data.get('version')!r}; this dvml reads "
                f"version {VERSION}. Resume it with the dvml that wrote it."
            )
        return cls(header=dict(data["header"]), records=list(data["records"]))


def _plain(record: dict[str, Any]) -> Any:
    """The record as its JSON reads back (tuples become lists), for comparing."""
    return json.loads(json.dumps(record, sort_keys=True))


def replay(journal: Journal, scheduler: Scheduler) -> Scheduler:
    """Feed a journal's events into a fresh ``scheduler``; it must decide as the journal says.

    The scheduler must be built from ``journal.header`` (same parameters, seed and grids) and
    have taken no event yet. Its own journal ends up equal to ``journal``.

    Raises
    ------
    ArgumentError
        At the first decision that differs from the journal's (naming the record).
    """
    for n, (event, recorded) in enumerate(journal.pairs()):
        decided = scheduler.apply(event)
        if _plain(encode(decided)) != _plain(encode(recorded)):
            raise ArgumentError(
                f"The search journal does not replay: record {n} ({encode(event)!r:.120}) "
                f"decides {encode(decided)!r:.200} here, the journal says "
                f"{encode(recorded)!r:.200}. Resume with the same method, parameters, seed and "
                "grids (the journal's header), and the dvml version that wrote it."
            )
    return scheduler
