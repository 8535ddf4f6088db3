"""A dvml call running in a thread of the test, for faults injected while it runs."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["Background"]


class Background:
    """``target(seen)`` in a daemon thread: the times ``seen`` was called, its result or error.

    ``seen`` is the callback to pass on (``fit``'s ``on_iteration``); :attr:`first` is set at
    its first call. :meth:`result` waits a bounded time and re-raises the call's error;
    :meth:`error` returns it instead (None when the call succeeded).
    """

    def __init__(self, target: Callable[[Callable[[Any], None]], Any]) -> None:
        self.times: list[float] = []
        self.outcome: dict[str, Any] = {}
        self.first = threading.Event()

        def seen(record: Any = None) -> None:
            self.times.append(time.monotonic())
            self.first.set()

        def run() -> None:
            try:
                self.outcome["result"] = target(seen)
            except BaseException as exc:  # recorded for the test's thread
                self.outcome["error"] = exc
            finally:
                self.outcome["ended"] = time.monotonic()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def error(self, timeout: float = 400) -> BaseException | None:
        """The call's error once it ended (within ``timeout`` seconds), None if it succeeded."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the call did not end within {timeout:.0f}s"
        return self.outcome.get("error")

    def result(self, timeout: float = 400) -> Any:
        error = self.error(timeout)
        if error is not None:
            raise error
        return self.outcome["result"]

    def stack(self) -> str:
        """Where the call is now (its thread's stack), for a failed wait's message."""
        frame = sys._current_frames().get(self.thread.ident or -1)
        return "".join(traceback.format_stack(frame)[-12:]) if frame is not None else "(ended)"
