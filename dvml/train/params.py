"""Safe parsing of MADlib-style compile and fit parameters.

MADlib users write Keras arguments as one string, for example
``"loss='categorical_crossentropy', optimizer='SGD(lr=0.01, momentum=0.9)', metrics=['accuracy']"``
or ``"batch_size=32, epochs=2, verbose=0"``. This module turns such a string (or a dict) into
a dict of checked plain values and back.

Nothing in a parameter string is ever evaluated. The string is bounded in length and bracket
depth, parsed with :func:`ast.parse` as the keyword arguments of a synthetic call, and only
literal nodes are read: strings, finite numbers, ``True``/``False``/``None``, lists, tuples and
dicts. Every other node (names, calls, attribute access, operators, lambdas, f-strings) is
refused with a :class:`~dvml.exceptions.ParameterError`. The one call form allowed is a Keras
class with keyword arguments for ``optimizer``, ``loss``, ``metrics`` and ``weighted_metrics``,
written as a call or inside a string: ``optimizer=SGD(learning_rate=0.01)``,
``optimizer='SGD(learning_rate=0.01)'``, ``loss=CategoricalCrossentropy(label_smoothing=0.1)``,
``metrics=['accuracy', AUC(name='auc')]``. It is never called: the class name is looked up in
fixed lists of tf-keras' own optimizers, losses and metrics (:mod:`dvml.train.keras_objects`),
each argument is checked against that class's known keyword arguments, and the result is the
spec ``{"class_name": "SGD", "config": {"learning_rate": 0.01}}``.

The parsers are pure and never import TensorFlow; :func:`build_optimizer` and
:func:`compile_kwargs` import ``tf_keras`` lazily, for the trainer processes.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import numbers
from collections.abc import Callable, Collection, Mapping
from typing import Any

from dvml.exceptions import ParameterError
from dvml.train import keras_objects as ko

__all__ = [
    "COMPILE_KEYS",
    "FIT_KEYS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "bracket_depth",
    "build_optimizer",
    "compile_kwargs",
    "format_params",
    "object_text",
    "params_key",
    "params_text",
    "parse_compile_params",
    "parse_fit_params",
    "reported_name",
]

MAX_LENGTH = 10_000
"""Longest parameter string accepted, in characters."""

MAX_DEPTH = 8
"""Deepest bracket nesting accepted; checked by a cheap scan before the string is parsed."""

_MAX_INT = 2**63 - 1

# lower-case name -> the tf-keras class name
_OPTIMIZERS = {
    name.lower(): name
    for name in (
        "Adadelta",
        "Adafactor",
        "Adagrad",
        "Adam",
        "AdamW",
        "Adamax",
        "Ftrl",
        "Lion",
        "Nadam",
        "RMSprop",
        "SGD",
    )
}

_Check = Callable[[str, Any], Any]


@dataclasses.dataclass(frozen=True)
class _Call:
    """Internal: ``Name(key=literal, ...)`` as written, not yet checked against any class."""

    name: str
    pairs: tuple[tuple[str, Any], ...]

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.pairs)})"


class _Refused(Exception):
    """Internal: a value that is not a plain literal, with the reason and what was expected."""

    def __init__(self, reason: str, expected: str = "a literal value") -> None:
        super().__init__(reason)
        self.expected = expected


# --------------------------------------------------------------------------- value checks


def _fail(key: str, expected: str, value: Any, hint: str = "") -> ParameterError:
    message = f"Parameter {key!r} must be {expected}. Received: {key}={value!r}."
    return ParameterError(f"{message} {hint}".rstrip())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(key, "a non-empty string", value, f"For example {key}='mse'.")
    return value


def _bool(key: str, value: Any) -> bool | None:
    if value is None and key in _NULLABLE:
        return None
    if not isinstance(value, bool):
        hint = "Write True or False without quotes."
        if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
            literal = value.strip().capitalize()
            hint = f"A string is not a boolean: write {key}={literal} without quotes."
        raise _fail(key, "a boolean (True or False)", value, hint)
    return value


def _positive_int(key: str, value: Any) -> int | None:
    if value is None and key in _NULLABLE:
        return None
    if not _is_int(value) or not 0 < value <= _MAX_INT:
        raise _fail(key, "a positive integer", value)
    return int(value)


def _nonnegative_int(key: str, value: Any) -> int:
    if not _is_int(value) or not 0 <= value <= _MAX_INT:
        raise _fail(key, "a non-negative integer", value)
    return int(value)


def _verbose(key: str, value: Any) -> int:
    if not _is_int(value) or value not in (0, 1, 2):
        raise _fail(key, "0, 1 or 2", value)
    return int(value)


def _finite(key: str, value: Any, expected: str = "a finite number") -> float | int:
    if not _is_real(value) or not math.isfinite(value):
        raise _fail(key, expected, value)
    return value


def _loss_weights(key: str, value: Any) -> list[float | int] | dict[str, float | int] | None:
    if value is None:
        return None
    expected = "a list of finite numbers or a dict of output name to finite number"
    if isinstance(value, list | tuple):
        return [_finite(key, v, expected) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _finite(key, v, expected) for k, v in value.items()}
    raise _fail(key, expected, value)


def _class_weight(key: str, value: Any) -> dict[int, float | int] | None:
    if value is None:
        return None
    expected = "a dict of class index to non-negative weight, such as {0: 1.0, 1: 2.5}"
    if not isinstance(value, dict) or not all(_is_int(k) and k >= 0 for k in value):
        raise _fail(key, expected, value)
    for v in value.values():
        if not _is_real(v) or not math.isfinite(v) or v < 0:
            raise _fail(key, expected, value)
    return dict(value)


# optimizer config key -> (check, what it must be)
def _opt_check(test: Callable[[Any], bool], expected: str) -> _Check:
    def check(key: str, value: Any) -> Any:
        if not test(value):
            raise _fail(key, expected, value)
        return value

    return check


_positive_real = _opt_check(
    lambda v: _is_real(v) and math.isfinite(v) and v > 0, "a finite positive number"
)
_nonnegative_real = _opt_check(
    lambda v: _is_real(v) and math.isfinite(v) and v >= 0, "a finite non-negative number"
)
_unit_real = _opt_check(
    lambda v: _is_real(v) and math.isfinite(v) and 0 <= v <= 1, "a number between 0 and 1"
)
_any_real = _opt_check(lambda v: _is_real(v) and math.isfinite(v), "a finite number")
_nonpositive_real = _opt_check(
    lambda v: _is_real(v) and math.isfinite(v) and v <= 0, "a finite number <= 0"
)
_plain_bool = _opt_check(lambda v: isinstance(v, bool), "a boolean (True or False)")
_opt_positive_int = _opt_check(lambda v: _is_int(v) and 0 < v <= _MAX_INT, "a positive integer")

_OPTIMIZER_CONFIG: dict[str, _Check] = {
    "learning_rate": _positive_real,
    "epsilon": _positive_real,
    "momentum": _unit_real,
    "beta_1": _unit_real,
    "beta_2": _unit_real,
    "rho": _unit_real,
    "ema_momentum": _unit_real,
    "weight_decay": _nonnegative_real,
    "clipnorm": _nonnegative_real,
    "clipvalue": _nonnegative_real,
    "global_clipnorm": _nonnegative_real,
    "initial_accumulator_value": _nonnegative_real,
    "l1_regularization_strength": _nonnegative_real,
    "l2_regularization_strength": _nonnegative_real,
    "l2_shrinkage_regularization_strength": _nonnegative_real,
    "epsilon_1": _nonnegative_real,
    "epsilon_2": _nonnegative_real,
    "clip_threshold": _nonnegative_real,
    "beta_2_decay": _any_real,
    "learning_rate_power": _nonpositive_real,
    "nesterov": _plain_bool,
    "amsgrad": _plain_bool,
    "centered": _plain_bool,
    "use_ema": _plain_bool,
    "relative_step": _plain_bool,
    "ema_overwrite_frequency": _opt_positive_int,
    "decay": _nonnegative_real,
}
_OPTIMIZER_ALIASES = {"lr": "learning_rate"}
# Keras 2 arguments that MADlib's documentation uses: ``decay`` (every optimizer took it; it is
# built as its inverse-time schedule, :func:`build_optimizer`) and ``epsilon=None`` (Keras 2's
# "the backend's epsilon", tf-keras' default: the argument is dropped).
_KERAS2_ARGUMENTS = ("decay",)


def _optimizer_name(key: str, name: Any) -> str:
    canonical = _OPTIMIZERS.get(name.strip().lower()) if isinstance(name, str) else None
    if canonical is None:
        raise _fail(key, f"one of the tf-keras optimizers {sorted(_OPTIMIZERS.values())}", name)
    return canonical


def _optimizer_config(key: str, name: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for raw_key, value in pairs:
        arg = _OPTIMIZER_ALIASES.get(raw_key, raw_key)
        if arg in config:
            raise ParameterError(
                f"Optimizer argument {arg!r} is given twice in {key}. Received: {name}("
                f"{', '.join(f'{k}={v!r}' for k, v in pairs)}). Give it once "
                f"(lr is another name for learning_rate)."
            )
        if arg == "epsilon" and value is None:
            continue  # Keras 2's epsilon=None: the default
        check = _OPTIMIZER_CONFIG.get(arg)
        accepted = [a for a in ko.OPTIMIZER_CLASSES[name] if a in _OPTIMIZER_CONFIG]
        accepted += list(_KERAS2_ARGUMENTS)
        if check is None or arg not in accepted:
            known = dict.fromkeys(accepted)
            raise ParameterError(
                f"Unknown optimizer argument {raw_key!r} for {name}, so the trainers would "
                f"refuse it. Received: {raw_key}={value!r}.{_did_you_mean(raw_key, known)} "
                f"{name} accepts: {accepted}."
            )
        config[arg] = check(f"{name}.{arg}", value)
    if "clipnorm" in config and "global_clipnorm" in config:
        raise ParameterError(
            f"{name} cannot take both clipnorm and global_clipnorm. Received: "
            f"clipnorm={config['clipnorm']!r}, global_clipnorm={config['global_clipnorm']!r}. "
            "Give one of them."
        )
    return config


def _optimizer(key: str, value: Any) -> str | dict[str, Any]:
    if isinstance(value, dict):
        unknown = set(value) - {"class_name", "config"}
        config = value.get("config", {})
        if unknown or not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
            raise _fail(
                key,
                "a string such as 'adam' or 'SGD(learning_rate=0.01)', or a dict "
                '{"class_name": ..., "config": {...}}',
                value,
            )
        name = _optimizer_name(key, value.get("class_name"))
        return {"class_name": name, "config": _optimizer_config(key, name, list(config.items()))}
    if isinstance(value, _Call):
        name = _optimizer_name(key, value.name)
        return {"class_name": name, "config": _optimizer_config(key, name, list(value.pairs))}
    if not isinstance(value, str) or not value.strip():
        raise _fail(key, "a string such as 'adam' or 'SGD(learning_rate=0.01)'", value)
    if "(" not in value:
        _optimizer_name(key, value)
        return value
    _guard(value, f"{key} spec")
    call = _parse_call(value, value, what=f"{key} spec")
    if not isinstance(call.func, ast.Name):
        raise _fail(key, "an optimizer name followed by keyword arguments", value)
    name = _optimizer_name(key, call.func.id)
    pairs = _keyword_pairs(call, value.strip(), value, what=f"{key} spec {name}(...)")
    return {"class_name": name, "config": _optimizer_config(key, name, pairs)}


# ----------------------------------------------------------------- loss and metric objects


def _argument(key: str, kind: str, value: Any) -> Any:
    """Check one keyword argument of a loss or metric class by its kind (keras_objects)."""
    if kind in ko.ENUMS:
        if value not in ko.ENUMS[kind] or isinstance(value, bool):
            raise _fail(key, f"one of {list(ko.ENUMS[kind])}", value)
        return value
    if value is None and kind.endswith("_or_none"):
        return None
    base = kind.removesuffix("_or_none")
    if base == "str":
        return _string(key, value)
    if base == "bool":
        return _plain_bool(key, value)
    if base == "unit":
        return _unit_real(key, value)
    if base == "positive":
        return _positive_real(key, value)
    if base == "nonnegative":
        return _nonnegative_real(key, value)
    if base in ("int", "positive_int", "nonnegative_int", "threshold_count"):
        low = {"int": -_MAX_INT, "positive_int": 1, "nonnegative_int": 0, "threshold_count": 2}
        if not _is_int(value) or not low[base] <= value <= _MAX_INT:
            what = "an integer" if base == "int" else f"an integer >= {low[base]}"
            raise _fail(key, what + (" or None" if kind.endswith("_or_none") else ""), value)
        return int(value)
    if base == "int_list":
        if not isinstance(value, list | tuple) or not value or not all(map(_is_int, value)):
            raise _fail(key, "a non-empty list of integers", value)
        return list(value)
    if base == "real_list":
        if not isinstance(value, list | tuple) or not all(
            _is_real(v) and math.isfinite(v) for v in value
        ):
            raise _fail(key, "a list of finite numbers or None", value)
        return list(value)
    if base == "thresholds":
        items = value if isinstance(value, list | tuple) else [value]
        if not items or not all(_is_real(v) and 0 <= v <= 1 for v in items):
            raise _fail(key, "a number between 0 and 1, a list of such numbers, or None", value)
        return list(value) if isinstance(value, list | tuple) else value
    # Only reachable through a bug in dvml.train.keras_objects' tables.
    raise ParameterError(
        f"dvml has no check for argument kind {kind!r} of {key!r}: a bug in "
        "dvml.train.keras_objects. Please report it; meanwhile leave this argument out."
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
    if isinstance(value, _Call):
        return _object_spec(key, kind, value.name, value.pairs, value)
    if isinstance(value, Mapping):
        config = value.get("config", {})
        if (
            set(value) - {"class_name", "config"}
            or not isinstance(value.get("class_name"), str)
            or not isinstance(config, Mapping)
        ):
            raise _fail(key, expected + ', or a dict {"class_name": ..., "config": {...}}', value)
        return _object_spec(key, kind, value["class_name"], list(config.items()), value)
    if not isinstance(value, str) or not value.strip():
        raise _fail(key, expected, value)
    if "(" in value:
        _guard(value, f"{key} spec")
        call = _parse_call(value, value, what=f"{key} spec")
        if not isinstance(call.func, ast.Name):
            raise _fail(key, expected, value)
        pairs = _keyword_pairs(call, value.strip(), value, what=f"{key} spec")
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


def _loss_check(custom_names: frozenset[str] | None) -> _Check:
    def check(key: str, value: Any) -> Any:
        return _keras_object(key, "loss", value, custom_names)

    return check


def _metrics_check(custom_names: frozenset[str] | None) -> _Check:
    def check(key: str, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            raise _fail(key, "a list", value, f"Write {key}=[{value!r}].")
        if not isinstance(value, list | tuple):
            raise _fail(key, "a list of metric names or metric classes", value)
        return [_keras_object(key, "metric", item, custom_names) for item in value]

    return check


def object_text(spec: str | Mapping[str, Any]) -> str:
    """A loss, metric or optimizer spec as the user would write it: ``Name(key=value, ...)``.

    A plain name is returned as it is.
    """
    if isinstance(spec, str):
        return spec
    config = spec.get("config") or {}
    args = ", ".join(f"{k}={_render(v, str(spec.get('class_name')), 1)}" for k, v in config.items())
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


def _sample_weight_mode(key: str, value: Any) -> str | None:
    """Keras 2's ``sample_weight_mode`` (None or 'temporal'): accepted as MADlib's examples
    write it, and without effect, since dvml trains without sample weights (as Keras 2 does
    when none are given)."""
    if value is not None and value != "temporal":
        raise _fail(key, "None or 'temporal' (Keras 2's values)", value)
    return value


_nonnegative_int_arg = _opt_check(lambda v: _is_int(v) and 0 <= v <= _MAX_INT, "an integer >= 0")
_update_freq = _opt_check(
    lambda v: v in ("epoch", "batch") or (_is_int(v) and 0 < v <= _MAX_INT),
    "'epoch', 'batch' or a positive integer",
)
# The callbacks accepted in fit parameters (MADlib 1.18+ supports TensorBoard): their
# arguments and checks. The trainers write each under its log_dir (see callbacks_of).
_CALLBACKS: dict[str, dict[str, _Check]] = {
    "TensorBoard": {
        "log_dir": lambda key, value: _string(key, value),
        "histogram_freq": _nonnegative_int_arg,
        "write_graph": _plain_bool,
        "write_images": _plain_bool,
        "write_steps_per_second": _plain_bool,
        "update_freq": _update_freq,
        "profile_batch": _nonnegative_int_arg,
        "embeddings_freq": _nonnegative_int_arg,
    }
}


def _callback(key: str, item: Any, shown: Any) -> dict[str, Any]:
    if isinstance(item, _Call):
        name, pairs = item.name, list(item.pairs)
    elif isinstance(item, Mapping) and isinstance(item.get("class_name"), str):
        name, pairs = item["class_name"], list((item.get("config") or {}).items())
    else:
        raise _fail(key, "a list of callbacks such as [TensorBoard(log_dir='/tmp/logs')]", shown)
    known = _CALLBACKS.get(name)
    if known is None:
        raise ParameterError(
            f"Callback {name!r} cannot be given in the fit parameters: dvml runs TensorBoard "
            f"only (MADlib's one callback). Received: {key}={shown!r}. Use "
            "[TensorBoard(log_dir='...')], or dvml.fit(..., tensorboard_dir=...)."
        )
    config: dict[str, Any] = {}
    for arg, value in pairs:
        if arg not in known:
            raise ParameterError(
                f"{name} has no argument {arg!r} dvml accepts. Received: {key}={shown!r}."
                f"{_did_you_mean(str(arg), known)} Accepted: {list(known)}."
            )
        config[arg] = known[arg](f"{name}.{arg}", value)
    if "log_dir" not in config:
        raise ParameterError(
            f"{name} needs log_dir: the trainers run elsewhere than this client. Received: "
            f"{key}={shown!r}. Write {name}(log_dir='/shared/path/logs')."
        )
    return {"class_name": name, "config": config}


def _callbacks(key: str, value: Any) -> list[dict[str, Any]] | None:
    """``callbacks=[TensorBoard(log_dir=...)]``, also as the text of the list (MADlib's grids
    write ``'callbacks': ['[TensorBoard(log_dir="/tmp/logs")]']``)."""
    if value is None:
        return None
    shown = value
    if isinstance(value, str):
        [(_, value)] = _pairs(f"{key}={value.strip()}", f"{key} value")
    items = value if isinstance(value, list | tuple) else [value]
    return [_callback(key, item, shown) for item in items]


# compile/fit keys whose value may also be None (Keras' own default)
_NULLABLE = frozenset(
    {"run_eagerly", "jit_compile", "steps_per_epoch", "validation_steps", "steps_per_execution"}
)

_COMPILE_CHECKS: dict[str, _Check] = {
    "loss": _loss_check(None),
    "optimizer": _optimizer,
    "metrics": _metrics_check(None),
    "loss_weights": _loss_weights,
    "weighted_metrics": _metrics_check(None),
    "run_eagerly": _bool,
    "steps_per_execution": _positive_int,
    "jit_compile": _bool,
    "sample_weight_mode": _sample_weight_mode,
}

_FIT_CHECKS: dict[str, _Check] = {
    "batch_size": _positive_int,
    "epochs": _positive_int,
    "verbose": _verbose,
    "shuffle": _bool,
    "class_weight": _class_weight,
    "steps_per_epoch": _positive_int,
    "validation_steps": _positive_int,
    "validation_freq": _positive_int,
    "initial_epoch": _nonnegative_int,
    "sample_weight_mode": _sample_weight_mode,
    "callbacks": _callbacks,
}

COMPILE_KEYS: tuple[str, ...] = tuple(_COMPILE_CHECKS)
"""The compile keys that :func:`parse_compile_params` accepts."""

FIT_KEYS: tuple[str, ...] = tuple(_FIT_CHECKS)
"""The fit keys that :func:`parse_fit_params` accepts."""

_FIT_REFUSED = {
    "sample_weight": "Sample weights are per-sample arrays and cannot be given in a parameter "
    "string; use class_weight={index: weight} or weight the data when preprocessing.",
    "validation_data": "Validation data is a dataset, not a parameter; pass the validation "
    "dataset's name to the fit call instead.",
    "validation_split": "dvml does not split the training data; pass a separate validation "
    "dataset to the fit call instead.",
    "x": "The training data is a dataset, not a parameter; pass its name to the fit call.",
    "y": "The training data is a dataset, not a parameter; pass its name to the fit call.",
}


# --------------------------------------------------------------------------- literal parsing


def bracket_depth(text: str) -> int:
    """Deepest bracket nesting of ``text``, counting brackets inside strings too (cheap, safe)."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _guard(text: str, what: str) -> None:
    if len(text) > MAX_LENGTH:
        raise ParameterError(
            f"Too many characters in the {what}: {len(text)}, at most {MAX_LENGTH} are "
            f"accepted. Received: {text[:60]!r}... Pass fewer or shorter parameters."
        )
    depth = bracket_depth(text)
    if depth > MAX_DEPTH:
        raise ParameterError(
            f"Brackets nest too deeply in the {what}: depth {depth}, at most {MAX_DEPTH} is "
            f"accepted. Received: {text[:60]!r}. Flatten the values."
        )


