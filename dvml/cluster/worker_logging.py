"""Workers do not log again the failures that dvml reports itself.

A task that raises logs a ``distributed.worker - ERROR - Compute Failed`` block (key, task,
exception, traceback) on its worker, and the same error then reaches the caller, where dvml
raises it with its own message: the user saw every expected failure twice, the worker's copy
sometimes in the middle of the next step's output. :class:`QuietDvmlFailures` is a
WorkerPlugin that drops those records when the exception is one of dvml's
(:class:`~dvml.exceptions.DvmlError` and its subclasses); any other exception, a bug, is still
logged by the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dvml.exceptions import DvmlError

__all__ = ["PLUGIN_NAME", "QuietDvmlFailures", "dvml_error_names", "is_reported_failure"]

PLUGIN_NAME = "dvml-quiet-dvml-failures"
_LOGGER = "distributed.worker"


def dvml_error_names() -> set[str]:
    """Class names of DvmlError and every subclass defined so far."""
    names, todo = set(), [DvmlError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def is_reported_failure(msg: Any, args: Any, names: set[str]) -> bool:
    """Whether a log record is distributed's "Compute Failed" for an exception in ``names``.

    ``args[3]`` is the exception's text, ``repr(exception)`` (``"DataError('...')"``): the
    worker logs only that, never the exception object.
    """
    if not isinstance(msg, str) or not msg.startswith("Compute Failed"):
        return False
    if not isinstance(args, tuple) or len(args) < 4:
        return False
    text = str(args[3])
    return text.partition("(")[0].strip() in names


class _Filter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not is_reported_failure(record.msg, record.args, dvml_error_names())


class QuietDvmlFailures(WorkerPlugin):
    """Installed on every worker by :class:`dvml.Cluster` (LocalCluster and ``connect``).

    The scheduler keeps the plugin and installs it on workers that join or restart later.
    """

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self._filter: logging.Filter | None = None

    def setup(self, worker: Any) -> None:
        logger = logging.getLogger(_LOGGER)
        for f in list(logger.filters):  # at most one, whatever registered it before
            if isinstance(f, _Filter):
                logger.removeFilter(f)
        self._filter = _Filter()
        logger.addFilter(self._filter)

    def teardown(self, worker: Any) -> None:
        if self._filter is not None:
            logging.getLogger(_LOGGER).removeFilter(self._filter)
            self._filter = None
