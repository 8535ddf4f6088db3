"""A job's models: resolve ``model.architecture``, copy models, decide promotions.

Architectures named by a file or ``builtin:`` are registered once: they are looked up by the
sha256 of their JSON (stored as the architecture's name, ``job:<sha16>``), so a job run again
reuses the id instead of adding a copy each time.

The promotion rule (:func:`is_better`) is pure and unit-tested.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml.examples import digits_cnn_json
from dvml.exceptions import ConfigError, RegistryNotFoundError
from dvml.jobs.schemas import DEFAULT_FIT_PARAMS
from dvml.limits import read_bounded

if TYPE_CHECKING:
    from dvml.registry import Registry

__all__ = [
    "BUILTIN_ARCHITECTURES",
    "architecture_id",
    "best_configuration",
    "copy_model",
    "fit_arguments",
    "is_better",
    "metric_mode",
    "metric_value",
    "resolve_model_section",
]

BUILTIN_ARCHITECTURES = ("builtin:digits-cnn",)


def fit_arguments(section: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`dvml.fit` keyword arguments that a job's model (or head) section sets."""
    return {
        "compile_params": section["compile_params"],
        "fit_params": section["fit_params"] or DEFAULT_FIT_PARAMS,
        "num_iterations": section["num_iterations"],
        "use_gpus": section["use_gpus"],
        "metrics_compute_frequency": section["metrics_compute_frequency"],
        "custom_objects": section["custom_objects"] or None,
    }


def _architecture_json(spec: str, base_dir: str | os.PathLike[str] | None, key: str) -> str:
    if spec.startswith("builtin:"):
        if spec == "builtin:digits-cnn":
            return digits_cnn_json()
        raise ConfigError(
            f"Unknown built-in architecture. Received: {key}={spec!r}. Known: "
            f"{', '.join(BUILTIN_ARCHITECTURES)}, an architecture id, or a Keras JSON file."
        )
    path = os.path.expanduser(spec)
    if not os.path.isabs(path) and base_dir is not None:
        path = os.path.join(os.fspath(base_dir), path)
    try:
        text = read_bounded(path, "architecture file")
    except OSError as exc:
        raise ConfigError(
            f"Cannot read the architecture file {path}: {exc.strerror}. Received: {key}="
            f"{spec!r}. Give an architecture id, builtin:digits-cnn, or the path of a file "
            "written with model.to_json()."
        ) from None
    try:
        json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"The architecture file {path} is not JSON: {exc}. Received: {key}={spec!r}. "
            "Write it with model.to_json()."
        ) from None
    return text


def architecture_id(
    spec: int | str,
    registry: Registry,
    base_dir: str | os.PathLike[str] | None = None,
    key: str = "model.architecture",
) -> int:
    """The registry id of ``spec``: an id (checked), ``builtin:...`` or a JSON file.

    A JSON architecture already registered by a job (same sha256) is reused.
    """
    if isinstance(spec, int):
        registry.get_architecture(spec)  # RegistryNotFoundError names the id
        return spec
    if spec.strip().isdigit():
        return architecture_id(int(spec), registry, base_dir, key)
    model_json = _architecture_json(spec, base_dir, key)
    name = f"job:{hashlib.sha256(model_json.encode()).hexdigest()[:16]}"
    table = registry.list_architectures()
    same = table[table["name"] == name]
    if len(same):
        return int(same["id"].min())
    return registry.add_architecture(model_json, name=name, description=f"from {spec}")


