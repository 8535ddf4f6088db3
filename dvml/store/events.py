"""Datasets published and dropped, told to the scheduler (Dask's event log, topic
``dvml-datasets``) for dvml's dashboard page (:mod:`dvml.dashboard`).

Best effort: the publication or drop has happened when these are called, and a scheduler
that cannot take the event must not make it fail.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client

TOPIC = "dvml-datasets"

logger = logging.getLogger(__name__)


def published_event(name: str, kind: str, layout: dict[str, Any]) -> dict[str, Any]:
    """The event of a publication: the dataset's rows and bytes, in all and per worker."""
    workers: dict[str, dict[str, int]] = {}
    for b in layout["buffers"]:
        held = workers.setdefault(str(b["worker_name"]), {"rows": 0, "nbytes": 0})
        held["rows"] += int(b["rows"])
        held["nbytes"] += int(sum(f["nbytes"] for f in b["fields"].values()))
    return {
        "op": "publish",
        "name": name,
        "kind": kind,
        # the version this publication made (dvml.store.versions: each buffer keeps its own)
        "version": max((int(b.get("version") or 1) for b in layout["buffers"]), default=1),
        "rows": sum(w["rows"] for w in workers.values()),
        "nbytes": sum(w["nbytes"] for w in workers.values()),
        "workers": workers,
    }


def log_published(client: Client, name: str, kind: str, layout: dict[str, Any]) -> None:
    _log(client, published_event(name, kind, layout))


def log_dropped(client: Client, name: str) -> None:
    _log(client, {"op": "drop", "name": name})


def _log(client: Client, message: dict[str, Any]) -> None:
    try:
        client.log_event(TOPIC, message)
    except Exception as exc:  # the dashboard misses one event; the data is as it should be
        logger.debug("could not log %s of %r: %s", message["op"], message["name"], exc)
