"""What a search leaves to register, built once for every search driver.

A driver (ASHA's, or the one that runs Hyperband's diagonals and hyperopt's batches) keeps
each configuration's history on one :class:`~dvml.train.runtime.hopper.ModelHopper`: per
iteration, its hop records and its evaluations (:data:`dvml.train.hop_schedule.History`),
numbered over the whole search. :func:`build_outcome` turns it into MADlib's tables: one
model per configuration (its fit summary and iteration rows), the ``.info`` rows (MADlib's
columns: metrics concatenated over the search, ``metrics_iters`` counted over the whole
search) and the run summary's common fields. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dvml._version import __version__
from dvml.registry.weights import weights_from_bytes
from dvml.train.hop_schedule import History, build_info, iteration_rows
from dvml.train.params import format_params
from dvml.train.runtime.augment import describe as describe_augment
from dvml.train.runtime.plan import Job
from dvml.train.summary import (
    build_summary,
    class_value_fields,
    madlib_values,
    weights_size_kb,
)

__all__ = ["Configuration", "SearchOutcome", "build_outcome"]


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration as the search trained it."""

    mst_key: int
    model_id: int
    spec: dict[str, Any]
    """:meth:`~dvml.train.runtime.plan.ModelSpec.config`: the parsed parameters."""
    num_iterations: int
    """The iterations it trained in all."""
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The method's own fields of its model's summary."""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The method's own ``.info`` columns (Hyperband's ``s`` and ``i``, ASHA's ``status``)."""


@dataclasses.dataclass
class SearchOutcome:
    """What the search leaves for :func:`dvml.automl` to register."""

    info: dict[int, dict[str, Any]]
    models: list[dict[str, Any]]
    summary: dict[str, Any]
    journal: str
    best: int | None


def build_outcome(
    job: Job,
    model_output: str,
    configurations: Sequence[Configuration],
    history: History,
    weights: dict[int, bytes],
    *,
    times: dict[str, Any],
    journal: str,
    best: int | None,
) -> SearchOutcome:
    """MADlib's ``.info`` rows, every model to register (one per configuration that has
    weights) and the run summary's common fields.

    ``times`` holds ``start`` and ``end`` (ISO text), ``name``, ``description`` and
    ``wall_seconds``.
    """
    configs, names, summaries, seconds, models = [], {}, {}, {}, []
    for c in sorted(configurations, key=lambda c: c.mst_key):
        k = c.mst_key
        names[k] = f"{model_output}_{k}"
        iterations, seconds[k] = iteration_rows(history.get(k, {}))
        final = weights_from_bytes(weights[k]) if weights.get(k) else []
        summaries[k] = _model_summary(job, model_output, c, names[k], iterations, final, times)
        configs.append({"mst_key": k, "model_id": c.model_id})
        if final:
            models.append({"name": names[k], "arch_id": c.model_id, "weights": final,
                           "summary": summaries[k], "iterations": iterations})  # fmt: skip
    own = {c.mst_key: c.info for c in configurations}
    info = {row["mst_key"]: {**row, **own[row["mst_key"]]}
            for row in build_info(configs, names, summaries, seconds)}  # fmt: skip
    return SearchOutcome(info, models, _run_summary(job, history, times), journal, best)


def _model_summary(
    job: Job,
    model_output: str,
    c: Configuration,
    name: str,
    iterations: list[dict[str, Any]],
    final: list[Any],
    times: dict[str, Any],
) -> dict[str, Any]:
    summary = build_summary(
        training=job.train, validation=job.valid, model=name, arch_id=c.model_id,
        compile_params=c.spec["compile_params"], fit_params=c.spec["fit_params"],
        compile_text=format_params(c.spec["compile_params"]),
        fit_text=format_params(c.spec["fit_params"]), num_iterations=c.num_iterations,
        metrics_compute_frequency=job.frequency, name=times["name"],
        description=times["description"], start=times["start"], end=times["end"],
        iterations=iterations, model_size_kb=weights_size_kb(final),
        trainers=[w.name for w in job.workers], weights_identical=True, warm_start=False,
        version=__version__, custom_objects=sorted(job.custom_sources),
    )  # fmt: skip
    summary.update(
        custom_objects=sorted(job.custom_sources), sync="model_hopper", mst_key=c.mst_key,
        model_arch=c.spec["model_json"],  # the model stands on its own (MADlib)
        model_selection=model_output, augment=describe_augment(job.augment), **c.summary,
    )  # fmt: skip
    return summary


def _madlib_run_fields(job: Job) -> dict[str, Any]:
    """MADlib's automl summary columns beside the common ones: ``object_table`` (NULL without
    custom functions), ``use_gpus`` and ``<dependent_varname>_class_values``."""
    ts = job.train.summary
    return {
        "object_table": madlib_values(sorted(job.custom_sources))["object_table"],
        "use_gpus": bool(job.args.use_gpus),
        **class_value_fields(ts),  # MADlib's <dependent_varname>_class_values, per output
    }


def _run_summary(job: Job, history: History, times: dict[str, Any]) -> dict[str, Any]:
    ts = job.train.summary
    pids: dict[str, set[int]] = {}
    for entries in history.values():
        for entry in entries.values():
            for r in entry["records"]:
                pids.setdefault(str(r["worker"]), set()).add(int(r["pid"]))
    return {
        "source_table": job.train.name,
        "validation_table": job.valid.name if job.valid else None,
        "dependent_varname": ts["dependent_varname"],
        "independent_varname": ts["independent_varname"],
        "model_arch_table": "model_arch",
        **_madlib_run_fields(job),
        "metrics_compute_frequency": job.args.metrics_compute_frequency,
        "name": times["name"],
        "description": times["description"],
        "madlib_version": __version__,
        "version": __version__,
        "num_classes": ts["num_classes"],
        "class_values": ts["class_values"],
        "dependent_vartype": ts["dependent_vartype"],
        "normalizing_const": ts["normalizing_const"],
        "workers": [w.name for w in job.workers],
        # every trainer process that trained a model of the search, by worker
        "trainer_pids": {w: sorted(p) for w, p in sorted(pids.items())},
        "model_iterations": sum(len(h) for h in history.values()),
        "wall_seconds": times["wall_seconds"],
    }
