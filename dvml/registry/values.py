"""Checks and conversions between Python values and registry rows (pure, no database)."""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dvml.exceptions import ArgumentError, ArgumentTypeError

__all__ = [
    "ITERATION_COLUMNS",
    "check_id",
    "check_model_name",
    "check_text",
    "dumps",
    "iteration_rows",
    "loads",
    "now",
    "utc",
]

ITERATION_COLUMNS = (
    "iteration",
    "training_loss",
    "training_metrics",
    "validation_loss",
    "validation_metrics",
    "elapsed_s",
)


def now() -> dt.datetime:
    """The current time in UTC."""
    return dt.datetime.now(dt.UTC)


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """A time read back from the database, as UTC (SQLite drops the zone on the way)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.UTC)


def _json_default(value: Any) -> Any:
    # Keras histories hold numpy scalars; they are plain numbers in JSON.
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    raise ArgumentTypeError(f"a {type(value).__name__} has no JSON form")


def dumps(value: Any, what: str) -> str | None:
    """``value`` as JSON text (None stays None); numpy scalars and arrays become numbers/lists.

    Raises
    ------
    ArgumentTypeError
        Naming ``what`` when a part of the value has no JSON form.
    """
    if value is None:
        return None
    try:
        return json.dumps(value, default=_json_default)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ArgumentTypeError(
            f"{what} must be JSON-serializable: {exc}. Received: {value!r:.200}. Use dicts, "
            "lists, strings, numbers, booleans and None."
        ) from None


def loads(text: str | None) -> Any:
    """The value of JSON text written by :func:`dumps` (None stays None)."""
    return None if text is None else json.loads(text)


def check_model_name(name: Any, what: str = "name") -> str:
    """A model or function name: a non-empty string of at most 255 characters."""
    if not isinstance(name, str):
        raise ArgumentTypeError(
            f"{what} must be a string. Received: {type(name).__name__} {name!r}."
        )
    if not name.strip() or len(name) > 255:
        raise ArgumentError(
            f"{what} must be a non-empty string of at most 255 characters. Received: "
            f"{what}={name[:80]!r} ({len(name)} characters)."
        )
    return name


def check_text(value: Any, what: str, max_length: int | None = None) -> str | None:
    """An optional text field: None or a string no longer than ``max_length``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(
            f"{what} must be a string or None. Received: {type(value).__name__}."
        )
    if max_length is not None and len(value) > max_length:
        raise ArgumentError(
            f"{what} is too long: {len(value)} characters, at most {max_length}. Received: "
            f"{what}={value[:80]!r}..."
        )
    return value


def check_id(value: Any, what: str) -> int:
    """An integer id (numpy integers accepted, booleans refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(
            f"{what} must be an integer id. Received: {type(value).__name__} {value!r}."
        )
    return int(value)


def _optional_float(value: Any, what: str, minimum: float | None = None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{what} must be a number or None. Received: {value!r}.")
    number = float(value)
    if minimum is not None and not (math.isnan(number) or number >= minimum):
        raise ArgumentError(f"{what} must be at least {minimum}. Received: {value!r}.")
    return number


def iteration_rows(iterations: Any) -> list[dict[str, Any]]:
    """Check per-iteration records and turn them into rows of ``model_iterations``.

    Parameters
    ----------
    iterations : list of dict or None
        Each dict has some of ``iteration`` (defaults to its 1-based position),
        ``training_loss``, ``training_metrics`` (dict), ``validation_loss``,
        ``validation_metrics`` (dict) and ``elapsed_s``.

    Raises
    ------
    ArgumentTypeError, ArgumentError
        Naming the record and the key at fault.
    """
    if iterations is None:
        return []
    if isinstance(iterations, str | bytes) or not isinstance(iterations, Sequence):
        raise ArgumentTypeError(
            f"iterations must be a list of dicts. Received: {type(iterations).__name__}."
        )
    rows: list[dict[str, Any]] = []
    seen: set[int] = set()
    for position, record in enumerate(iterations, start=1):
        where = f"iterations[{position - 1}]"
        if not isinstance(record, Mapping):
            raise ArgumentTypeError(f"{where} must be a dict. Received: {type(record).__name__}.")
        unknown = set(record) - set(ITERATION_COLUMNS)
        if unknown:
            raise ArgumentError(
                f"{where} has unknown keys {sorted(map(str, unknown))}. Received: {record!r:.200}."
                f" Known keys: {list(ITERATION_COLUMNS)}."
            )
        iteration = check_id(record.get("iteration", position), f"{where}['iteration']")
        if iteration < 0 or iteration in seen:
            raise ArgumentError(
                f"{where}['iteration'] must be a non-negative number not used by another "
                f"record. Received: iteration={iteration}."
            )
        seen.add(iteration)
        row: dict[str, Any] = {"iteration": iteration}
        for key in ("training_loss", "validation_loss"):
            row[key] = _optional_float(record.get(key), f"{where}[{key!r}]")
        row["elapsed_s"] = _optional_float(record.get("elapsed_s"), f"{where}['elapsed_s']", 0.0)
        for key in ("training_metrics", "validation_metrics"):
            metrics = record.get(key)
            if metrics is not None and not isinstance(metrics, Mapping):
                raise ArgumentTypeError(
                    f"{where}[{key!r}] must be a dict of metric name to value or None. "
                    f"Received: {metrics!r:.200}."
                )
            row[key] = dumps(dict(metrics) if metrics is not None else None, f"{where}[{key!r}]")
        rows.append(row)
    return rows
