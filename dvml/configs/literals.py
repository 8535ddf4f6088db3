"""The safe literal reader under every parameter string: nothing is ever evaluated.

A MADlib-style string (``"batch_size=32, epochs=2"``, ``"SGD(lr=0.01)"``) is bounded in length
and bracket depth (:func:`guard`), parsed with :func:`ast.parse` as the keyword arguments of a
synthetic call (:func:`parse_call`), and only literal nodes are read: strings, finite numbers,
``True``/``False``/``None``, lists, tuples and dicts. Every other node (names, calls, attribute
access, operators, lambdas, f-strings) is refused with a :class:`~dvml.exceptions.ParameterError`.
The one call form read is ``Name(key=literal, ...)`` (a :class:`Call`), which is never made: the
checks of ``optimizer``, ``loss``, ``metrics`` and ``callbacks`` look its name up in fixed lists.
:func:`render` is the way back, a plain value as the literal text that reads as it.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from dvml.configs.value_checks import fail, is_real
from dvml.exceptions import ParameterError

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "Call",
    "Refused",
    "bracket_depth",
    "guard",
    "keyword_pairs",
    "parse_call",
    "read_pairs",
    "render",
]


MAX_LENGTH = 10_000
"""Longest parameter string accepted, in characters."""

MAX_DEPTH = 8
"""Deepest bracket nesting accepted; checked by a cheap scan before the string is parsed."""


@dataclasses.dataclass(frozen=True)
class Call:
    """Internal: ``Name(key=literal, ...)`` as written, not yet checked against any class."""

    name: str
    pairs: tuple[tuple[str, Any], ...]

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.pairs)})"


class Refused(Exception):
    """Internal: a value that is not a plain literal, with the reason and what was expected."""

    def __init__(self, reason: str, expected: str = "a literal value") -> None:
        super().__init__(reason)
        self.expected = expected


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


def guard(text: str, what: str) -> None:
    """Refuse a string longer than :data:`MAX_LENGTH` or nested deeper than :data:`MAX_DEPTH`."""
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


def parse_call(source: str, shown: str, what: str) -> ast.Call:
    """Parse ``source`` as one call expression without evaluating anything.

    The caller has checked the length and bracket depth with :func:`guard`; ``shown`` is what
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


def keyword_pairs(
    call: ast.Call, source: str, text: str, what: str, calls: bool = False
) -> list[tuple[str, Any]]:
    """The ``(key, literal)`` pairs of a parsed call; ``calls`` reads ``Name(k=v)`` values."""
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
        except Refused as exc:
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
    """The plain value of ``node``; with ``calls``, also ``Name(key=literal, ...)`` as a Call.

    A call is only read, never made: its name and literal keyword arguments are kept for the
    key's own check (loss, metrics and optimizer accept known Keras classes; every other check
    refuses a Call as a value of the wrong type). Calls do not nest.
    """
    if depth > MAX_DEPTH:
        raise Refused("nested too deeply")
    if isinstance(node, ast.Call) and calls and isinstance(node.func, ast.Name):
        if node.args or any(k.arg is None for k in node.keywords):
            raise Refused(
                f"a Call of {node.func.id} with positional or ** arguments: write "
                f"{node.func.id}(keyword=value, ...)"
            )
        return Call(
            node.func.id,
            tuple((k.arg, _literal(k.value, depth + 1)) for k in node.keywords if k.arg),
        )
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = node.operand
        if isinstance(operand, ast.Constant) and is_real(operand.value):
            value = _constant(operand.value)
            return -value if isinstance(node.op, ast.USub) else value
        raise Refused("a sign applies to a number only")
    if isinstance(node, ast.List | ast.Tuple):
        items = [_literal(item, depth + 1, calls) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        result: dict[Any, Any] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                raise Refused("**-unpacking in a dict is not allowed")
            key = _literal(key_node, depth + 1)
            if not isinstance(key, str | int | float | bool | type(None)):
                raise Refused("a dict key must be a string or a number")
            if key in result:
                raise Refused(f"dict key {key!r} is given twice")
            result[key] = _literal(value_node, depth + 1)
        return result
    if isinstance(node, ast.Name):
        if node.id.lower() in {"nan", "inf", "infinity"}:
            raise Refused("numbers must be finite", "a finite number")
        raise Refused(f"the bare name {node.id} is not a value; put strings in quotes")
    if isinstance(node, ast.JoinedStr):
        raise Refused("f-strings are not allowed")
    raise Refused(f"a {type(node).__name__} expression is not a literal")


def _constant(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Refused("numbers must be finite", "a finite number")
        return value
    raise Refused(f"{type(value).__name__} values are not allowed")


def _from_python(value: Any, depth: int) -> Any:
    """Normalize a value given in a dict to the plain literals a string would parse into."""
    if depth > MAX_DEPTH:
        raise Refused("nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise Refused("numbers must be finite", "a finite number")
        return number
    if isinstance(value, list | tuple):
        items = [_from_python(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping):
        return {_from_python(k, depth + 1): _from_python(v, depth + 1) for k, v in value.items()}
    raise Refused(f"a {type(value).__name__} is not a plain value")


# --------------------------------------------------------------------------- public parsers


def read_pairs(value: str | Mapping[str, Any] | None, what: str) -> list[tuple[str, Any]]:
    """Parameters given as a string, a dict or None, as ``(key, plain value)`` pairs."""
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        guard(value, what)
        # The synthetic call: the newline ends a trailing comment before the closing bracket.
        source = f"f({value.strip()}\n)"
        call = parse_call(source, value, what)
        if not (isinstance(call.func, ast.Name) and call.func.id == "f"):
            raise ParameterError(
                f"Cannot read the {what} as key=value pairs. Received: {value!r}. "
                "Check for unbalanced brackets or quotes."
            )
        return keyword_pairs(call, source, value, what, calls=True)
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
            except Refused as exc:
                raise ParameterError(
                    f"Parameter {key!r} must be {exc.expected}. Received: {key}={item!r} ({exc}). "
                    "Use strings, numbers, booleans, None, lists, tuples and dicts only."
                ) from None
        return pairs
    raise ParameterError(
        f"The {what} must be given as a string, a dict or None. Received: {type(value).__name__} "
        f'{value!r}. Pass a string such as "batch_size=32, epochs=2".'
    )


def render(value: Any, key: str, depth: int) -> str:
    """``value`` as the literal text that reads back as it (depth-bounded)."""
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
            raise fail(key, "a finite number", value)
        return repr(number)
    if isinstance(value, list):
        return "[" + ", ".join(render(v, key, depth + 1) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(render(v, key, depth + 1) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, Mapping):
        items = (
            f"{render(k, key, depth + 1)}: {render(v, key, depth + 1)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    raise ParameterError(
        f"Parameter {key!r} cannot be written as a literal. Received: {key}={value!r} of type "
        f"{type(value).__name__}. Use strings, numbers, booleans, None, lists, tuples, dicts."
    )
