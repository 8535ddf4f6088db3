"""The ``optimizer`` parameter: tf-keras' optimizers, their arguments checked, and the build.

``optimizer='adam'``, ``optimizer='SGD(lr=0.01, momentum=0.9)'`` (quoted, MADlib's form),
``optimizer=SGD(learning_rate=0.01)`` or ``{"class_name": "SGD", "config": {...}}``: the class
name is looked up in tf-keras' own optimizers (:data:`dvml.configs.keras_objects.OPTIMIZER_CLASSES`)
and every argument checked, so that a trainer never refuses it. Keras 2's ``lr`` is renamed
``learning_rate``; its ``decay`` is built as an inverse-time schedule (:func:`build_optimizer`,
the one function here that starts tf-keras, lazily).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from dvml.configs import keras_objects as ko
from dvml.configs.literals import Call, guard, keyword_pairs, parse_call
from dvml.configs.value_checks import (
    Check,
    any_real,
    did_you_mean,
    fail,
    nonnegative_real,
    nonpositive_real,
    plain_bool,
    positive_int_arg,
    positive_real,
    unit_real,
)
from dvml.exceptions import ParameterError

__all__ = ["OPTIMIZERS", "OPTIMIZER_CONFIG", "build_optimizer", "check_optimizer", "optimizer_name"]


# lower-case name -> the tf-keras class name
OPTIMIZERS = {
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


OPTIMIZER_CONFIG: dict[str, Check] = {
    "learning_rate": positive_real,
    "epsilon": positive_real,
    "momentum": unit_real,
    "beta_1": unit_real,
    "beta_2": unit_real,
    "rho": unit_real,
    "ema_momentum": unit_real,
    "weight_decay": nonnegative_real,
    "clipnorm": nonnegative_real,
    "clipvalue": nonnegative_real,
    "global_clipnorm": nonnegative_real,
    "initial_accumulator_value": nonnegative_real,
    "l1_regularization_strength": nonnegative_real,
    "l2_regularization_strength": nonnegative_real,
    "l2_shrinkage_regularization_strength": nonnegative_real,
    "epsilon_1": nonnegative_real,
    "epsilon_2": nonnegative_real,
    "clip_threshold": nonnegative_real,
    "beta_2_decay": any_real,
    "learning_rate_power": nonpositive_real,
    "nesterov": plain_bool,
    "amsgrad": plain_bool,
    "centered": plain_bool,
    "use_ema": plain_bool,
    "relative_step": plain_bool,
    "ema_overwrite_frequency": positive_int_arg,
    "decay": nonnegative_real,
}
_OPTIMIZER_ALIASES = {"lr": "learning_rate"}
# Keras 2 arguments that MADlib's documentation uses: ``decay`` (every optimizer took it; it is
# built as its inverse-time schedule, :func:`build_optimizer`) and ``epsilon=None`` (Keras 2's
# "the backend's epsilon", tf-keras' default: the argument is dropped).
_KERAS2_ARGUMENTS = ("decay",)


def optimizer_name(key: str, name: Any) -> str:
    """The tf-keras class name of an optimizer name in any case, or a ParameterError."""
    canonical = OPTIMIZERS.get(name.strip().lower()) if isinstance(name, str) else None
    if canonical is None:
        raise fail(key, f"one of the tf-keras optimizers {sorted(OPTIMIZERS.values())}", name)
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
        check = OPTIMIZER_CONFIG.get(arg)
        accepted = [a for a in ko.OPTIMIZER_CLASSES[name] if a in OPTIMIZER_CONFIG]
        accepted += list(_KERAS2_ARGUMENTS)
        if check is None or arg not in accepted:
            known = dict.fromkeys(accepted)
            raise ParameterError(
                f"Unknown optimizer argument {raw_key!r} for {name}, so the trainers would "
                f"refuse it. Received: {raw_key}={value!r}.{did_you_mean(raw_key, known)} "
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


def check_optimizer(key: str, value: Any) -> str | dict[str, Any]:
    """The check of ``optimizer``: a plain name stays a string, arguments make a spec."""
    if isinstance(value, dict):
        unknown = set(value) - {"class_name", "config"}
        config = value.get("config", {})
        if unknown or not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
            raise fail(
                key,
                "a string such as 'adam' or 'SGD(learning_rate=0.01)', or a dict "
                '{"class_name": ..., "config": {...}}',
                value,
            )
        name = optimizer_name(key, value.get("class_name"))
        return {"class_name": name, "config": _optimizer_config(key, name, list(config.items()))}
    if isinstance(value, Call):
        name = optimizer_name(key, value.name)
        return {"class_name": name, "config": _optimizer_config(key, name, list(value.pairs))}
    if not isinstance(value, str) or not value.strip():
        raise fail(key, "a string such as 'adam' or 'SGD(learning_rate=0.01)'", value)
    if "(" not in value:
        optimizer_name(key, value)
        return value
    guard(value, f"{key} spec")
    call = parse_call(value, value, what=f"{key} spec")
    if not isinstance(call.func, ast.Name):
        raise fail(key, "an optimizer name followed by keyword arguments", value)
    name = optimizer_name(key, call.func.id)
    pairs = keyword_pairs(call, value.strip(), value, what=f"{key} spec {name}(...)")
    return {"class_name": name, "config": _optimizer_config(key, name, pairs)}


# ----------------------------------------------------------------- loss and metric objects


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
    checked = check_optimizer("optimizer", spec)
    if isinstance(checked, str):
        name, config = optimizer_name("optimizer", checked), {}
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
