"""MADlib's output tables of a model-hopper job, built once for every scheduler on it.

``fit_multiple``, Hyperband, hyperopt and ASHA all end the same way: one model per
configuration (its fit summary and iteration rows), MADlib's ``<model_output>_info`` rows and
the run summary's common fields. :func:`build_tables` builds them from what the job trained
(each configuration's :class:`Trained` record, its history and its final weights);
:func:`run_summary` gives the summary fields every run shares, to which each scheduler adds
its own. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dvml._version import __version__
from dvml.configs import format_params
from dvml.registry.weights import weights_from_bytes
from dvml.train.hop_schedule import History, build_info, iteration_rows
from dvml.train.runtime.augment import describe as describe_augment
from dvml.train.runtime.plan import Job
from dvml.train.summary import build_summary, class_value_fields, madlib_values, weights_size_kb

__all__ = ["Tables", "Trained", "build_tables", "run_summary"]


@dataclasses.dataclass(frozen=True)
class Trained:
    """One configuration as the job trained it."""

    mst_key: int
    model_id: int
    spec: Mapping[str, Any]
    """:meth:`~dvml.train.runtime.plan.ModelSpec.config`: the parsed parameters, the arch."""
    num_iterations: int
    """The iterations it trained in all."""
    summary: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The scheduler's own fields of the model's summary (last: they win)."""
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The scheduler's own ``.info`` columns (Hyperband's ``s`` and ``i``, ASHA's ``status``)."""
    texts: tuple[str, str] | None = None
    """The compile and fit parameters as the user wrote them (MADlib keeps the text); None:
    written from ``spec`` (:func:`~dvml.configs.format_params`)."""
    warm_start: bool = False

    def params_texts(self) -> tuple[str, str]:
        """The compile and fit parameters' text for the summary and ``.info``."""
        if self.texts is not None:
            return self.texts
        return format_params(self.spec["compile_params"]), format_params(self.spec["fit_params"])


@dataclasses.dataclass(frozen=True)
class Tables:
    """What to register: the models (one per configuration with weights), the ``.info`` rows
    in mst_key order, and each configuration's model summary."""

    models: list[dict[str, Any]]
    info: list[dict[str, Any]]
    summaries: dict[int, dict[str, Any]]


def model_name(model_output: str, mst_key: int) -> str:
    """The registry name of configuration ``mst_key``'s model: ``f"{model_output}_{mst_key}"``."""
    return f"{model_output}_{int(mst_key)}"


def build_tables(
    job: Job,
    model_output: str,
    trained: Sequence[Trained],
    history: History,
    weights: Mapping[int, bytes],
    times: Mapping[str, Any],
) -> Tables:
    """Every model to register, MADlib's ``.info`` rows and the models' summaries.

    Parameters
    ----------
    job : Job
        The job's datasets, workers and options (:func:`~dvml.train.runtime.plan.place_job`).
    model_output : str
        The run's name; configuration ``k``'s model is ``f"{model_output}_{k}"``.
    trained : sequence of Trained
        Every configuration.
    history : History
        mst_key -> iteration -> ``{"records", "evals"}`` (a configuration missing has none).
    weights : mapping
        mst_key -> final weights (registry bytes). A configuration without weights (its state
        was lost) gets its summary and ``.info`` row but no model.
    times : mapping
        ``start``, ``end`` (ISO text), ``name`` and ``description``.

    Returns
    -------
    Tables
    """
    names, summaries, seconds, models = {}, {}, {}, []
    ordered = sorted(trained, key=lambda t: t.mst_key)
    for t in ordered:
        k = t.mst_key
        names[k] = model_name(model_output, k)
        iterations, seconds[k] = iteration_rows(history.get(k, {}))
        final = weights_from_bytes(weights[k]) if weights.get(k) else []
        summaries[k] = _model_summary(job, model_output, t, names[k], iterations, final, times)
        if final:
            models.append({"name": names[k], "arch_id": t.model_id, "weights": final,
                           "summary": summaries[k], "iterations": iterations})  # fmt: skip
    configs = [{"mst_key": t.mst_key, "model_id": t.model_id} for t in ordered]
    own = {t.mst_key: dict(t.info) for t in ordered}
    info = [{**row, **own[row["mst_key"]]}
            for row in build_info(configs, names, summaries, seconds)]  # fmt: skip
    return Tables(models, info, summaries)


def _model_summary(
    job: Job,
    model_output: str,
    t: Trained,
    name: str,
    iterations: list[dict[str, Any]],
    final: list[Any],
    times: Mapping[str, Any],
) -> dict[str, Any]:
    """MADlib's fit summary of one configuration's model."""
    texts = t.params_texts()
    summary = build_summary(
        training=job.train, validation=job.valid, model=name, arch_id=t.model_id,
        compile_params=t.spec["compile_params"], fit_params=t.spec["fit_params"],
        compile_text=texts[0], fit_text=texts[1], num_iterations=t.num_iterations,
        metrics_compute_frequency=job.frequency, name=times["name"],
        description=times["description"], start=times["start"], end=times["end"],
        iterations=iterations, model_size_kb=weights_size_kb(final),
        trainers=[w.name for w in job.workers], weights_identical=True,
        warm_start=t.warm_start, version=__version__, custom_objects=sorted(job.custom_sources),
    )  # fmt: skip
    summary.update(
        custom_objects=sorted(job.custom_sources), augment=describe_augment(job.augment),
        sync="model_hopper", model_arch=t.spec["model_json"],  # the model stands on its own
        mst_key=t.mst_key, model_selection=model_output, **t.summary,
    )  # fmt: skip
    return summary


def run_summary(job: Job, times: Mapping[str, Any], frequency: int | None) -> dict[str, Any]:
    """The fields of MADlib's run summary that every model-hopper run has.

    ``times`` holds ``name`` and ``description``; ``frequency`` is the
    ``metrics_compute_frequency`` the run reports. The scheduler adds its own fields.
    """
    ts = job.train.summary
    return {
        "source_table": job.train.name,
        "validation_table": job.valid.name if job.valid else None,
        "dependent_varname": ts["dependent_varname"],
        "independent_varname": ts["independent_varname"],
        "model_arch_table": "model_arch",
        "object_table": madlib_values(sorted(job.custom_sources))["object_table"],
        "use_gpus": bool(job.args.use_gpus),
        "metrics_compute_frequency": frequency,
        "name": times["name"],
        "description": times["description"],
        "madlib_version": __version__,
        "version": __version__,
        "num_classes": ts["num_classes"],
        **class_value_fields(ts),  # MADlib's <dependent_varname>_class_values, per output
        "class_values": ts["class_values"],
        "dependent_vartype": ts["dependent_vartype"],
        "normalizing_const": ts["normalizing_const"],
        "workers": [w.name for w in job.workers],
    }
