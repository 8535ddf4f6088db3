"""Models registered, told to the scheduler (Dask's event log, topic ``dvml-models``) for the
"Models" table of dvml's dashboard page (:mod:`dvml.dashboard`): each one with the data that
trained it, as its lineage says (:mod:`dvml.registry.model_lineage`).

Best effort, as :mod:`dvml.store.events`: the model is registered when these are called, and a
scheduler that cannot take the event must not make the job fail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["TOPIC", "log_models_saved", "model_event"]

TOPIC = "dvml-models"

logger = logging.getLogger(__name__)


def _read(data: Any) -> dict[str, Any] | None:
    """A dataset as a lineage records it, cut to what a table row shows."""
    if not isinstance(data, Mapping):
        return None
    return {
        "name": data.get("name"),
        "version": data.get("version"),
        "content_digest": data.get("content_digest"),
    }


def model_event(
    name: str, summary: Mapping[str, Any], at: float, trained_by: str
) -> dict[str, Any]:
    """The event of model ``name``, trained by job ``trained_by`` (``dvml.fit``,
    ``dvml.fit_multiple <output>``, ``dvml.run <name>``), registered with ``summary`` at ``at``
    (pure).

    ``training`` and ``validation`` are ``{"name", "version", "content_digest"}`` of the data
    its lineage records (None where there was none, or for a summary without lineage);
    ``warm_start`` whether it started from the weights of a model of the same name.
    """
    lineage = summary.get("lineage") or {}
    data = lineage.get("data") or {}
    return {
        "op": "save",
        "name": str(name),
        "at": float(at),
        "trained_by": str(trained_by),
        "training": _read(data.get("training")),
        "validation": _read(data.get("validation")),
        "warm_start": bool(lineage.get("warm_start")),
    }


def log_models_saved(
    client: Client, models: Iterable[tuple[str, Mapping[str, Any]]], trained_by: str
) -> None:
    """Tell the scheduler that each ``(name, summary)`` of ``models`` was registered."""
    now = time.time()
    for name, summary in models:
        try:
            client.log_event(TOPIC, model_event(name, summary, now, trained_by))
        except Exception as exc:  # the page misses one model; the registry has it
            logger.debug("could not log the registration of %r: %s", name, exc)
