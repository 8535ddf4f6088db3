"""dvml's page on the Dask dashboard: ``<dashboard>/dvml`` and its JSON endpoints.

The scheduler serves them from its own web server (no second server). This package is a
scheduler preload: ``dask scheduler --preload dvml.dashboard`` (a :class:`dvml.LocalCluster`,
``dvml cluster up`` and ``cluster/scheduler.sh`` add it themselves). What the page shows is
built from what the scheduler already holds, by the pure functions of
:mod:`dvml.dashboard.views`: its workers (with each vineyardd's bytes, sent with the workers'
heartbeats by :class:`dvml.cluster.worker_metrics.VineyardMetrics`) and the events dvml logs
on it (datasets published and dropped, each training job's trainers' messages). The handlers
are :mod:`dvml.dashboard.handlers`.
"""

from __future__ import annotations

from typing import Any


def dask_setup(scheduler: Any) -> None:
    """Distributed's preload hook: add dvml's routes to the scheduler's web server."""
    application = getattr(scheduler, "http_application", None)
    if application is None:  # a scheduler without a web server: nothing to serve from
        return
    from dvml.dashboard.handlers import routes

    application.add_handlers(
        ".*$", [(url, cls, {**kwargs, "dask_server": scheduler}) for url, cls, kwargs in routes]
    )
