"""Losses and metrics: a tf-keras name, a custom function's name, or a tf-keras class with
literal arguments (``CategoricalCrossentropy(label_smoothing=0.1)``, ``AUC(name='auc')``).

A class is never instantiated here: its name is looked up in tf-keras' own losses and metrics
(:mod:`dvml.configs.keras_objects`), each argument checked by its kind, and the result is the
spec ``{"class_name": ..., "config": {...}}``. The losses and metrics for integer labels are
refused (dvml's labels are one-hot), naming the one-hot replacement.
"""

from __future__ import annotations

import ast
import difflib
import math
from collections.abc import Mapping
from typing import Any

from dvml.configs import keras_objects as ko
from dvml.configs.literals import Call, guard, keyword_pairs, parse_call, render
from dvml.configs.value_checks import (
    MAX_INT,
    Check,
    fail,
    is_int,
    is_real,
    nonnegative_real,
    plain_bool,
    positive_real,
    string_value,
    unit_real,
)
from dvml.exceptions import ParameterError

__all__ = ["loss_check", "metrics_check", "object_text", "reported_name"]


def _argument(key: str, kind: str, value: Any) -> Any:
    """Check one keyword argument of a loss or metric class by its kind (keras_objects)."""
    if kind in ko.ENUMS:
        if value not in ko.ENUMS[kind] or isinstance(value, bool):
            raise fail(key, f"one of {list(ko.ENUMS[kind])}", value)
        return value
    if value is None and kind.endswith("_or_none"):
        return None
    base = kind.removesuffix("_or_none")
    if base == "str":
        return string_value(key, value)
    if base == "bool":
        return plain_bool(key, value)
    if base == "unit":
        return unit_real(key, value)
    if base == "positive":
        return positive_real(key, value)
    if base == "nonnegative":
        return nonnegative_real(key, value)
    if base in ("int", "positive_int", "nonnegative_int", "threshold_count"):
        low = {"int": -MAX_INT, "positive_int": 1, "nonnegative_int": 0, "threshold_count": 2}
        if not is_int(value) or not low[base] <= value <= MAX_INT:
            what = "an integer" if base == "int" else f"an integer >= {low[base]}"
            raise fail(key, what + (" or None" if kind.endswith("_or_none") else ""), value)
        return int(value)
    if base == "int_list":
        if not isinstance(value, list | tuple) or not value or not all(map(is_int, value)):
            raise fail(key, "a non-empty list of integers", value)
        return list(value)
    if base == "real_list":
        if not isinstance(value, list | tuple) or not all(
            is_real(v) and math.isfinite(v) for v in value
        ):
            raise fail(key, "a list of finite numbers or None", value)
        return list(value)
    if base == "thresholds":
        items = value if isinstance(value, list | tuple) else [value]
        if not items or not all(is_real(v) and 0 <= v <= 1 for v in items):
            raise fail(key, "a number between 0 and 1, a list of such numbers, or None", value)
        return list(value) if isinstance(value, list | tuple) else value
    # Only reachable through a bug in dvml.configs.keras_objects' tables.
    raise ParameterError(
        f"dvml has no check for argument kind {kind!r} of {key!r}: a bug in "
        "dvml.configs.keras_objects. Please report it; meanwhile leave this argument out."
    )


_CLASSES = {"loss": ko.LOSS_CLASSES, "metric": ko.METRIC_CLASSES}
_NAMES = {"loss": ko.LOSS_NAMES, "metric": ko.METRIC_NAMES}


def _sparse_refusal(key: str, name: str, shown: Any) -> ParameterError:
    return ParameterError(
        f"{name} expects integer class labels, but dvml's labels are one-hot (the "
        f"preprocessor one-hot encodes y). Received: {key}={shown!r}. Use "
        f"{ko.SPARSE_REPLACEMENTS[name]} instead, with the same arguments."
    )


def _cross_check(key: str, name: str, config: dict[str, Any], shown: Any) -> None:
    """Arguments that tf-keras refuses together (found by tests/train/test_keras_objects.py)."""
    problem = None
    if name == "AUC" and config.get("num_labels") is not None and not config.get("multi_label"):
        problem = "num_labels is used only with multi_label=True"
    if problem:
        raise ParameterError(
            f"{name} would refuse its arguments: {problem}. Received: {key}={shown!r}. "
            "Change or remove one of them."
        )


