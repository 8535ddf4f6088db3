"""A plan's buffers as plain tuples, checked: what the rebalance, re-pin and row-map plans read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError

__all__ = ["parsed_buffers"]


def parsed_buffers(buffers: Sequence[Mapping[str, Any]]) -> list[tuple[int, str, int, int]]:
    """A plan's buffers as ``(index, worker, rows, nbytes)`` tuples, checked."""
    parsed = []
    for position, b in enumerate(buffers):
        try:
            index, worker, rows = int(b["index"]), str(b["worker"]), int(b["rows"])
            nbytes = int(b.get("nbytes", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArgumentTypeError(
                "Every buffer must be a mapping with 'index', 'worker', 'rows' (and optionally "
                f"'nbytes'). Received at position {position}: {dict(b)!r}."
            ) from exc
        if rows < 0 or nbytes < 0:
            raise ArgumentError(
                f"A buffer's rows and nbytes must be >= 0. Received at position {position}: "
                f"rows={rows}, nbytes={nbytes}."
            )
        parsed.append((index, worker, rows, nbytes))
    return parsed