def _parse_call(source: str, shown: str, what: str) -> ast.Call:
    """Parse ``source`` as one call expression without evaluating anything.

    The caller has checked the length and bracket depth with :func:`_guard`; ``shown`` is what
    the user wrote, for messages.
    """
    text = shown
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ParameterError(
            f"Invalid syntax in the {what}: {exc.msg}. Received: {text!r}. "
            "Write comma-separated key=value pairs of literal values, such as "
            '"batch_size=32, epochs=2".'
        ) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ParameterError(
            f"Cannot parse the {what} ({type(exc).__name__}). Received: {text[:60]!r}. "
            "Write comma-separated key=value pairs of literal values."
        ) from None
    if not isinstance(tree.body, ast.Call):
        raise ParameterError(
            f"Cannot read the {what} as key=value pairs. Received: {text!r}. "
            "Check for unbalanced brackets or quotes."
        )
    return tree.body


def _keyword_pairs(
    call: ast.Call, source: str, text: str, what: str, calls: bool = False
) -> list[tuple[str, Any]]:
    if call.args:
        raise ParameterError(
            f"Found a value without a name in the {what}: "
            f"{_snippet(source, call.args[0])}. Received: {text!r}. Every value needs a key, "
            "as in key=value."
        )
    pairs = []
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ParameterError(
                f"Found **-unpacking in the {what}, which is not allowed. Received: {text!r}. "
                "Write every parameter as key=value."
            )
        try:
            value = _literal(keyword.value, depth=0, calls=calls)
        except _Refused as exc:
            raise ParameterError(
                f"Parameter {keyword.arg!r} must be {exc.expected}. Received: {keyword.arg}="
                f"{_snippet(source, keyword.value)} ({exc}). Use strings, numbers, True/False/"
                "None, lists, tuples and dicts only; quote names, as in loss='mse'."
            ) from None
        pairs.append((keyword.arg, value))
    return pairs


