"""Sending runs to MLflow (the I/O edge of :mod:`dvml.tracking`); MLflow is imported only
when ``tracking.mlflow-uri`` is set."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from dvml import config
from dvml.exceptions import ConfigError
from dvml.tracking.runs import RunPayload

logger = logging.getLogger("dvml.tracking")

# A tracking server that is down must not hold a finished fit for minutes: MLflow's defaults
# retry 7 times with backoff and wait 120 s per request.
_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def tracking_uri() -> str | None:
    """The configured MLflow tracking URI, or None (nothing is logged)."""
    uri = config.get("tracking.mlflow-uri")
    return str(uri) if uri else None


def import_mlflow() -> Any:
    """``mlflow``, or a ConfigError that says how to install it."""
    try:
        import mlflow
    except ImportError:
        raise ConfigError(
            "tracking.mlflow-uri is set but MLflow is not installed. Received: "
            f"tracking.mlflow-uri={tracking_uri()!r}. Install it with `pip install "
            "dvml[mlflow]` (mlflow-skinny), or unset the key."
        ) from None
    return mlflow


@contextlib.contextmanager
def bounded_http() -> Iterator[None]:
    """MLflow's HTTP retries and timeout bounded while inside (the user's settings win)."""
    saved = {k: os.environ.get(k) for k in _HTTP}
    for key, value in _HTTP.items():
        os.environ.setdefault(key, value)  # the user's own settings win
    try:
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                os.environ.pop(key, None)


def client(uri: str) -> Any:
    """An ``MlflowClient`` of ``uri``."""
    return import_mlflow().MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client: Any) -> str:
    """The id of the configured experiment, created when it does not exist."""
    name = str(config.get("tracking.mlflow-experiment"))
    found = mlflow_client.get_experiment_by_name(name)
    return str(found.experiment_id if found is not None else mlflow_client.create_experiment(name))


def log_run(payload: RunPayload, what: str) -> str | None:
    """Log ``payload`` (and its children) when tracking is configured; return the run id.

    A tracking server that fails does not fail the call that trained (its outputs are in the
    registry already): a warning names the server and what was not logged.
    """
    uri = tracking_uri()
    if uri is None:
        return None
    import_mlflow()  # installed, or a ConfigError that says how
    try:
        with bounded_http():
            c = client(uri)
            exp = experiment_id(c)
            run_id = _log_one(c, exp, payload, None)
            for child in payload.children:
                _log_one(c, exp, child, run_id)
    except Exception as exc:
        logger.warning(
            "%s: could not log run %r to MLflow at %s (%s: %s). The outputs are registered; "
            "check the server and tracking.mlflow-uri.",
            what, payload.name, uri, type(exc).__name__, exc,
        )  # fmt: skip
        return None
    return run_id


def _log_one(c: Any, exp: str, payload: RunPayload, parent: str | None) -> str:
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param

    tags = dict(payload.tags)
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    run = c.create_run(exp, run_name=payload.name, tags=tags)
    run_id = str(run.info.run_id)
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v, step in payload.metrics]
    params = [Param(k, v) for k, v in payload.params.items()]
    for start in range(0, len(params), 100):  # MLflow's limits of one batch
        c.log_batch(run_id, params=params[start : start + 100])
    for start in range(0, len(metrics), 1000):
        c.log_batch(run_id, metrics=metrics[start : start + 1000])
    if payload.inputs:
        c.log_inputs(
            run_id,
            [
                DatasetInput(
                    Dataset(d.name, d.digest, "dvml", json.dumps({"dataset": d.name})),
                    [InputTag("mlflow.data.context", d.context)],
                )
                for d in payload.inputs
            ],
        )
    c.log_dict(run_id, _jsonable(payload.summary), "summary.json")
    c.set_terminated(run_id)
    return run_id


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