def best_configuration(registry: Registry, model_output: str) -> dict[str, Any]:
    """The best configuration of the stored ``fit_multiple`` run ``model_output``.

    "Best" is :meth:`dvml.ModelSelection.best`'s: the highest final validation metric.

    Returns
    -------
    dict
        The run's info row of that configuration: ``mst_key``, ``model_id`` (the
        architecture id), ``compile_params`` and ``fit_params`` (MADlib strings),
        ``model_name`` and ``validation_metrics_final``.

    Raises
    ------
    ConfigError
        No fit_multiple run of that name, or it has no validation figures to rank by.
    """
    from dvml.exceptions import ArgumentError
    from dvml.train.fit_multiple import ModelSelection

    selection = ModelSelection(model_output, registry)
    try:
        best = selection.best()
    except RegistryNotFoundError as exc:
        raise ConfigError(
            f"model.from_selection names no stored fit_multiple run. Received: "
            f"from_selection={model_output!r} ({exc}). Run `dvml fit-multiple --config ...` "
            "(or dvml.fit_multiple) first, or give the model_output of an existing run."
        ) from exc
    except ArgumentError as exc:
        raise ConfigError(
            f"Cannot pick the best configuration of fit_multiple run {model_output!r}: it was "
            f"trained without a validation set ({exc}). Received: from_selection="
            f"{model_output!r}. Rerun fit_multiple with a validation set."
        ) from exc
    info = selection.info
    row = info[info["model_name"] == best.name].iloc[0]
    return {
        "mst_key": int(row["mst_key"]),
        "model_id": int(row["model_id"]),
        "compile_params": str(row["compile_params"]),
        "fit_params": str(row["fit_params"]),
        "model_name": str(row["model_name"]),
        "validation_metrics_final": float(row["validation_metrics_final"]),
    }


def resolve_model_section(
    section: Mapping[str, Any], registry: Registry, base_dir: str | os.PathLike[str] | None
) -> tuple[dict[str, Any], int, dict[str, Any] | None]:
    """A job's ``model`` section made concrete: (section, architecture id, the selection).

    With ``from_selection`` the section takes the best configuration's architecture,
    compile_params and fit_params (:func:`best_configuration`, returned third); otherwise
    its ``architecture`` is resolved by :func:`architecture_id` and the third item is None.
    """
    if section.get("from_selection"):
        best = best_configuration(registry, section["from_selection"])
        registry.get_architecture(best["model_id"])  # RegistryNotFoundError names the id
        concrete = {
            **section,
            "architecture": best["model_id"],
            "compile_params": best["compile_params"],
            "fit_params": best["fit_params"],
        }
        return concrete, best["model_id"], best
    return dict(section), architecture_id(section["architecture"], registry, base_dir), None


def copy_model(
    registry: Registry, source: str, target: str, extra_summary: Mapping[str, Any] | None = None
) -> int:
    """Copy model ``source`` (weights, summary, iterations) to ``target`` in one transaction.

    ``target`` is replaced when it exists; ``extra_summary`` keys are added to its summary.
    """
    entry = registry.get_model(source)
    summary = dict(entry["summary"] or {})
    summary.update(extra_summary or {})
    if isinstance(summary.get("lineage"), Mapping):  # a warm start from the copy names the source
        copied = {"name": source, "registry_version": entry["version"]}
        summary["lineage"] = {**summary["lineage"], "copied_from": copied}
    history = registry.model_iterations(source)
    iterations = [
        {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
         for k, v in row.items()}
        for row in history.to_dict("records")
    ]  # fmt: skip
    return registry.save_model(
        target, entry["arch_id"], entry["weights"], summary, iterations, replace=True
    )


def model_exists(registry: Registry, name: str) -> bool:
    try:
        return registry.model_exists(name)
    except RegistryNotFoundError:
        return False


def metric_mode(metric: str, mode: str = "auto") -> str:
    """``"min"`` or ``"max"``: ``auto`` means min for losses and errors, max otherwise."""
    if mode in ("min", "max"):
        return mode
    lowered = metric.lower()
    losses = ("loss", "error", "mse", "mae", "crossentropy")
    return "min" if any(word in lowered for word in losses) else "max"


def metric_value(result: Mapping[str, Any], metric: str) -> float:
    """The value of ``metric`` in a :func:`dvml.evaluate` result ("loss" or a metric name)."""
    metrics = result.get("metrics") or {}
    value = result.get("loss") if metric == "loss" else metrics.get(metric)
    if value is None:
        known = ["loss", *sorted(metrics)]
        raise ConfigError(
            f"promotion.metric names a value that evaluate does not compute. Received: "
            f"promotion.metric={metric!r}. Computed: {', '.join(known)}. Use one of them or "
            "add the metric to model.compile_params."
        )
    return float(value)


def is_better(candidate: float, production: float | None, mode: str, min_delta: float) -> bool:
    """Whether ``candidate`` beats ``production`` by more than ``min_delta``.

    There is nothing to beat without a production value; a NaN candidate never wins.
    """
    if math.isnan(candidate):
        return False
    if production is None or math.isnan(production):
        return True
    if mode == "min":
        return candidate < production - min_delta
    return candidate > production + min_delta
