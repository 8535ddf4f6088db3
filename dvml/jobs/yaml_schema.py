"""A small schema for YAML job files: load, check and fill defaults, all before anything runs.

A schema is a dict of key → :class:`Field` (a value) or :class:`Section` (a nested dict of
more keys). :func:`validate` walks the document in schema order and stops at the first
problem, raising ONE :class:`~dvml.exceptions.ConfigError` whose message names the file and
the dotted key::

    retrain.yaml: unknown key 'model.fit_parms'. Did you mean 'fit_params'? Known keys under
    'model': architecture, compile_params, fit_params, ... Fix or remove it.

Unknown keys are reported before missing ones (a misspelt key explains the missing one).
Pure: plain values in, plain values out; no Dask, vineyard or TensorFlow.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from typing import Any

from dvml.exceptions import ConfigError
from dvml.limits import read_bounded

__all__ = ["Field", "Section", "describe", "load", "validate"]

Check = Callable[[Any], str | None]
"""Returns what is wrong with a (type-checked) value, or None when it is fine."""

_TYPE_NAMES: dict[type, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}


@dataclasses.dataclass(frozen=True)
class Field:
    """One value of a job file.

    Parameters
    ----------
    accepts : type or tuple of types
        Accepted Python types after YAML parsing (``int`` is accepted where ``float`` is, a
        ``bool`` never counts as a number).
    required : bool
        Whether the key must be given (a ``null`` value counts as not given).
    default : optional
        The value used when the key is absent or ``null``.
    help : str
        One line shown in messages and by :func:`describe`.
    choices : tuple, optional
        The allowed values.
    check : callable, optional
        ``check(value)`` returns a problem text or None.
    """

    accepts: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None
    check: Check | None = None

    @property
    def types(self) -> tuple[type, ...]:
        return self.accepts if isinstance(self.accepts, tuple) else (self.accepts,)


@dataclasses.dataclass(frozen=True)
class Section:
    """A nested mapping of keys; absent or ``null`` means an empty one (defaults filled).

    With ``optional=True`` an absent key gives None, so that its presence is a choice
    (``cluster.local`` starts a cluster; leaving it out does not).

    ``check(section)`` runs on the filled section and returns a problem text or None (for
    rules across keys, such as "give ``scheduler`` or ``local``, not both").
    """

    fields: Mapping[str, Field | Section]
    required: bool = False
    help: str = ""
    check: Check | None = None
    optional: bool = False
    """When True, a section whose key is absent stays None (``local: {}`` is present)."""


Schema = Mapping[str, Field | Section]


def _type_name(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _received(value: Any) -> str:
    return f"{value!r:.80} ({_TYPE_NAMES.get(type(value), type(value).__name__)})"


def _matches(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _error(source: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {message}")


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def validate(data: Any, schema: Schema, source: str = "<config>") -> dict[str, Any]:
    """Check ``data`` (parsed YAML) against ``schema``; return it with defaults filled.

    Parameters
    ----------
    data : Any
        The parsed document; None (an empty file) counts as an empty mapping.
    schema : dict
        Key → :class:`Field` or :class:`Section`.
    source : str
        The file name used in messages.

    Returns
    -------
    dict
        Every schema key present (defaults where not given); ints given for floats are floats.

    Raises
    ------
    ConfigError
        One message naming ``source`` and the dotted key of the first problem.
    """
    return _section(data, Section(schema), "", source)


def _section(data: Any, section: Section, prefix: str, source: str) -> dict[str, Any]:
    where = f"under {prefix!r}" if prefix else "at the top level"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        what = f"{prefix!r} must be" if prefix else "the file must be"
        raise _error(
            source,
            f"{what} a mapping of keys to values. Received: {_received(data)}. Write it as "
            "`key: value` lines.",
        )
    known = list(section.fields)
    for key in data:
        if key not in section.fields:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise _error(
                source,
                f"unknown key {_path(prefix, str(key))!r}.{hint} Known keys {where}: "
                f"{', '.join(known)}. Fix or remove it.",
            )
    result: dict[str, Any] = {}
    for key, spec in section.fields.items():
        path = _path(prefix, key)
        value = data.get(key)
        if isinstance(spec, Section):
            if value is None and spec.required:
                raise _error(source, f"missing required section {path!r} ({spec.help}). Add it.")
            absent = spec.optional and key not in data
            result[key] = None if absent else _section(value, spec, path, source)
        else:
            result[key] = _field(value, spec, path, source)
    if section.check is not None:
        problem = section.check(result)
        if problem:
            raise _error(source, problem.rstrip(".") + ".")
    return result


def _field(value: Any, spec: Field, path: str, source: str) -> Any:
    if value is None:
        if spec.required:
            raise _error(source, f"missing required key {path!r} ({spec.help}). Add `{path}: ...`.")
        return copy.deepcopy(spec.default)  # a list default must not be shared between files
    if not _matches(value, spec.types):
        raise _error(
            source,
            f"{path!r} must be {_type_name(spec.types)}. Received: {path}={_received(value)}. "
            f"Write {_type_name(spec.types)}" + (f" ({spec.help})." if spec.help else "."),
        )
    if isinstance(value, int) and not isinstance(value, bool) and int not in spec.types:
        value = float(value)
    if spec.choices is not None and value not in spec.choices:
        choices = ", ".join(repr(c) for c in spec.choices)
        raise _error(
            source, f"{path!r} must be one of {choices}. Received: {path}={value!r}. Pick one."
        )
    if spec.check is not None:
        problem = spec.check(value)
        if problem:
            raise _error(source, f"{path!r} {problem}. Received: {path}={value!r}.")
    return value


def load(path: str | os.PathLike[str], schema: Schema) -> dict[str, Any]:
    """Read a YAML job file and :func:`validate` it.

    Raises
    ------
    ConfigError
        The file is missing, is not valid YAML, or breaks the schema: one message naming the
        file (and the key).
    """
    import yaml

    name = os.fspath(path)
    try:
        # Bounded: `--config /dev/zero` would otherwise read until the memory runs out.
        text = read_bounded(name, "config file")
    except FileNotFoundError:
        raise ConfigError(
            f"The config file {name} does not exist. Received: --config {name}. Check the path."
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"The config file {name} cannot be read: {exc.strerror}. Check its permissions."
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"{name}: not valid YAML{where}: {problem}. Fix the syntax (indent with spaces, "
            "`key: value`)."
        ) from None
    return validate(data, schema, name)


def describe(schema: Schema, prefix: str = "", indent: int = 0) -> str:
    """The schema as indented text: one line per key with its type, default and help."""
    lines = []
    pad = "  " * indent
    for key, spec in schema.items():
        if isinstance(spec, Section):
            need = " (required)" if spec.required else ""
            lines.append(f"{pad}{key}:{need}  # {spec.help}")
            lines.append(describe(spec.fields, _path(prefix, key), indent + 1))
            continue
        types = "|".join(t.__name__ for t in spec.types)
        extra = "required" if spec.required else f"default {spec.default!r}"
        if spec.choices is not None:
            extra += f"; one of {', '.join(map(repr, spec.choices))}"
        lines.append(f"{pad}{key}: {types} ({extra})  # {spec.help}")
    return "\n".join(lines)
