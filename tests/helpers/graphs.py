"""What the Dask scheduler was asked to run: a scheduler plugin that records every new task.

Used to check the pack graph's size against :func:`dvml.placement.routes.pack_graph_size`. The
scheduler of a ``dvml.LocalCluster`` runs in the test process, so the plugin class is importable
there; its records are read back with ``client.run_on_scheduler``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

NAME = "dvml-test-task-recorder"


def _prefix(key: Any) -> str:
    name = key[0] if isinstance(key, tuple) else str(key)
    return re.sub(r"-[0-9a-f]{8,}(-[0-9a-f-]+)?$", "", str(name))


class TaskRecorder:
    """Records the key and worker restrictions of every task that enters the scheduler.

    Once per key: a graph that refers to futures (a task submitted with them as arguments)
    lists their keys again.
    """

    name = NAME

    def __init__(self) -> None:
        self.tasks: list[tuple[str, tuple[str, ...]]] = []
        self.seen: set[Any] = set()

    def update_graph(self, scheduler: Any, *, tasks: Any = (), **kwargs: Any) -> None:
        for key in tasks:
            if key in self.seen:
                continue
            self.seen.add(key)
            ts = scheduler.tasks.get(key)
            workers = tuple(sorted(ts.worker_restrictions or ())) if ts is not None else ()
            self.tasks.append((_prefix(key), workers))


def start_recording(client: Any) -> None:
    """Add a fresh recorder to the scheduler (replacing one of an earlier test)."""
    client.run_on_scheduler(_add)


def _add(dask_scheduler: Any) -> None:
    from distributed.diagnostics.plugin import SchedulerPlugin

    recorder = type("Recorder", (TaskRecorder, SchedulerPlugin), {})()
    dask_scheduler.add_plugin(recorder, name=NAME, idempotent=False)


def _take(dask_scheduler: Any) -> list[tuple[str, tuple[str, ...]]]:
    tasks = list(dask_scheduler.plugins[NAME].tasks)
    dask_scheduler.remove_plugin(name=NAME)
    return tasks


def stop_recording(client: Any) -> list[tuple[str, tuple[str, ...]]]:
    """Remove the recorder; return ``(function name, worker restrictions)`` per task."""
    return client.run_on_scheduler(_take)


def count_by_name(tasks: list[tuple[str, tuple[str, ...]]]) -> Counter[str]:
    return Counter(name for name, _ in tasks)
