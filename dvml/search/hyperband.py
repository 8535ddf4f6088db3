"""MADlib's Hyperband, exactly: the schedule table, the diagonal run, and hyperopt's batches.

MADlib (``src/ports/postgres/modules/deep_learning/madlib_keras_automl_hyperband.py_in``,
classes ``HyperbandSchedule`` and ``AutoMLHyperband``) computes a bracket's first number of
configurations with integer division, ``n = ceil(int((s_max + 1) / (s + 1)) * eta**s)``, where
the paper (Li et al., JMLR 2018) has ``ceil((s_max + 1) / (s + 1) * eta**s)``: with R=81, eta=3
MADlib's brackets hold 81/27/9/6/5 configurations, the paper's 81/34/15/8/5. Everything here
follows MADlib's arithmetic, float for float (``s_max = floor(log(R, eta))`` in floating point,
``n_i = int(n * eta**-i)``, ``r_i = round(r * eta**i)`` with Python 2's half-away-from-zero
rounding, MADlib's runtime being Python 2), so that a user moving from MADlib gets the same
rows.

MADlib runs the brackets *diagonally*: diagonal ``i`` trains, in one ``fit_multiple`` call,
round ``i - (s_max - s)`` of every bracket ``s`` that has started, all for the same number of
iterations ``r = round(R * eta**(i - s_max))``; bracket ``s_max - i`` starts there with its
``n`` configurations (all sampled up front, ``mst_key`` 1, 2, ... from the largest bracket down),
the other brackets keep their best ``round(n * eta**-round)`` configurations and warm-start them
for ``r`` more iterations. Ranking is by the validation loss when there is a validation set,
else by the training loss, never by the metric; a NaN or missing loss ranks last. One
difference from MADlib, on purpose: MADlib picks a bracket's survivors among every
configuration of the bracket (``ORDER BY loss LIMIT n`` over the bracket's whole key range, so a
configuration dropped in an earlier round could come back with stale weights); here they are
picked among the configurations that trained in the bracket's previous round, as successive
halving means.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, NamedTuple

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.search import journal as j

__all__ = [
    "Diagonal",
    "Done",
    "HyperbandRun",
    "Losses",
    "NextDiagonal",
    "Reported",
    "ScheduleRow",
    "bracket_sizes",
    "hyperband_schedule",
    "hyperopt_batches",
    "madlib_round",
    "rank_key",
    "s_max",
]


class ScheduleRow(NamedTuple):
    """One row of MADlib's ``hyperband_schedule`` table (``pandas.DataFrame(rows)``: the table)."""

    s: int
    """The bracket."""
    i: int
    """The round within the bracket."""
    n_i: int
    """Configurations trained in this round."""
    r_i: int
    """Iterations each of them trains in this round."""


def madlib_round(x: float) -> int:
    """``round(x)`` as Python 2 (MADlib's runtime) does it: halves away from zero.

    Python 3 rounds halves to even (``round(2.5) == 2``); MADlib's ``int(round(2.5))`` is 3.
    """
    floor = math.floor(abs(x))
    value = floor + 1 if abs(x) - floor >= 0.5 else floor
    return int(math.copysign(value, x)) if value else 0


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(
            f"{name} must be an integer. Received: {type(value).__name__} {value!r:.40}. "
            f"Pass e.g. {name}={max(minimum, 3)}."
        )
    if value < minimum:
        raise ArgumentError(
            f"{name} must be at least {minimum}. Received: {name}={value}. Pass a larger value."
        )
    return int(value)


def s_max(R: int, eta: int = 3) -> int:
    """MADlib's ``s_max = floor(log(R, eta))``, in floating point as MADlib computes it.

    Floating point makes ``log(243, 3)`` 4.999..., so R=243, eta=3 gives 4 here (and in MADlib),
    where exact arithmetic gives 5.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        When ``eta`` is not above 1 or ``R`` is below ``eta`` (MADlib's checks).
    """
    R = _check_int(R, "R", 1)
    eta = _check_int(eta, "eta", 2)
    if eta > R:
        raise ArgumentError(
            f"R should not be less than eta (MADlib's rule: the largest bracket needs at least "
            f"one round of successive halving). Received: R={R}, eta={eta}. Raise R to at "
            f"least {eta}."
        )
    return math.floor(math.log(R, eta))


