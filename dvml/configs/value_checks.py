"""Checks of one parameter value: each takes ``(key, value)`` and returns the value or raises.

A :class:`~dvml.exceptions.ParameterError` names the key, what it must be and what was received
(:func:`fail`). The checks are shared by the compile and fit parameters, the optimizer's
arguments, the loss and metric classes' arguments and the callbacks; :func:`check_pairs` runs a
table of them over the ``(key, value)`` pairs a parameter string was read into.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from dvml.exceptions import ParameterError

__all__ = [
    "MAX_INT",
    "NULLABLE",
    "Check",
    "any_real",
    "bool_value",
    "check_pairs",
    "check_that",
    "class_weight",
    "did_you_mean",
    "fail",
    "finite",
    "is_int",
    "is_real",
    "loss_weights",
    "nonnegative_int",
    "nonnegative_real",
    "nonpositive_real",
    "plain_bool",
    "positive_int",
    "positive_int_arg",
    "positive_real",
    "sample_weight_mode",
    "string_value",
    "unit_real",
    "verbose_value",
]


MAX_INT = 2**63 - 1
"""Largest integer a parameter may hold (an int64)."""

Check = Callable[[str, Any], Any]
"""A check: ``(key, value)`` to the checked value, or a ParameterError."""


def fail(key: str, expected: str, value: Any, hint: str = "") -> ParameterError:
    """The ParameterError for ``key``: what it must be, and what was received."""
    message = f"Parameter {key!r} must be {expected}. Received: {key}={value!r}."
    return ParameterError(f"{message} {hint}".rstrip())


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def string_value(key: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise fail(key, "a non-empty string", value, f"For example {key}='mse'.")
    return value


def bool_value(key: str, value: Any) -> bool | None:
    """True or False (None for the keys in :data:`NULLABLE`)."""
    if value is None and key in NULLABLE:
        return None
    if not isinstance(value, bool):
        hint = "Write True or False without quotes."
        if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
            literal = value.strip().capitalize()
            hint = f"A string is not a boolean: write {key}={literal} without quotes."
        raise fail(key, "a boolean (True or False)", value, hint)
    return value


def positive_int(key: str, value: Any) -> int | None:
    """A positive int64 (None for the keys in :data:`NULLABLE`)."""
    if value is None and key in NULLABLE:
        return None
    if not is_int(value) or not 0 < value <= MAX_INT:
        raise fail(key, "a positive integer", value)
    return int(value)


def nonnegative_int(key: str, value: Any) -> int:
    """A non-negative int64."""
    if not is_int(value) or not 0 <= value <= MAX_INT:
        raise fail(key, "a non-negative integer", value)
    return int(value)


def verbose_value(key: str, value: Any) -> int:
    """Keras' ``verbose``: 0, 1 or 2."""
    if not is_int(value) or value not in (0, 1, 2):
        raise fail(key, "0, 1 or 2", value)
    return int(value)


def finite(key: str, value: Any, expected: str = "a finite number") -> float | int:
    """A finite number."""
    if not is_real(value) or not math.isfinite(value):
        raise fail(key, expected, value)
    return value


def loss_weights(key: str, value: Any) -> list[float | int] | dict[str, float | int] | None:
    """A list of finite numbers, or a dict of output name to one (or None)."""
    if value is None:
        return None
    expected = "a list of finite numbers or a dict of output name to finite number"
    if isinstance(value, list | tuple):
        return [finite(key, v, expected) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: finite(key, v, expected) for k, v in value.items()}
    raise fail(key, expected, value)


def class_weight(key: str, value: Any) -> dict[int, float | int] | None:
    """A dict of class index to non-negative weight (or None)."""
    if value is None:
        return None
    expected = "a dict of class index to non-negative weight, such as {0: 1.0, 1: 2.5}"
    if not isinstance(value, dict) or not all(is_int(k) and k >= 0 for k in value):
        raise fail(key, expected, value)
    for v in value.values():
        if not is_real(v) or not math.isfinite(v) or v < 0:
            raise fail(key, expected, value)
    return dict(value)


# optimizer config key -> (check, what it must be)
def check_that(test: Callable[[Any], bool], expected: str) -> Check:
    """A check that refuses a value for which ``test`` is false, as ``expected``."""

    def check(key: str, value: Any) -> Any:
        if not test(value):
            raise fail(key, expected, value)
        return value

    return check


positive_real = check_that(
    lambda v: is_real(v) and math.isfinite(v) and v > 0, "a finite positive number"
)
nonnegative_real = check_that(
    lambda v: is_real(v) and math.isfinite(v) and v >= 0, "a finite non-negative number"
)
unit_real = check_that(
    lambda v: is_real(v) and math.isfinite(v) and 0 <= v <= 1, "a number between 0 and 1"
)
any_real = check_that(lambda v: is_real(v) and math.isfinite(v), "a finite number")
nonpositive_real = check_that(
    lambda v: is_real(v) and math.isfinite(v) and v <= 0, "a finite number <= 0"
)
plain_bool = check_that(lambda v: isinstance(v, bool), "a boolean (True or False)")
positive_int_arg = check_that(lambda v: is_int(v) and 0 < v <= MAX_INT, "a positive integer")


def sample_weight_mode(key: str, value: Any) -> str | None:
    """Keras 2's ``sample_weight_mode`` (None or 'temporal'): accepted as MADlib's examples
    write it, and without effect, since dvml trains without sample weights (as Keras 2 does
    when none are given)."""
    if value is not None and value != "temporal":
        raise fail(key, "None or 'temporal' (Keras 2's values)", value)
    return value


# compile/fit keys whose value may also be None (Keras' own default)
NULLABLE = frozenset(
    {"run_eagerly", "jit_compile", "steps_per_epoch", "validation_steps", "steps_per_execution"}
)


def check_pairs(
    pairs: list[tuple[str, Any]],
    checks: Mapping[str, Check],
    refused: Mapping[str, str],
    what: str,
) -> dict[str, Any]:
    """Run ``checks`` over ``pairs``: unknown, refused and repeated keys fail."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ParameterError(
                f"Parameter {key!r} is given twice in the {what}. Received: {key}="
                f"{result[key]!r} and {key}={value!r}. Give each parameter once."
            )
        if key in refused:
            raise ParameterError(f"Parameter {key!r} is not accepted. {refused[key]}")
        check = checks.get(key)
        if check is None:
            raise ParameterError(
                f"Unknown parameter {key!r} in the {what}. Received: {key}={value!r}."
                f"{did_you_mean(key, checks)} Known keys: {sorted(checks)}."
            )
        result[key] = check(key, value)
    return result


def did_you_mean(key: str, known: Mapping[str, Any]) -> str:
    """`` Did you mean 'x'?`` for the closest of ``known``, else empty."""
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
