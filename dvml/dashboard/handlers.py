"""dvml's page and JSON endpoints, served by the Dask scheduler's own web server.

Added by the scheduler preload :mod:`dvml.dashboard`, beside Dask's own pages:

- ``/dvml``: the page (it asks for ``/dvml/api/state.json`` every second and redraws);
- ``/dvml/api/state.json``: everything the page shows (:func:`dvml.dashboard.views.page_state`);
- ``/dvml/api/workers.json``, ``/dvml/api/datasets.json``, ``/dvml/api/jobs.json``,
  ``/dvml/api/hop_jobs.json``, ``/dvml/api/searches.json``, ``/dvml/api/faults.json``,
  ``/dvml/api/models.json``, ``/dvml/api/reservations.json``: its parts.

The handlers read only what the scheduler holds (its workers, their heartbeat metrics, the
events dvml logs): a request costs the scheduler no call to a worker or a daemon.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from distributed.http.utils import RequestHandler

from dvml.dashboard.page import PAGE
from dvml.dashboard.views import page_state

PATH = "/dvml"
"""Where the page is, under the dashboard's address."""


def scheduler_state(scheduler: Any) -> dict[str, Any]:
    """The page's state from a running :class:`distributed.Scheduler` (read on its loop)."""
    from dvml.cluster.worker_metrics import METRIC
    from dvml.train.fit_admission import reservations_on_scheduler

    workers = [
        {
            "name": str(ws.name),
            "address": ws.address,
            "host": ws.host,
            "gpus": int(ws.resources.get("GPU", 0)),
            "vineyard": ws.metrics.get(METRIC),
        }
        for ws in scheduler.workers.values()
    ]
    topics = {
        topic: tuple(events)
        for topic, events in scheduler.get_events().items()
        if topic.startswith("dvml-")
    }
    return page_state(workers, topics, time.time(), reservations_on_scheduler(scheduler))


def running_jobs(dask_scheduler: Any) -> list[dict[str, Any]]:
    """The running fits of the page's state, each with its straggler (read on the
    scheduler's loop, through ``run_on_scheduler``): what ``dvml cluster status`` lists."""
    return [j for j in scheduler_state(dask_scheduler)["jobs"] if j["state"] == "running"]


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def state_json(scheduler: Any, part: str | None = None) -> str:
    """What ``/dvml/api/state.json`` (or ``/dvml/api/<part>.json``) answers, read on the
    scheduler's event loop (benchmark B25 times it there)."""
    state = scheduler_state(scheduler)
    return json.dumps(_finite(state if part is None else state[part]), default=str)


PARTS = (
    "workers", "datasets", "jobs", "hop_jobs", "searches", "faults", "models", "reservations",
)  # fmt: skip
"""The parts of the page's state served alone (``/dvml/api/<part>.json``)."""


class StateJSON(RequestHandler):
    """The page's state as JSON: all of it, or one of :data:`PARTS` (the route's ``part``)."""

    def initialize(self, dask_server: Any = None, part: str | None = None) -> None:
        super().initialize(dask_server=dask_server)
        self.part = part

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(state_json(self.server, self.part))


class Page(RequestHandler):
    """The page: a table each for workers, datasets and jobs, redrawn every second."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(PAGE)


routes: list[tuple[str, Any, dict[str, Any]]] = [
    (PATH, Page, {}),
    (f"{PATH}/", Page, {}),
    (f"{PATH}/api/state.json", StateJSON, {}),
    *((f"{PATH}/api/{part}.json", StateJSON, {"part": part}) for part in PARTS),
]
"""The routes, in the form of distributed's ``distributed.scheduler.http.routes`` modules."""
