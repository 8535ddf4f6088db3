"""MADlib-style ``compile`` parameters: parsed and checked, and built for ``model.compile``.

``"loss='categorical_crossentropy', optimizer='SGD(lr=0.01)', metrics=['accuracy']"`` (or a
dict of the same keys) becomes a dict of checked plain values (:func:`parse_compile_params`);
:func:`compile_kwargs`, in a trainer, turns it into tf-keras objects (lazily importing tf-keras).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from dvml.configs.keras_specs import loss_check, metrics_check, object_text
from dvml.configs.literals import read_pairs
from dvml.configs.optimizers import build_optimizer, check_optimizer
from dvml.configs.value_checks import (
    Check,
    bool_value,
    check_pairs,
    loss_weights,
    positive_int,
    sample_weight_mode,
)
from dvml.exceptions import ParameterError

__all__ = ["COMPILE_KEYS", "compile_kwargs", "parse_compile_params"]


_COMPILE_CHECKS: dict[str, Check] = {
    "loss": loss_check(None),
    "optimizer": check_optimizer,
    "metrics": metrics_check(None),
    "loss_weights": loss_weights,
    "weighted_metrics": metrics_check(None),
    "run_eagerly": bool_value,
    "steps_per_execution": positive_int,
    "jit_compile": bool_value,
    "sample_weight_mode": sample_weight_mode,
}

COMPILE_KEYS: tuple[str, ...] = tuple(_COMPILE_CHECKS)
"""The compile keys that :func:`parse_compile_params` accepts."""


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
            "loss": loss_check(names),
            "metrics": metrics_check(names),
            "weighted_metrics": metrics_check(names),
        }
    return check_pairs(read_pairs(value, what), checks, {}, what)


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