def _snippet(source: str, node: ast.AST) -> str:
    segment = ast.get_source_segment(source.strip(), node) or type(node).__name__
    return segment if len(segment) <= 80 else segment[:77] + "..."


def _literal(node: ast.AST, depth: int, calls: bool = False) -> Any:
    """The plain value of ``node``; with ``calls``, also ``Name(key=literal, ...)`` as a _Call.

    A call is only read, never made: its name and literal keyword arguments are kept for the
    key's own check (loss, metrics and optimizer accept known Keras classes; every other check
    refuses a _Call as a value of the wrong type). Calls do not nest.
    """
    if depth > MAX_DEPTH:
        raise _Refused("nested too deeply")
    if isinstance(node, ast.Call) and calls and isinstance(node.func, ast.Name):
        if node.args or any(k.arg is None for k in node.keywords):
            raise _Refused(
                f"a Call of {node.func.id} with positional or ** arguments: write "
                f"{node.func.id}(keyword=value, ...)"
            )
        return _Call(
            node.func.id,
            tuple((k.arg, _literal(k.value, depth + 1)) for k in node.keywords if k.arg),
        )
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = node.operand
        if isinstance(operand, ast.Constant) and _is_real(operand.value):
            value = _constant(operand.value)
            return -value if isinstance(node.op, ast.USub) else value
        raise _Refused("a sign applies to a number only")
    if isinstance(node, ast.List | ast.Tuple):
        items = [_literal(item, depth + 1, calls) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        result: dict[Any, Any] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                raise _Refused("**-unpacking in a dict is not allowed")
            key = _literal(key_node, depth + 1)
            if not isinstance(key, str | int | float | bool | type(None)):
                raise _Refused("a dict key must be a string or a number")
            if key in result:
                raise _Refused(f"dict key {key!r} is given twice")
            result[key] = _literal(value_node, depth + 1)
        return result
    if isinstance(node, ast.Name):
        if node.id.lower() in {"nan", "inf", "infinity"}:
            raise _Refused("numbers must be finite", "a finite number")
        raise _Refused(f"the bare name {node.id} is not a value; put strings in quotes")
    if isinstance(node, ast.JoinedStr):
        raise _Refused("f-strings are not allowed")
    raise _Refused(f"a {type(node).__name__} expression is not a literal")


def _constant(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused("numbers must be finite", "a finite number")
        return value
    raise _Refused(f"{type(value).__name__} values are not allowed")


def _from_python(value: Any, depth: int) -> Any:
    """Normalize a value given in a dict to the plain literals a string would parse into."""
    if depth > MAX_DEPTH:
        raise _Refused("nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise _Refused("numbers must be finite", "a finite number")
        return number
    if isinstance(value, list | tuple):
        items = [_from_python(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping):
        return {_from_python(k, depth + 1): _from_python(v, depth + 1) for k, v in value.items()}
    raise _Refused(f"a {type(value).__name__} is not a plain value")


# --------------------------------------------------------------------------- public parsers


def _did_you_mean(key: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _pairs(value: str | Mapping[str, Any] | None, what: str) -> list[tuple[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        _guard(value, what)
        # The synthetic call: the newline ends a trailing comment before the closing bracket.
        source = f"f({value.strip()}\n)"
        call = _parse_call(source, value, what)
        if not (isinstance(call.func, ast.Name) and call.func.id == "f"):
            raise ParameterError(
                f"Cannot read the {what} as key=value pairs. Received: {value!r}. "
                "Check for unbalanced brackets or quotes."
            )
        return _keyword_pairs(call, source, value, what, calls=True)
    if isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise ParameterError(
                    f"Keys of the {what} must be strings. Received: key {key!r} of type "
                    f"{type(key).__name__}. Use the Keras argument names."
                )
            try:
                pairs.append((key, _from_python(item, depth=0)))
            except _Refused as exc:
                raise ParameterError(
                    f"Parameter {key!r} must be {exc.expected}. Received: {key}={item!r} ({exc}). "
                    "Use strings, numbers, booleans, None, lists, tuples and dicts only."
                ) from None
        return pairs
    raise ParameterError(
        f"The {what} must be given as a string, a dict or None. Received: {type(value).__name__} "
        f'{value!r}. Pass a string such as "batch_size=32, epochs=2".'
    )


def _check_pairs(
    pairs: list[tuple[str, Any]],
    checks: Mapping[str, _Check],
    refused: Mapping[str, str],
    what: str,
) -> dict[str, Any]:
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
                f"{_did_you_mean(key, checks)} Known keys: {sorted(checks)}."
            )
        result[key] = check(key, value)
    return result


def parse_compile_params(
    value: str | Mapping[str, Any] | None, custom_names: Collection[str] | None = None
) -> dict[str, Any]:
    """Parse and check MADlib-style ``compile`` parameters.

    Parameters
    ----------
    value : str, dict or None
        A string such as ``"loss='categorical_crossentropy', optimizer='adam',
        metrics=['accuracy']"``, a dict of the same keys, or None (no parameters). Known keys:
        ``loss``, ``optimizer``, ``metrics``, ``loss_weights``, ``weighted_metrics``,
        ``run_eagerly``, ``steps_per_execution``, ``jit_compile``. The optimizer, the loss
        and each metric may be a tf-keras class with literal keyword arguments, written as a
        call or quoted: ``loss=CategoricalCrossentropy(label_smoothing=0.1)``,
        ``metrics=['accuracy', AUC(name='auc')]``, ``optimizer='SGD(lr=0.01)'``.
    custom_names : collection of str, optional
        Names of the custom losses and metrics the model may use. When given, a plain loss
        or metric name must be a tf-keras one or one of these (as the trainers require);
        when None, any plain name is accepted.

    Returns
    -------
    dict
        The checked values, in the order given. An optimizer, loss or metric given with
        arguments becomes a spec, ``optimizer='SGD(lr=0.01, momentum=0.9)'`` becomes
        ``{"class_name": "SGD", "config": {"learning_rate": 0.01, "momentum": 0.9}}``
        (``lr`` is renamed ``learning_rate``); a plain name such as ``'adam'`` stays a string.
        The losses and metrics for integer labels (``sparse_categorical_crossentropy``,
        ``SparseCategoricalAccuracy``, ...) are refused: dvml's labels are one-hot.

    Raises
    ------
    ParameterError
        On anything that is not a known key with a literal value of the right type, naming
        the key and the value received; on an unknown class or class argument. Nothing in
        the string is ever evaluated.

    Examples
    --------
    >>> parse_compile_params("loss='mse', optimizer='Adam(lr=0.001)'")
    {'loss': 'mse', 'optimizer': {'class_name': 'Adam', 'config': {'learning_rate': 0.001}}}
    >>> parse_compile_params("loss=CategoricalCrossentropy(from_logits=True)")
    {'loss': {'class_name': 'CategoricalCrossentropy', 'config': {'from_logits': True}}}
    """
    what = "compile parameters"
    checks = _COMPILE_CHECKS
    if custom_names is not None:
        names = frozenset(n for n in custom_names if isinstance(n, str))
        checks = {
            **_COMPILE_CHECKS,
            "loss": _loss_check(names),
            "metrics": _metrics_check(names),
            "weighted_metrics": _metrics_check(names),
        }
    return _check_pairs(_pairs(value, what), checks, {}, what)


def parse_fit_params(value: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Parse and check MADlib-style ``fit`` parameters.

    Parameters
    ----------
    value : str, dict or None
        A string such as ``"batch_size=32, epochs=2, verbose=0"``, a dict of the same keys, or
        None. Known keys: ``batch_size``, ``epochs``, ``verbose``, ``shuffle``,
        ``class_weight``, ``steps_per_epoch``, ``validation_steps``, ``validation_freq``,
        ``initial_epoch``, Keras 2's ``sample_weight_mode`` (None or ``'temporal'``, without
        effect) and ``callbacks=[TensorBoard(log_dir='...')]`` (MADlib's one callback; also
        as the text of the list). ``sample_weight``, ``validation_data``,
        ``validation_split``, ``x`` and ``y`` are refused with the reason.

    Returns
    -------
    dict
        The checked values, in the order given.

    Raises
    ------
    ParameterError
        On an unknown, refused or repeated key, a value of the wrong type (``shuffle='False'``
        is a string, not a boolean) or anything that is not a literal.

    Examples
    --------
    >>> parse_fit_params("batch_size=32, epochs=2, verbose=0")
    {'batch_size': 32, 'epochs': 2, 'verbose': 0}
    """
    what = "fit parameters"
    return _check_pairs(_pairs(value, what), _FIT_CHECKS, _FIT_REFUSED, what)


# --------------------------------------------------------------------------- formatting


def _render(value: Any, key: str, depth: int) -> str:
    if depth > MAX_DEPTH:
        raise ParameterError(
            f"Parameter {key!r} nests too deeply to format (at most {MAX_DEPTH} levels). "
            f"Received: {key}={value!r}."
        )
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise _fail(key, "a finite number", value)
        return repr(number)
    if isinstance(value, list):
        return "[" + ", ".join(_render(v, key, depth + 1) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_render(v, key, depth + 1) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, Mapping):
        items = (
            f"{_render(k, key, depth + 1)}: {_render(v, key, depth + 1)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    raise ParameterError(
        f"Parameter {key!r} cannot be written as a literal. Received: {key}={value!r} of type "
        f"{type(value).__name__}. Use strings, numbers, booleans, None, lists, tuples, dicts."
    )


def format_params(params: Mapping[str, Any]) -> str:
    """Render parameters as a MADlib-style string, the inverse of the parsers.

    ``parse_compile_params(format_params(d)) == d`` for every ``d`` that
    :func:`parse_compile_params` returns (and likewise for fit parameters). A structured
    optimizer is written back in its string form, ``optimizer='SGD(learning_rate=0.01)'``; a
    structured loss or metric as a call, ``loss=CategoricalCrossentropy(label_smoothing=0.1)``.

    Parameters
    ----------
    params : dict
        Keys are parameter names, values are plain literals.

    Returns
    -------
    str
        For example ``"batch_size=32, epochs=2"``.

    Raises
    ------
    ParameterError
        When a key is not an identifier or a value has no literal form.
    """
    if not isinstance(params, Mapping):
        raise ParameterError(
            f"Parameters to format must be a dict. Received: {type(params).__name__} "
            f"{params!r}. Pass the dict a parser returned."
        )
    parts = []
    for key, value in params.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ParameterError(
                f"Parameter names must be identifiers. Received: {key!r}. Use the Keras "
                "argument names."
            )
        if key == "optimizer" and isinstance(value, Mapping):
            name = _optimizer_name(key, value.get("class_name"))
            config = value.get("config") or {}
            args = ", ".join(f"{k}={_render(v, key, 1)}" for k, v in config.items())
            value = f"{name}({args})"
        elif key == "loss" and isinstance(value, Mapping):
            parts.append(f"{key}={object_text(value)}")
            continue
        elif (
            key in ("metrics", "weighted_metrics", "callbacks")
            and isinstance(value, list | tuple)
            and any(isinstance(item, Mapping) for item in value)
        ):
            items = [
                object_text(item) if isinstance(item, Mapping) else _render(item, key, 1)
                for item in value
            ]
            parts.append(f"{key}=[{', '.join(items)}]")
            continue
        parts.append(f"{key}={_render(value, key, 0)}")
    return ", ".join(parts)


def params_text(given: str | Mapping[str, Any] | None, parsed: Mapping[str, Any]) -> str:
    """The parameters as the user wrote them, for summaries and tables (MADlib keeps the text).

    A string is kept exactly as given, so a MADlib user's ``WHERE compile_params = $$...$$``
    finds it; a dict (or None) has no text of its own and is written with
    :func:`format_params` from ``parsed``.
    """
    if isinstance(given, str):
        return given
    return format_params(parsed)


def params_key(parsed: Mapping[str, Any]) -> str:
    """The text of parsed parameters with the keys sorted: equal for the same parameters
    written in any key order (MADlib's duplicate test of model selection rows)."""
    return format_params(dict(sorted(parsed.items())))


# --------------------------------------------------------------------------- tf-keras edge


def build_optimizer(spec: str | Mapping[str, Any]) -> Any:
    """Build a tf-keras optimizer from a parsed ``optimizer`` value.

    Starts tf-keras (:mod:`dvml.tf_runtime`); call it inside the distribution
    strategy's scope, where the optimizer's variables must be created.

    Parameters
    ----------
    spec : str or dict
        ``'adam'`` or ``{"class_name": "SGD", "config": {"learning_rate": 0.01}}``.

    Returns
    -------
    tf_keras.optimizers.Optimizer

    Raises
    ------
    ParameterError
        When the spec is invalid or the optimizer refuses one of its arguments.
    """
    checked = _optimizer("optimizer", spec)
    if isinstance(checked, str):
        name, config = _optimizer_name("optimizer", checked), {}
    else:
        name, config = checked["class_name"], checked["config"]

    from dvml import tf_runtime

    keras = tf_runtime.keras()

    config = dict(config)
    decay = config.pop("decay", 0)
    try:
        optimizer = getattr(keras.optimizers, name)(**config)
        if decay:
            # Keras 2's decay: lr / (1 + decay * iterations), tf-keras' InverseTimeDecay.
            lr = float(optimizer.get_config()["learning_rate"])
            schedule = keras.optimizers.schedules.InverseTimeDecay(lr, 1, float(decay))
            optimizer = getattr(keras.optimizers, name)(**{**config, "learning_rate": schedule})
        return optimizer
    except (TypeError, ValueError) as exc:
        raise ParameterError(
            f"Optimizer {name} refused its arguments: {exc}. Received: optimizer={spec!r}. "
            f"Check the arguments {name} accepts in the tf-keras documentation."
        ) from None


def compile_kwargs(
    params: str | Mapping[str, Any] | None,
    custom_objects: Mapping[str, Callable[..., Any]] | None = None,
) -> dict[str, Any]:
    """Turn compile parameters into keyword arguments for a tf-keras ``model.compile``.

    The optimizer is built with :func:`build_optimizer`, a loss or metric spec with its
    tf-keras class; a loss or metric name found in ``custom_objects`` (for example from
    :meth:`dvml.registry.Registry.load_custom_objects`) is replaced by that function. Call it
    inside the distribution strategy's scope.

    Parameters
    ----------
    params : str, dict or None
        Compile parameters, parsed or not; they are checked again.
    custom_objects : dict, optional
        Name to callable, for custom losses and metrics.

    Returns
    -------
    dict
        Ready for ``model.compile(**kwargs)``.
    """
    objects = dict(custom_objects or {})
    kwargs = parse_compile_params(params, custom_names=objects)
    kwargs.pop("sample_weight_mode", None)  # Keras 2's; no sample weights here (no effect)
    if "optimizer" in kwargs:
        kwargs["optimizer"] = build_optimizer(kwargs["optimizer"])

    def build(key: str, module: str, spec: Any) -> Any:
        if isinstance(spec, str):
            return objects.get(spec, spec)
        from dvml import tf_runtime

        keras = tf_runtime.keras()
        name, config = spec["class_name"], spec["config"]
        try:
            return getattr(getattr(keras, module), name)(**config)
        except (TypeError, ValueError) as exc:
            raise ParameterError(
                f"{name} refused its arguments: {exc}. Received: {key}={object_text(spec)}. "
                f"Check the arguments {name} accepts in the tf-keras documentation."
            ) from None

    if kwargs.get("loss") is not None:
        kwargs["loss"] = build("loss", "losses", kwargs["loss"])
    for key in ("metrics", "weighted_metrics"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = [build(key, "metrics", spec) for spec in kwargs[key]]
    return kwargs
