"""Where a trainer's seconds before its first step went, sent as one ``startup`` message."""

from __future__ import annotations

import time
from typing import Any

from dvml.train.runtime import protocol

__all__ = ["MODULE_START", "Startup"]

MODULE_START = time.time()  # wall clock: the launcher's time stamps are from another process


class Startup:
    """Seconds between the steps of a trainer's start, emitted as one ``startup`` line.

    ``launched_at`` is the launcher's wall-clock time when it started the process (or handed
    the job to a standby); each :meth:`mark` records the seconds since the previous one.
    """

    def __init__(self, launched_at: float | None, standby: dict[str, float] | None) -> None:
        self.launched_at = launched_at or MODULE_START
        self.last = self.launched_at
        self.seconds: dict[str, float] = {}
        self.standby = standby

    def mark(self, step: str) -> None:
        now = time.time()
        self.seconds[step] = round(now - self.last, 4)
        self.last = now

    def emit(self) -> None:
        payload: dict[str, Any] = {
            "seconds": self.seconds,
            "total": round(self.last - self.launched_at, 4),
            "standby": self.standby is not None,
        }
        if self.standby is not None:  # paid while the standby waited, not by this job
            payload["standby_imports"] = self.standby
        protocol.emit(protocol.Startup(**payload))

    def first_step_callback(self, keras: Any) -> Any:
        """A callback that marks the end of the first training step and emits the timings."""
        startup = self

        class FirstStep(keras.callbacks.Callback):
            done = False

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if not self.done:
                    self.done = True
                    startup.mark("first_step")
                    startup.emit()

        return FirstStep()
