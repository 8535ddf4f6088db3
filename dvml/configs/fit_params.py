"""MADlib-style ``fit`` parameters: ``"batch_size=32, epochs=2, verbose=0"``, parsed and checked.

Keras' ``fit`` arguments that a parameter string can carry, Keras 2's ``sample_weight_mode``
and MADlib's one callback (``callbacks=[TensorBoard(log_dir='...')]``); the data arguments
(``x``, ``validation_data``, ``sample_weight``, ...) are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dvml.configs.literals import Call, read_pairs
from dvml.configs.value_checks import (
    MAX_INT,
    Check,
    bool_value,
    check_pairs,
    check_that,
    class_weight,
    did_you_mean,
    fail,
    is_int,
    nonnegative_int,
    plain_bool,
    positive_int,
    sample_weight_mode,
    string_value,
    verbose_value,
)
from dvml.exceptions import ParameterError

__all__ = ["FIT_KEYS", "parse_fit_params"]


_nonnegative_int_arg = check_that(lambda v: is_int(v) and 0 <= v <= MAX_INT, "an integer >= 0")
_update_freq = check_that(
    lambda v: v in ("epoch", "batch") or (is_int(v) and 0 < v <= MAX_INT),
    "'epoch', 'batch' or a positive integer",
)
# The callbacks accepted in fit parameters (MADlib 1.18+ supports TensorBoard): their
# arguments and checks. The trainers write each under its log_dir (see callbacks_of).
_CALLBACKS: dict[str, dict[str, Check]] = {
    "TensorBoard": {
        "log_dir": lambda key, value: string_value(key, value),
        "histogram_freq": _nonnegative_int_arg,
        "write_graph": plain_bool,
        "write_images": plain_bool,
        "write_steps_per_second": plain_bool,
        "update_freq": _update_freq,
        "profile_batch": _nonnegative_int_arg,
        "embeddings_freq": _nonnegative_int_arg,
    }
}


def _callback(key: str, item: Any, shown: Any) -> dict[str, Any]:
    if isinstance(item, Call):
        name, pairs = item.name, list(item.pairs)
    elif isinstance(item, Mapping) and isinstance(item.get("class_name"), str):
        name, pairs = item["class_name"], list((item.get("config") or {}).items())
    else:
        raise fail(key, "a list of callbacks such as [TensorBoard(log_dir='/tmp/logs')]", shown)
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
                f"{did_you_mean(str(arg), known)} Accepted: {list(known)}."
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
        [(_, value)] = read_pairs(f"{key}={value.strip()}", f"{key} value")
    items = value if isinstance(value, list | tuple) else [value]
    return [_callback(key, item, shown) for item in items]


_FIT_CHECKS: dict[str, Check] = {
    "batch_size": positive_int,
    "epochs": positive_int,
    "verbose": verbose_value,
    "shuffle": bool_value,
    "class_weight": class_weight,
    "steps_per_epoch": positive_int,
    "validation_steps": positive_int,
    "validation_freq": positive_int,
    "initial_epoch": nonnegative_int,
    "sample_weight_mode": sample_weight_mode,
    "callbacks": _callbacks,
}

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
    return check_pairs(read_pairs(value, what), _FIT_CHECKS, _FIT_REFUSED, what)


# --------------------------------------------------------------------------- formatting