def _first_n(top: int, s: int, eta: int) -> int:
    # MADlib: int(math.ceil(int((s_max+1)/(s+1))*math.pow(eta, s))), "/" on ints being
    # Python 2's integer division
    return math.ceil(((top + 1) // (s + 1)) * math.pow(eta, s))


def bracket_sizes(R: int, eta: int = 3) -> dict[int, tuple[int, int]]:
    """Bracket ``s`` → ``(n, r)``: its first round's configurations and iterations (MADlib)."""
    top = s_max(R, eta)
    sizes = {}
    for s in range(top, -1, -1):
        n = _first_n(top, s, eta)
        sizes[s] = (n, madlib_round(R * math.pow(eta, -s)))
    return sizes


def _check_skip_last(skip_last: Any, top: int) -> int:
    skip_last = _check_int(skip_last, "skip_last", 0)
    if skip_last >= top + 1:
        raise ArgumentError(
            f"skip_last must be non-negative and less than {top + 1} (s_max + 1: skipping every "
            f"round would train nothing). Received: skip_last={skip_last}. Pass at most {top}."
        )
    return skip_last


def hyperband_schedule(R: int, eta: int = 3, skip_last: int = 0) -> list[ScheduleRow]:
    """MADlib's ``hyperband_schedule`` table: ``(s, i, n_i, r_i)`` per bracket and round.

    Parameters
    ----------
    R : int
        The most iterations one configuration gets in a round (MADlib's ``R``); at least ``eta``.
    eta : int
        The halving rate: each round keeps ``1/eta`` of the configurations; above 1.
    skip_last : int
        Rounds dropped at the end of every bracket (``0 <= skip_last <= s_max``).

    Returns
    -------
    list of ScheduleRow
        Brackets from ``s_max`` down, rounds from 0 up; ``n_i = int(n * eta**-i)``,
        ``r_i = round(r * eta**i)`` as MADlib computes them (R=81, eta=3: ``n`` is 81, 27, 9, 6,
        5 for s = 4..0).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        MADlib's checks: ``eta > 1``, ``R >= eta``, ``0 <= skip_last < s_max + 1``.

    Examples
    --------
    >>> [(r.s, r.i, r.n_i, r.r_i) for r in hyperband_schedule(9, 3)][:3]
    [(2, 0, 9, 1), (2, 1, 3, 3), (2, 2, 1, 9)]
    """
    top = s_max(R, eta)
    skip_last = _check_skip_last(skip_last, top)
    rows = []
    for s in range(top, -1, -1):
        n = _first_n(top, s, eta)
        r = R * math.pow(eta, -s)
        for i in range((s + 1) - skip_last):
            n_i = n * math.pow(eta, -i)
            r_i = r * math.pow(eta, i)
            rows.append(ScheduleRow(s, i, int(n_i), madlib_round(r_i)))
    return rows


def rank_key(loss: float | None) -> tuple[int, float]:
    """Sort key of a loss: smaller is better; NaN, infinite or missing losses rank last."""
    if loss is None or not math.isfinite(loss):
        return (1, 0.0)
    return (0, float(loss))


@j.record_type("next_diagonal")
@dataclasses.dataclass(frozen=True)
class NextDiagonal:
    """Event: the previous diagonal is done; which configurations train next?"""


@j.record_type("losses")
@dataclasses.dataclass(frozen=True)
class Losses:
    """Event: ``[mst_key, loss]`` of the configurations of the pending diagonal."""

    losses: list[list[Any]]


@j.record_type("reported")
@dataclasses.dataclass(frozen=True)
class Reported:
    """Decision: the losses are taken; ``best`` is the best ``mst_key`` so far."""

    best: int | None


@j.record_type("done")
@dataclasses.dataclass(frozen=True)
class Done:
    """Decision: every diagonal has run."""

    best: int | None


@j.record_type("diagonal")
@dataclasses.dataclass(frozen=True)
class Diagonal:
    """One diagonal of MADlib's Hyperband: one ``fit_multiple`` call."""

    i: int
    """The diagonal (0, 1, ...)."""
    num_iterations: int
    """Iterations every configuration of the diagonal trains (more, when warm-started)."""
    keys: tuple[int, ...]
    """The ``mst_key`` of every configuration trained, in ascending order."""
    new_keys: tuple[int, ...]
    """Of those, the ones that start from scratch (the bracket that starts here)."""
    rounds: tuple[tuple[int, int], ...]
    """``(s, round)``: each running bracket and its round in this diagonal."""
    offset: int
    """Iterations of the diagonals before this one: MADlib's global ``metrics_iters`` offset."""

    @property
    def warm_start(self) -> bool:
        """MADlib passes ``warm_start`` to the whole call from the second diagonal on."""
        return self.i != 0

    @property
    def warm_keys(self) -> tuple[int, ...]:
        return tuple(k for k in self.keys if k not in set(self.new_keys))


class HyperbandRun:
    """MADlib's diagonal Hyperband as a state machine.

    Call :meth:`next_diagonal` for the configurations to train, train them (one
    ``fit_multiple`` call), give every loss to :meth:`report`, and repeat until
    :meth:`next_diagonal` returns None.

    Parameters
    ----------
    R, eta, skip_last : int
        As :func:`hyperband_schedule`.

    Attributes
    ----------
    num_configs : int
        How many configurations to sample up front (MADlib's sum of the brackets that run);
        they get ``mst_key`` 1..num_configs, the largest bracket first.
    bracket_of : dict
        ``mst_key`` → its bracket ``s`` (MADlib's ``.info`` column ``s``).
    last_round : dict
        ``mst_key`` → the last round it trained in (MADlib's ``.info`` column ``i``).
    """

    def __init__(self, R: int, eta: int = 3, skip_last: int = 0) -> None:
        self.R, self.eta = R, eta
        self.journal = j.Journal(
            header={
                "method": "hyperband",
                "automl_params": f"R={R}, eta={eta}, skip_last={skip_last}",
                "R": R,
                "eta": eta,
                "skip_last": skip_last,
            }
        )
        self.s_max = s_max(R, eta)
        self.skip_last = _check_skip_last(skip_last, self.s_max)
        self.sizes = bracket_sizes(R, eta)
        # MADlib: mst_key ranges from the largest bracket down; the skipped (smallest) brackets
        # start after the last diagonal, so they are not sampled.
        self.ranges: dict[int, range] = {}
        start = 1
        for s in range(self.s_max, -1, -1):
            self.ranges[s] = range(start, start + self.sizes[s][0])
            start += self.sizes[s][0]
        self.num_configs = sum(self.sizes[s][0] for s in range(self.skip_last, self.s_max + 1))
        self.num_diagonals = self.s_max + 1 - self.skip_last
        self.bracket_of = {k: s for s, keys in self.ranges.items() for k in keys if s >= skip_last}
        self.last_round: dict[int, int] = dict.fromkeys(self.bracket_of, -1)
        self.losses: dict[int, float | None] = {}
        self._active: dict[int, tuple[int, ...]] = {}  # bracket → keys of its latest round
        self._i = 0
        self._pending: Diagonal | None = None

    @classmethod
    def from_journal(cls, journal: j.Journal | str) -> HyperbandRun:
        """The search a journal (or its text) wrote, rebuilt by replaying it: resume here."""
        journal = j.Journal.loads(journal) if isinstance(journal, str) else journal
        header = journal.header
        if header.get("method") != "hyperband":
            raise ArgumentError(
                f"The journal is a {header.get('method')!r} search's, not Hyperband's. "
                f"Received: method={header.get('method')!r}. Resume it with its own scheduler."
            )
        fresh = cls(header["R"], header["eta"], header["skip_last"])
        return j.replay(journal, fresh)  # type: ignore[return-value]

    def apply(self, event: Any) -> Any:
        """Take a NextDiagonal or Losses event; return the Diagonal, Done or Reported decision."""
        if isinstance(event, NextDiagonal):
            diagonal = self._next()
            decision: Any = Done(self.best()) if diagonal is None else diagonal
        elif isinstance(event, Losses):
            self._report({int(k): loss for k, loss in event.losses})
            decision = Reported(self.best())
        else:
            raise ArgumentError(
                f"HyperbandRun takes NextDiagonal or Losses events. Received: "
                f"{type(event).__name__} {event!r:.80}."
            )
        self.journal.append(event, decision)
        return decision

    def next_diagonal(self) -> Diagonal | None:
        """The next diagonal to train, or None when the search is done (journaled)."""
        decision = self.apply(NextDiagonal())
        return decision if isinstance(decision, Diagonal) else None

    def report(self, losses: Mapping[int, float | None]) -> None:
        """The losses (validation, else training) of the pending diagonal's configurations.

        Raises
        ------
        ArgumentError
            When a key is not in the pending diagonal.
        """
        self.apply(Losses([[int(k), j.finite(v)] for k, v in sorted(losses.items())]))

    def _next(self) -> Diagonal | None:
        """Raises
        ------
        ArgumentError
            When the previous diagonal's losses were not all reported.
        """
        if self._pending is not None:
            missing = sorted(set(self._pending.keys) - set(self._reported))
            raise ArgumentError(
                f"Diagonal {self._pending.i} is not finished: no loss reported for mst_key "
                f"{missing[:10]}. Received: a request for the next diagonal. Report every "
                "configuration's loss first (a failed one with loss=None)."
            )
        i = self._i
        if i >= self.num_diagonals:
            return None
        rounds = []
        keys: list[int] = []
        new: tuple[int, ...] = ()
        for s in range(self.s_max, self.s_max - i - 1, -1):
            round_ = s - self.s_max + i
            rounds.append((s, round_))
            if round_ == 0:
                chosen = tuple(self.ranges[s])
                new = chosen
            else:
                n = self.sizes[s][0]
                keep = madlib_round(n * math.pow(self.eta, -round_))
                ranked = sorted(self._active[s], key=lambda k: (rank_key(self.losses.get(k)), k))
                chosen = tuple(sorted(ranked[:keep]))
            self._active[s] = chosen
            keys.extend(chosen)
        offset = sum(self.sizes[self.s_max - k][1] for k in range(i))
        diagonal = Diagonal(
            i=i,
            num_iterations=self.sizes[self.s_max - i][1],
            keys=tuple(sorted(keys)),
            new_keys=new,
            rounds=tuple(rounds),
            offset=offset,
        )
        for k in diagonal.keys:
            self.last_round[k] += 1
        self._pending = diagonal
        self._reported: set[int] = set()
        return diagonal

    def _report(self, losses: Mapping[int, float | None]) -> None:
        if self._pending is None:
            raise ArgumentError(
                "No diagonal is pending. Received: a report of losses. Call next_diagonal() first."
            )
        unknown = sorted(set(losses) - set(self._pending.keys))
        if unknown:
            raise ArgumentError(
                f"mst_key {unknown[:10]} did not train in diagonal {self._pending.i}. Received: "
                f"losses for {sorted(losses)[:10]}. Report only the diagonal's keys "
                f"{list(self._pending.keys)[:10]}."
            )
        for key, loss in losses.items():
            self.losses[key] = None if loss is None else float(loss)
            self._reported.add(key)
        if self._reported >= set(self._pending.keys):
            self._pending = None
            self._i += 1

    def brackets(self) -> dict[str, Any]:
        """Where the search stands, for dvml's dashboard page: the diagonals done (``done``
        of ``diagonals``), the ``best`` ``mst_key`` and its ``loss``, and per bracket ``s``
        that has started (largest first): its ``round`` (0-based), its surviving
        configurations (``keys``), the ``iterations`` each has trained so far, and the best
        ``loss`` among them (None before a report)."""
        rows = []
        for s in sorted(self._active, reverse=True):
            keys = self._active[s]
            round_ = max(self.last_round[k] for k in keys) if keys else 0
            losses = [v for k in keys if (v := self.losses.get(k)) is not None]
            # round t of bracket s runs in diagonal t + s_max - s, which trains its keys for
            # that diagonal's iterations (warm started from the round before)
            trained = sum(self.sizes[s - t][1] for t in range(round_ + 1))
            rounds = min(s + 1, self.num_diagonals - (self.s_max - s))
            rows.append({"s": s, "round": round_, "rounds": rounds, "keys": list(keys),
                         "iterations": trained,
                         "loss": min(losses) if losses else None})  # fmt: skip
        best = self.best()
        return {
            "done": self._i,
            "diagonals": self.num_diagonals,
            "best": best,
            "loss": None if best is None else self.losses.get(best),
            "brackets": rows,
        }

    def best(self) -> int | None:
        """The ``mst_key`` of the lowest loss reported so far (MADlib's ``.best`` row)."""
        if not self.losses:
            return None
        return min(self.losses, key=lambda k: (rank_key(self.losses[k]), k))


def hyperopt_batches(num_configs: int, num_workers: int) -> list[range]:
    """MADlib's hyperopt batches: ``mst_key`` ranges proposed and trained together.

    MADlib (``madlib_keras_automl_hyperopt.py_in``, ``get_configs_list``) makes
    ``round(num_configs / num_workers)`` batches of ``num_workers`` configurations, the last
    one taking what is left (so it may be larger or smaller than the others).

    Examples
    --------
    >>> [list(b) for b in hyperopt_batches(5, 2)]
    [[1, 2], [3, 4], [5]]
    """
    num_configs = _check_int(num_configs, "num_configs", 1)
    num_workers = _check_int(num_workers, "num_workers", 1)
    buckets = madlib_round(num_configs / num_workers)
    batches = []
    start = 1
    for _ in range(buckets - 1):
        batches.append(range(start, start + num_workers))
        start += num_workers
    batches.append(range(start, num_configs + 1))
    return batches
