"""Waiting for a condition with a deadline, the one way every test waits."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["poll_for"]


def poll_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Call ``condition`` until it returns True or ``timeout`` seconds pass; return the result.

    Returns False rather than raising, so that a test can ``assert poll_for(...), "why"``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
