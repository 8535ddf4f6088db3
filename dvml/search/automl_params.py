"""MADlib's ``automl_method`` and ``automl_params``, checked before anything runs.

MADlib's ``madlib_keras_automl`` takes a method (``'hyperband'`` or ``'hyperopt'``) and its
parameters as one string of ``key=value`` pairs:

- hyperband: ``'R=6, eta=3, skip_last=0'`` (the default), integers;
- hyperopt: ``'num_configs=20, num_iterations=5, algorithm=tpe'`` (the default),
  ``algorithm`` being ``tpe`` or ``rand``;
- asha (dvml's, beyond MADlib): ``'max_t=81, eta=3, grace_period=1, max_configs=100,
  time_budget_s=3600, sampler=random'``.

A key left out takes its default. MADlib's refusals are kept (an unknown method, an unknown key,
``num_configs`` below 1, ``num_iterations`` of 0, an algorithm other than ``tpe``/``rand``,
``eta`` not above 1, ``R`` below ``eta``, ``skip_last`` out of range) and raised as
:class:`~dvml.exceptions.ArgumentError` (a ``ValueError``) naming the value received. A dict of
the same keys is accepted too. Pure: no I/O (only a look-up of whether Optuna is installed, for
``tpe``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import numbers
from collections.abc import Mapping
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.search import hyperband as hb

__all__ = [
    "ALGORITHMS",
    "METHODS",
    "SAMPLERS",
    "TPE_INSTALL",
    "AshaParams",
    "HyperbandParams",
    "HyperoptParams",
    "check_method",
    "parse_automl_params",
    "require_optuna",
]

METHODS = ("hyperband", "hyperopt", "asha")
ALGORITHMS = ("tpe", "rand")
SAMPLERS = ("random", "tpe")
TPE_INSTALL = "pip install 'dvml[automl]'"
"""The command that installs Optuna, which TPE needs."""

DEFAULTS = {
    "hyperband": "R=6, eta=3, skip_last=0",
    "hyperopt": "num_configs=20, num_iterations=5, algorithm=tpe",
    "asha": "max_t=81, eta=3, grace_period=1, max_configs=100, sampler=random",
}


@dataclasses.dataclass(frozen=True)
class HyperbandParams:
    """MADlib's hyperband parameters."""

    R: int = 6
    eta: int = 3
    skip_last: int = 0

    def text(self) -> str:
        return f"R={self.R}, eta={self.eta}, skip_last={self.skip_last}"


@dataclasses.dataclass(frozen=True)
class HyperoptParams:
    """MADlib's hyperopt parameters."""

    num_configs: int = 20
    num_iterations: int = 5
    algorithm: str = "tpe"

    def text(self) -> str:
        return (
            f"num_configs={self.num_configs}, num_iterations={self.num_iterations}, "
            f"algorithm={self.algorithm}"
        )


@dataclasses.dataclass(frozen=True)
class AshaParams:
    """Asynchronous successive halving's parameters (Li et al., MLSys 2020).

    A model reaches rung ``k`` after ``grace_period * eta**k`` iterations (the top rung is
    ``max_t``); at most ``max_configs`` configurations are started; the search stops starting
    and promoting models after ``time_budget_s`` seconds (None: no limit).
    """

    max_t: int = 81
    eta: int = 3
    grace_period: int = 1
    max_configs: int = 100
    time_budget_s: float | None = None
    sampler: str = "random"

    def text(self) -> str:
        budget = "" if self.time_budget_s is None else f", time_budget_s={self.time_budget_s:g}"
        return (
            f"max_t={self.max_t}, eta={self.eta}, grace_period={self.grace_period}, "
            f"max_configs={self.max_configs}{budget}, sampler={self.sampler}"
        )


def check_method(method: Any) -> str:
    """``method`` lower-cased, if it is one of :data:`METHODS` (MADlib compares lower-case)."""
    if not isinstance(method, str) or method.strip().lower() not in METHODS:
        raise ArgumentError(
            f"Unknown automl method. Received: method={method!r:.60}. Use one of "
            f"{list(METHODS)} ('hyperband' and 'hyperopt' as in MADlib, 'asha' for "
            "asynchronous successive halving)."
        )
    return method.strip().lower()


def require_optuna(what: str) -> None:
    """Raise an ArgumentError with the install command when Optuna is not installed."""
    if importlib.util.find_spec("optuna") is None:
        raise ArgumentError(
            f"{what} needs Optuna's TPE sampler, and Optuna is not installed. Received: "
            f"{what}. Install it with `{TPE_INSTALL}`, or use random search "
            "(algorithm=rand, sampler=random)."
        )


def _pairs(params: str | Mapping[str, Any], method: str, lower: bool) -> dict[str, Any]:
    """MADlib's ``extract_keyvalue_params``: ``'a=1, b=x'`` → ``{'a': '1', 'b': 'x'}``."""
    if isinstance(params, Mapping):
        items = list(params.items())
    elif isinstance(params, str):
        items = []
        for part in params.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ArgumentError(
                    f"automl_params for {method} must be key=value pairs separated by commas. "
                    f"Received: {params!r:.120} (the part {part.strip()!r:.40}). Write e.g. "
                    f"'{DEFAULTS[method]}'."
                )
            items.append((key.strip(), value.strip()))
    else:
        raise ArgumentTypeError(
            f"automl_params must be a string of key=value pairs or a dict. Received: "
            f"{type(params).__name__} {params!r:.80}. Write e.g. '{DEFAULTS[method]}'."
        )
    result: dict[str, Any] = {}
    for key, value in items:
        name = str(key).lower() if lower else str(key)
        if name in result:
            raise ArgumentError(
                f"automl_params gives {name} twice. Received: {params!r:.120}. Give each key once."
            )
        result[name] = value
    return result


