"""What a dvml run looks like in a tracking server: plain values built from its summary and
info table (pure; :mod:`dvml.tracking.mlflow_client` sends them)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dvml.configs.model_config import COLUMNS

MAX_PARAM_CHARS = 6000
"""MLflow refuses a parameter value longer than this."""

FIT_PARAMS = (
    "model", "model_id", "compile_params", "fit_params", "num_iterations",
    "metrics_compute_frequency", "source_table", "validation_table", "warm_start", "sync",
    "dependent_varname", "independent_varname", "num_classes", "class_values",
    "normalizing_const", "name", "description",
)  # fmt: skip
"""The fit summary's fields logged as parameters (when present)."""

SELECTION_PARAMS = (
    "model_selection_table", "num_iterations", "metrics_compute_frequency", "source_table",
    "validation_table", "warm_start", "automl_method", "automl_params", "random_state",
    "dependent_varname", "independent_varname", "class_values", "name", "description",
)  # fmt: skip
"""A fit_multiple or automl run summary's fields logged as the parent run's parameters."""

CONFIG_PARAMS = (*COLUMNS, "status", "rung")
"""An info row's fields logged as its child run's parameters."""


@dataclasses.dataclass(frozen=True)
class DatasetInput:
    """A dataset a run read: MLflow's dataset input (name, digest, context)."""

    name: str
    digest: str
    context: str  # "training" or "validation"


@dataclasses.dataclass(frozen=True)
class RunPayload:
    """One tracking run: what is logged, and its child runs (one per configuration)."""

    name: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: list[tuple[str, float, int]]  # key, value, step (the iteration)
    inputs: list[DatasetInput]
    summary: dict[str, Any]
    children: list[RunPayload] = dataclasses.field(default_factory=list)


def param_text(value: Any) -> str:
    """A parameter's text as MLflow stores it (at most :data:`MAX_PARAM_CHARS`)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


def per_iteration_metrics(row: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """Every per-iteration series of a summary or info row, at its iterations (``metrics_iters``).

    A series is a list as long as ``metrics_iters`` under a name that ends in ``_loss`` or
    ``_metrics`` (MADlib's ``training_loss``, ``validation_metrics``, a multi-output model's
    ``<dependent_varname>_training_loss`` ...) or ``metrics_elapsed_time``. Missing and
    non-finite values are left out (MLflow has no NaN).
    """
    steps = list(row.get("metrics_iters") or [])
    found = []
    for key, values in row.items():
        if not (key.endswith(("_loss", "_metrics")) or key == "metrics_elapsed_time"):
            continue
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != len(steps):
            continue
        for step, value in zip(steps, values, strict=True):
            if isinstance(value, int | float) and math.isfinite(float(value)):
                found.append((key, float(value), int(step)))
    return found


def _params(summary: Mapping[str, Any], keys: Sequence[str]) -> dict[str, str]:
    return {k: param_text(summary[k]) for k in keys if summary.get(k) is not None}


DIGEST_CHARS = 36
"""Characters of a version's content digest logged to MLflow (its SQL stores keep 36)."""


def dataset_input(
    name: str, version: int | None, content: str | None, fallback: str, context: str
) -> DatasetInput:
    """MLflow's input for one dataset read: named ``<dataset>@v<version>``, with the version's
    content digest (``dvml.store.versions.version_digest``) as its digest, or ``fallback``
    when it has none (a dataset or model from before versions had digests)."""
    label = f"{name}@v{version}" if version is not None else name
    # MLflow's SQL stores keep 36 characters of a digest: the first 36 hex digits of SHA-256
    digest = content[:DIGEST_CHARS] if content else fallback
    return DatasetInput(label, str(digest), context)


def _input(summary: Mapping[str, Any], part: str, table: str) -> DatasetInput:
    """A fit's dataset input, from its summary's lineage; a model saved before lineage was
    recorded falls back to the dataset's id, then its name."""
    read = ((summary.get("lineage") or {}).get("data") or {}).get(part) or {}
    version = read.get("version") or summary.get(f"{part}_dataset_version")
    fallback = summary.get(f"{part}_dataset_id") or summary[table]
    return dataset_input(str(summary[table]), version, read.get("content_digest"), fallback, part)


def _inputs(summary: Mapping[str, Any]) -> list[DatasetInput]:
    found = []
    if summary.get("source_table"):
        found.append(_input(summary, "training", "source_table"))
    if summary.get("validation_table"):
        found.append(_input(summary, "validation", "validation_table"))
    return found


def _tags(kind: str, summary: Mapping[str, Any]) -> dict[str, str]:
    tags = {"dvml.kind": kind, "dvml.version": str(summary.get("version", ""))}
    if summary.get("automl_method"):
        tags["dvml.automl_method"] = str(summary["automl_method"])
    return tags


def fit_run(summary: Mapping[str, Any]) -> RunPayload:
    """A ``dvml.fit``'s run: named after its model."""
    return RunPayload(
        name=str(summary["model"]),
        tags=_tags("fit", summary),
        params=_params(summary, FIT_PARAMS),
        metrics=per_iteration_metrics(summary),
        inputs=_inputs(summary),
        summary=dict(summary),
    )


def selection_run(
    kind: str, model_output: str, summary: Mapping[str, Any], info: Sequence[Mapping[str, Any]]
) -> RunPayload:
    """A ``fit_multiple`` or ``automl`` run (``kind``): a parent run named after its model
    output, and a child per configuration (``<model_output>_<mst_key>``, its info row)."""
    children = [
        RunPayload(
            name=f"{model_output}_{row['mst_key']}",
            tags=_tags(kind, summary),
            params=_params(row, CONFIG_PARAMS),
            metrics=per_iteration_metrics(row),
            inputs=[],
            summary=dict(row),
        )
        for row in info
    ]
    return RunPayload(
        name=model_output,
        tags=_tags(kind, summary),
        params=_params(summary, SELECTION_PARAMS),
        metrics=[],
        inputs=_inputs(summary),
        summary=dict(summary),
        children=children,
    )


def user_run(
    name: str,
    params: Mapping[str, Any],
    inputs: Sequence[DatasetInput],
    history: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
) -> RunPayload:
    """A ``dvml.run``'s run: named after the run, its ``params`` (the call's settings and
    ``config``), every reported metric at its report step, and the ``inputs`` it read
    (:func:`dataset_input`)."""
    metrics = [
        (key, float(value), int(record["step"]))
        for record in history
        for key, value in record.items()
        if key != "step" and isinstance(value, int | float) and math.isfinite(float(value))
    ]
    return RunPayload(
        name=name,
        tags={"dvml.kind": "run", "dvml.version": str(summary.get("version", ""))},
        params={k: param_text(v) for k, v in params.items() if v is not None},
        metrics=metrics,
        inputs=list(inputs),
        summary=dict(summary),
    )
