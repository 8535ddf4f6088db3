"""Waiting for a condition with a deadline, the one way every test waits.

The same :func:`poll_for` that dvml itself waits with (it returns False rather than raising, so
that a test can ``assert poll_for(...), "why"``); ``dvml.cluster.processes`` imports only the
standard library, so importing it here keeps this package cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dvml.cluster.processes import poll_for

__all__ = ["poll_for", "poll_until"]


def poll_until(fetch: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fetch()``'s first truthy value within ``timeout`` seconds (asked every 0.2 s); the
    assertion names ``what`` was awaited and the last value seen."""
    found: list[Any] = []
    assert poll_for(lambda: bool(found.append(fetch()) or found[-1]), timeout, 0.2), (
        f"no {what} within {timeout} s; last seen: {found[-1] if found else None!r}"
    )
    return found[-1]