def _integer(value: Any, key: str, method: str) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ArgumentError(
        f"automl_params for {method}: {key} must be an integer. Received: {key}={value!r:.40}. "
        f"Write e.g. '{DEFAULTS[method]}'."
    )


def _unknown(keys: set[str], allowed: tuple[str, ...], method: str) -> None:
    if keys:
        raise ArgumentError(
            f"Invalid automl_params for {method}: {sorted(keys)}. Only {', '.join(allowed)} may "
            f"be given. Received keys {sorted(keys)}. Write e.g. '{DEFAULTS[method]}'."
        )


def parse_automl_params(
    method: str, params: str | Mapping[str, Any] | None = None
) -> HyperbandParams | HyperoptParams | AshaParams:
    """Check ``method`` and its ``automl_params``; None or ``""`` gives MADlib's defaults.

    Returns
    -------
    HyperbandParams, HyperoptParams or AshaParams

    Raises
    ------
    ArgumentError, ArgumentTypeError
        On an unknown method or key, a value that is not an integer, or MADlib's range checks.
    """
    method = check_method(method)
    if params is None or (isinstance(params, str) and not params.strip()):
        params = {}
    if method == "hyperband":
        return _hyperband(_pairs(params, method, lower=False))
    if method == "hyperopt":
        return _hyperopt(_pairs(params, method, lower=True))
    return _asha(_pairs(params, method, lower=True))


def _hyperband(pairs: dict[str, Any]) -> HyperbandParams:
    allowed = ("R", "eta", "skip_last")
    _unknown(set(pairs) - set(allowed), allowed, "hyperband")
    values = {k: _integer(v, k, "hyperband") for k, v in pairs.items()}
    result = HyperbandParams(**values)
    if result.eta <= 1:
        raise ArgumentError(
            f"automl_params for hyperband: eta must be greater than 1. Received: eta="
            f"{result.eta}. Use eta=3 (keep a third of the configurations per round)."
        )
    hb.hyperband_schedule(result.R, result.eta, result.skip_last)  # MADlib's R and skip_last
    return result


def _hyperopt(pairs: dict[str, Any]) -> HyperoptParams:
    allowed = ("num_configs", "num_iterations", "algorithm")
    _unknown(set(pairs) - set(allowed), allowed, "hyperopt")
    values: dict[str, Any] = {}
    for key in ("num_configs", "num_iterations"):
        if key in pairs:
            values[key] = _integer(pairs[key], key, "hyperopt")
    if "algorithm" in pairs:
        values["algorithm"] = str(pairs["algorithm"]).lower()
    result = HyperoptParams(**values)
    if result.num_configs < 1 or result.num_iterations < 1:
        raise ArgumentError(
            "automl_params for hyperopt: num_configs and num_iterations must be > 0. Received: "
            f"num_configs={result.num_configs}, num_iterations={result.num_iterations}. Give "
            "at least one configuration and one iteration."
        )
    if result.algorithm not in ALGORITHMS:
        raise ArgumentError(
            f"automl_params for hyperopt: valid algorithms are 'rand' and 'tpe'. Received: "
            f"algorithm={pairs.get('algorithm')!r}. Use algorithm=tpe or algorithm=rand."
        )
    if result.algorithm == "tpe":
        require_optuna("algorithm=tpe")
    return result


def _asha(pairs: dict[str, Any]) -> AshaParams:
    allowed = ("max_t", "eta", "grace_period", "max_configs", "time_budget_s", "sampler")
    _unknown(set(pairs) - set(allowed), allowed, "asha")
    values: dict[str, Any] = {}
    for key in ("max_t", "eta", "grace_period", "max_configs"):
        if key in pairs:
            values[key] = _integer(pairs[key], key, "asha")
    if pairs.get("time_budget_s") not in (None, "None", "none"):
        raw = pairs["time_budget_s"]
        try:
            budget = float(raw)
        except (TypeError, ValueError):
            budget = math.nan
        if isinstance(raw, bool) or not budget > 0 or not math.isfinite(budget):
            raise ArgumentError(
                f"automl_params for asha: time_budget_s must be a positive number of seconds. "
                f"Received: time_budget_s={raw!r:.40}. Leave it out for no time limit."
            )
        values["time_budget_s"] = budget
    if "sampler" in pairs:
        values["sampler"] = str(pairs["sampler"]).lower()
    result = AshaParams(**values)
    if result.eta < 2:
        raise ArgumentError(
            f"automl_params for asha: eta must be greater than 1. Received: eta={result.eta}. "
            "Use eta=3 (promote the top third of a rung)."
        )
    if result.grace_period < 1 or result.max_t < result.grace_period:
        raise ArgumentError(
            "automl_params for asha: need 1 <= grace_period <= max_t. Received: grace_period="
            f"{result.grace_period}, max_t={result.max_t}. Give the iterations of the first "
            "rung (grace_period) and of the last (max_t)."
        )
    if result.max_configs < 1:
        raise ArgumentError(
            f"automl_params for asha: max_configs must be at least 1. Received: max_configs="
            f"{result.max_configs}. Give how many configurations may be started."
        )
    if result.sampler not in SAMPLERS:
        raise ArgumentError(
            f"automl_params for asha: sampler must be one of {list(SAMPLERS)}. Received: "
            f"sampler={pairs.get('sampler')!r}. Use sampler=random or sampler=tpe."
        )
    if result.sampler == "tpe":
        require_optuna("sampler=tpe")
    return result
