"""Safe parsing of MADlib-style compile and fit parameters.

MADlib users write Keras arguments as one string, for example
``"loss='categorical_crossentropy', optimizer='SGD(lr=0.01, momentum=0.9)', metrics=['accuracy']"``
or ``"batch_size=32, epochs=2, verbose=0"``. This module turns such a string (or a dict) into
a dict of checked plain values and back.

Nothing in a parameter string is ever evaluated. The string is bounded in length and bracket
depth, parsed with :func:`ast.parse` as the keyword arguments of a synthetic call, and only
literal nodes are read: strings, finite numbers, ``True``/``False``/``None``, lists, tuples and
dicts. Every other node (names, calls, attribute access, operators, lambdas, f-strings) is
refused with a :class:`~dvml.exceptions.ParameterError`. The one call form allowed is the
optimizer spec *inside a string*, ``optimizer='SGD(learning_rate=0.01)'``, which is parsed the
same way into ``{"class_name": "SGD", "config": {"learning_rate": 0.01}}``.

The parsers are pure and never import TensorFlow; :func:`build_optimizer` and
:func:`compile_kwargs` import ``tf_keras`` lazily, for the trainer processes.
"""

from __future__ import annotations

import ast
import difflib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from dvml.exceptions import ParameterError

__all__ = [
    "COMPILE_KEYS",
    "FIT_KEYS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "build_optimizer",
    "compile_kwargs",
    "format_params",
    "parse_compile_params",
    "parse_fit_params",
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


def _string_list(key: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise _fail(key, "a list of strings", value, f"Write {key}=[{value!r}].")
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, str) and v.strip() for v in value
    ):
        raise _fail(key, "a list of non-empty strings", value, f"For example {key}=['accuracy'].")
    return list(value)


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
    "learning_rate_power": _any_real,
    "nesterov": _plain_bool,
    "amsgrad": _plain_bool,
    "centered": _plain_bool,
    "use_ema": _plain_bool,
    "relative_step": _plain_bool,
    "ema_overwrite_frequency": _opt_positive_int,
}
_OPTIMIZER_ALIASES = {"lr": "learning_rate"}


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
        check = _OPTIMIZER_CONFIG.get(arg)
        if check is None:
            raise ParameterError(
                f"Unknown optimizer argument {raw_key!r} for {name}. Received: {raw_key}="
                f"{value!r}.{_did_you_mean(raw_key, _OPTIMIZER_CONFIG)} Known arguments: "
                f"{sorted(_OPTIMIZER_CONFIG)}."
            )
        config[arg] = check(f"{name}.{arg}", value)
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


# compile/fit keys whose value may also be None (Keras' own default)
_NULLABLE = frozenset(
    {"run_eagerly", "jit_compile", "steps_per_epoch", "validation_steps", "steps_per_execution"}
)

_COMPILE_CHECKS: dict[str, _Check] = {
    "loss": _string,
    "optimizer": _optimizer,
    "metrics": _string_list,
    "loss_weights": _loss_weights,
    "weighted_metrics": _string_list,
    "run_eagerly": _bool,
    "steps_per_execution": _positive_int,
    "jit_compile": _bool,
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
}

COMPILE_KEYS: tuple[str, ...] = tuple(_COMPILE_CHECKS)
"""The compile keys that :func:`parse_compile_params` accepts."""

FIT_KEYS: tuple[str, ...] = tuple(_FIT_CHECKS)
"""The fit keys that :func:`parse_fit_params` accepts."""

_FIT_REFUSED = {
    "callbacks": "Callbacks are Python objects and cannot be given as parameters; dvml runs its "
    "own callbacks. Remove 'callbacks' from the fit parameters.",
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


def _bracket_depth(text: str) -> int:
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
    depth = _bracket_depth(text)
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


def _keyword_pairs(call: ast.Call, source: str, text: str, what: str) -> list[tuple[str, Any]]:
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
            value = _literal(keyword.value, depth=0)
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


def _literal(node: ast.AST, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _Refused("nested too deeply")
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = node.operand
        if isinstance(operand, ast.Constant) and _is_real(operand.value):
            value = _constant(operand.value)
            return -value if isinstance(node.op, ast.USub) else value
        raise _Refused("a sign applies to a number only")
    if isinstance(node, ast.List | ast.Tuple):
        items = [_literal(item, depth + 1) for item in node.elts]
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
        return _keyword_pairs(call, source, value, what)
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


def parse_compile_params(value: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Parse and check MADlib-style ``compile`` parameters.

    Parameters
    ----------
    value : str, dict or None
        A string such as ``"loss='categorical_crossentropy', optimizer='adam',
        metrics=['accuracy']"``, a dict of the same keys, or None (no parameters). Known keys:
        ``loss``, ``optimizer``, ``metrics``, ``loss_weights``, ``weighted_metrics``,
        ``run_eagerly``, ``steps_per_execution``, ``jit_compile``.

    Returns
    -------
    dict
        The checked values, in the order given. An optimizer given with arguments,
        ``optimizer='SGD(lr=0.01, momentum=0.9)'``, becomes
        ``{"class_name": "SGD", "config": {"learning_rate": 0.01, "momentum": 0.9}}``
        (``lr`` is renamed ``learning_rate``); a plain name such as ``'adam'`` stays a string.
        A loss or metric name is only checked to be a string, so a registered custom
        function's name is accepted.

    Raises
    ------
    ParameterError
        On anything that is not a known key with a literal value of the right type, naming
        the key and the value received. Nothing in the string is ever evaluated.

    Examples
    --------
    >>> parse_compile_params("loss='mse', optimizer='Adam(lr=0.001)'")
    {'loss': 'mse', 'optimizer': {'class_name': 'Adam', 'config': {'learning_rate': 0.001}}}
    """
    what = "compile parameters"
    return _check_pairs(_pairs(value, what), _COMPILE_CHECKS, {}, what)


def parse_fit_params(value: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Parse and check MADlib-style ``fit`` parameters.

    Parameters
    ----------
    value : str, dict or None
        A string such as ``"batch_size=32, epochs=2, verbose=0"``, a dict of the same keys, or
        None. Known keys: ``batch_size``, ``epochs``, ``verbose``, ``shuffle``,
        ``class_weight``, ``steps_per_epoch``, ``validation_steps``, ``validation_freq``,
        ``initial_epoch``. ``callbacks``, ``sample_weight``, ``validation_data``,
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
    optimizer is written back in its string form, ``optimizer='SGD(learning_rate=0.01)'``.

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
        parts.append(f"{key}={_render(value, key, 0)}")
    return ", ".join(parts)


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

    try:
        return getattr(keras.optimizers, name)(**config)
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

    The optimizer is built with :func:`build_optimizer`; a loss or metric name found in
    ``custom_objects`` (for example from :meth:`dvml.registry.Registry.load_custom_objects`)
    is replaced by that function. Call it inside the distribution strategy's scope.

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
    kwargs = parse_compile_params(params)
    objects = dict(custom_objects or {})
    if "optimizer" in kwargs:
        kwargs["optimizer"] = build_optimizer(kwargs["optimizer"])
    if isinstance(kwargs.get("loss"), str):
        kwargs["loss"] = objects.get(kwargs["loss"], kwargs["loss"])
    for key in ("metrics", "weighted_metrics"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = [objects.get(name, name) for name in kwargs[key]]
    return kwargs