def _object_spec(key: str, kind: str, name: str, pairs: Any, shown: Any) -> dict[str, Any]:
    """Check ``name(**pairs)`` against tf-keras' own ``kind`` classes; return the spec."""
    classes = _CLASSES[kind]
    canonical = name if name in classes else None
    if canonical is None:
        matches = [known for known in classes if known.lower() == name.lower()]
        canonical = matches[0] if matches else None
    if canonical is None:
        close = difflib.get_close_matches(name, list(classes), n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise ParameterError(
            f"Unknown {kind} class {name!r} in {key}. Received: {key}={shown!r}.{hint} "
            f"Arguments can be given to tf-keras' own {kind} classes only: "
            f"{sorted(n for n in classes if n not in ko.SPARSE_REPLACEMENTS)}; a custom "
            f"{kind} is given by its registered name, without arguments."
        )
    if canonical in ko.SPARSE_REPLACEMENTS:
        raise _sparse_refusal(key, canonical, shown)
    known, required, _ = classes[canonical]
    config: dict[str, Any] = {}
    for arg, value in pairs:
        if not isinstance(arg, str) or arg not in known:
            close = difflib.get_close_matches(str(arg), list(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ParameterError(
                f"{canonical} has no argument {arg!r}, so the trainers would refuse it. "
                f"Received: {key}={shown!r}.{hint} {canonical} accepts: {list(known)}."
            )
        config[arg] = _argument(f"{canonical}.{arg}", ko.ARGUMENT_KINDS[arg], value)
    _cross_check(key, canonical, config, shown)
    missing = [arg for arg in required if arg not in config]
    if missing:
        raise ParameterError(
            f"{canonical} needs the argument(s) {missing}. Received: {key}={shown!r}. Write "
            f"{canonical}({', '.join(f'{arg}=...' for arg in missing)})."
        )
    return {"class_name": canonical, "config": config}


def _keras_object(
    key: str, kind: str, value: Any, custom_names: frozenset[str] | None
) -> str | dict[str, Any]:
    """A loss or one metric: a plain name, ``'Class(k=v)'``, ``Class(k=v)`` or a spec dict."""
    expected = (
        f"a {kind} name such as 'categorical_crossentropy', or a tf-keras {kind} class with "
        f"arguments such as CategoricalCrossentropy(label_smoothing=0.1)"
    )
    if isinstance(value, Call):
        return _object_spec(key, kind, value.name, value.pairs, value)
    if isinstance(value, Mapping):
        config = value.get("config", {})
        if (
            set(value) - {"class_name", "config"}
            or not isinstance(value.get("class_name"), str)
            or not isinstance(config, Mapping)
        ):
            raise fail(key, expected + ', or a dict {"class_name": ..., "config": {...}}', value)
        return _object_spec(key, kind, value["class_name"], list(config.items()), value)
    if not isinstance(value, str) or not value.strip():
        raise fail(key, expected, value)
    if "(" in value:
        guard(value, f"{key} spec")
        call = parse_call(value, value, what=f"{key} spec")
        if not isinstance(call.func, ast.Name):
            raise fail(key, expected, value)
        pairs = keyword_pairs(call, value.strip(), value, what=f"{key} spec")
        return _object_spec(key, kind, call.func.id, pairs, value)
    if value in ko.SPARSE_REPLACEMENTS:
        raise _sparse_refusal(key, value, value)
    if custom_names is not None and value not in _NAMES[kind] and value not in custom_names:
        close = difflib.get_close_matches(value, sorted(_NAMES[kind] | custom_names), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ParameterError(
            f"Unknown {kind} {value!r}: it is neither a tf-keras {kind} nor a custom function "
            f"listed in custom_objects. Received: {key}={value!r}.{hint} Register a custom "
            "function with dvml.register_custom_function and list it in custom_objects."
        )
    return value


def loss_check(custom_names: frozenset[str] | None) -> Check:
    """The check of ``loss``; with ``custom_names``, a plain name must be known."""

    def check(key: str, value: Any) -> Any:
        return _keras_object(key, "loss", value, custom_names)

    return check


def metrics_check(custom_names: frozenset[str] | None) -> Check:
    """The check of ``metrics`` and ``weighted_metrics`` (a list)."""

    def check(key: str, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            raise fail(key, "a list", value, f"Write {key}=[{value!r}].")
        if not isinstance(value, list | tuple):
            raise fail(key, "a list of metric names or metric classes", value)
        return [_keras_object(key, "metric", item, custom_names) for item in value]

    return check


def object_text(spec: str | Mapping[str, Any]) -> str:
    """A loss, metric or optimizer spec as the user would write it: ``Name(key=value, ...)``.

    A plain name is returned as it is.
    """
    if isinstance(spec, str):
        return spec
    config = spec.get("config") or {}
    args = ", ".join(f"{k}={render(v, str(spec.get('class_name')), 1)}" for k, v in config.items())
    return f"{spec.get('class_name')}({args})"


def reported_name(spec: str | Mapping[str, Any], kind: str = "metric") -> str:
    """The name Keras reports a loss or metric under (its ``name=``, else the class default).

    A plain name (``'accuracy'``, a custom function) is returned as it is.
    """
    if isinstance(spec, str):
        return spec
    name = (spec.get("config") or {}).get("name")
    if isinstance(name, str):
        return name
    entry = _CLASSES[kind].get(str(spec.get("class_name")))
    return entry[2] if entry else str(spec.get("class_name"))
