"""dvml's page and JSON endpoints, served by the Dask scheduler's own web server.

Added by the scheduler preload :mod:`dvml.dashboard`, beside Dask's own pages:

- ``/dvml``: the page (it asks for ``/dvml/api/state.json`` every second and redraws);
- ``/dvml/api/state.json``: everything the page shows (:func:`dvml.dashboard.views.page_state`);
- ``/dvml/api/workers.json``, ``/dvml/api/datasets.json``, ``/dvml/api/jobs.json``,
  ``/dvml/api/hop_jobs.json``, ``/dvml/api/searches.json``, ``/dvml/api/faults.json``: its
  parts.

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
    return page_state(workers, topics, time.time())


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class _JSON(RequestHandler):
    part: str | None = None

    def get(self) -> None:
        state = scheduler_state(self.server)
        body = state if self.part is None else state[self.part]
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(_finite(body), default=str))


class StateJSON(_JSON):
    """Everything the page shows."""


class WorkersJSON(_JSON):
    """Each worker with its vineyardd's bytes and the datasets it holds."""

    part = "workers"


class DatasetsJSON(_JSON):
    """The datasets published on this cluster, with rows and bytes per worker."""

    part = "datasets"


class JobsJSON(_JSON):
    """Training jobs, newest first, with their trainers' step times and the straggler."""

    part = "jobs"


class HopJobsJSON(_JSON):
    """Model-hopper jobs (fit_multiple, the searches) with each model's hops."""

    part = "hop_jobs"


class SearchesJSON(_JSON):
    """ASHA searches: rungs, each trial's state and the best so far."""

    part = "searches"


class FaultsJSON(_JSON):
    """Failed jobs with their error and workers that left a job, newest first."""

    part = "faults"


class Page(RequestHandler):
    """The page: a table each for workers, datasets and jobs, redrawn every second."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(PAGE)


routes: list[tuple[str, Any, dict[str, Any]]] = [
    (PATH, Page, {}),
    (f"{PATH}/", Page, {}),
    (f"{PATH}/api/state.json", StateJSON, {}),
    (f"{PATH}/api/workers.json", WorkersJSON, {}),
    (f"{PATH}/api/datasets.json", DatasetsJSON, {}),
    (f"{PATH}/api/jobs.json", JobsJSON, {}),
    (f"{PATH}/api/hop_jobs.json", HopJobsJSON, {}),
    (f"{PATH}/api/searches.json", SearchesJSON, {}),
    (f"{PATH}/api/faults.json", FaultsJSON, {}),
]
"""The routes, in the form of distributed's ``distributed.scheduler.http.routes`` modules."""
