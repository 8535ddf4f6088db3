"""Parameters back to text: MADlib's strings from parsed dicts, and the texts a table keeps.

:func:`format_params` is the inverse of the parsers (``parse(format_params(d)) == d``);
:func:`params_text` keeps a string as the user wrote it (MADlib keeps the text, so that a
``WHERE compile_params = $$...$$`` lookup finds it); :func:`params_key` is equal for the same
parameters written in any key order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dvml.configs.keras_specs import object_text
from dvml.configs.literals import render
from dvml.configs.optimizers import optimizer_name
from dvml.exceptions import ParameterError

__all__ = ["format_params", "params_key", "params_text"]


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
            name = optimizer_name(key, value.get("class_name"))
            config = value.get("config") or {}
            args = ", ".join(f"{k}={render(v, key, 1)}" for k, v in config.items())
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
                object_text(item) if isinstance(item, Mapping) else render(item, key, 1)
                for item in value
            ]
            parts.append(f"{key}=[{', '.join(items)}]")
            continue
        parts.append(f"{key}={render(value, key, 0)}")
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
