"""Samplers that propose configurations: seeded random, and Optuna's TPE (ask and tell).

A sampler proposes a point of a :class:`~dvml.configs.search_space.SearchSpace` with
:meth:`ask` and learns a configuration's loss with :meth:`tell`. Both are deterministic for a
seed and a sequence of calls, so replaying a journal's asks and tells into a fresh sampler
proposes the same points again (the resume path of :mod:`dvml.search.journal`).

TPE comes from Optuna (``TPESampler`` through ``Study.ask``/``Study.tell``), the optional extra
``dvml[automl]``; Optuna is imported when a TPE sampler is made, never by ``import dvml``. Its
choices are asked as indices (Optuna's categorical values must be scalars; a grid's choice may be
a list of metrics), its ranges in their own scale (``log=True``; ``log_near_one`` as a log range
of ``1 - x``), and each optimizer's arguments as their own dimensions, so that TPE models them
apart. A NaN, infinite or missing loss is told as a failed trial, which TPE leaves out.
"""

from __future__ import annotations

import math
import random
from typing import Any

from dvml.configs.search_space import Dimension, RandomDraw, SearchSpace
from dvml.exceptions import ArgumentError
from dvml.search.automl_params import require_optuna

__all__ = ["RandomSampler", "TpeSampler", "make_sampler"]


class RandomSampler:
    """Points drawn uniformly (ranges in their own scale), seeded."""

    name = "random"

    def __init__(self, space: SearchSpace, seed: int | None = None) -> None:
        self.space = space
        self.seed = seed
        self._draw = RandomDraw(random.Random(seed))
        self._asked = 0

    def ask(self) -> tuple[int, dict[str, Any]]:
        """``(number, values)``: the sampler's number of the point, and the point."""
        number = self._asked
        self._asked += 1
        return number, self.space.sample(self._draw)

    def tell(self, number: int, loss: float | None) -> None:
        """Random search learns nothing."""


class _OptunaDraw:
    def __init__(self, trial: Any) -> None:
        self.trial = trial

    def choice(self, dim: Dimension) -> int:
        return int(self.trial.suggest_categorical(dim.name, list(range(len(dim.choices)))))

    def number(self, dim: Dimension) -> float:
        if dim.distribution == "log_near_one":
            gap = self.trial.suggest_float(
                f"{dim.name}:1-x", 1.0 - dim.high, 1.0 - dim.low, log=True
            )
            return 1.0 - gap
        if dim.integer:
            low, high = math.ceil(dim.low), math.floor(dim.high)
            return float(self.trial.suggest_int(dim.name, low, high, log=dim.distribution == "log"))
        return float(
            self.trial.suggest_float(dim.name, dim.low, dim.high, log=dim.distribution == "log")
        )


class TpeSampler:
    """Optuna's TPE through ask and tell: each loss told shapes the next proposals."""

    name = "tpe"

    def __init__(self, space: SearchSpace, seed: int | None = None) -> None:
        require_optuna("The TPE sampler")
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per trial
        self.space = space
        self.seed = seed
        self._study = optuna.create_study(
            direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed)
        )
        self._trials: dict[int, Any] = {}

    def ask(self) -> tuple[int, dict[str, Any]]:
        trial = self._study.ask()
        self._trials[trial.number] = trial
        return trial.number, self.space.sample(_OptunaDraw(trial))

    def tell(self, number: int, loss: float | None) -> None:
        """Tell a point's loss once; later tells of the same point are ignored."""
        trial = self._trials.pop(number, None)
        if trial is None:
            return
        from optuna.trial import TrialState

        if loss is None or not math.isfinite(loss):
            self._study.tell(trial, state=TrialState.FAIL)
        else:
            self._study.tell(trial, float(loss))


def make_sampler(name: str, space: SearchSpace, seed: int | None) -> RandomSampler | TpeSampler:
    """``"random"`` / ``"rand"`` or ``"tpe"``."""
    if name in ("random", "rand"):
        return RandomSampler(space, seed)
    if name == "tpe":
        return TpeSampler(space, seed)
    raise ArgumentError(
        f"Unknown sampler. Received: {name!r}. Use 'random' (MADlib's 'rand') or 'tpe'."
    )
