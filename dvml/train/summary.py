"""Pure pieces of fit: shape checks, metric aggregation over workers, MADlib's summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dvml.configs import format_params
from dvml.exceptions import ModelMismatchError
from dvml.store.versions import dataset_lineage

__all__ = [
    "aggregate",
    "build_summary",
    "check_shapes",
    "class_value_fields",
    "iteration_record",
    "lineage_record",
    "madlib_values",
    "metric_names",
    "output_names",
    "output_series",
    "weights_size_kb",
]


MODEL_TYPE = "madlib_keras"
"""MADlib's ``model_type`` of a Keras model's summary (dvml trains the same kind of model)."""

CUSTOM_OBJECT_TABLE = "custom_functions"
"""What ``object_table`` names when custom functions are used (the registry's table)."""


def madlib_values(custom_objects: Sequence[str] = ()) -> dict[str, Any]:
    """MADlib's ``model_type`` and ``object_table`` (NULL when no custom function is used)."""
    return {
        "model_type": MODEL_TYPE,
        "object_table": CUSTOM_OBJECT_TABLE if custom_objects else None,
    }


def check_shapes(arch: dict[str, Any], dataset_summary: dict[str, Any], dataset: str) -> None:
    """Refuse an architecture whose inputs or outputs do not fit the dataset.

    Shapes the registry could not read from the JSON (None) are not checked here; Keras
    checks them when the trainers build the model.
    """
    x_shapes = [list(s) for s in dataset_summary["x_shapes"]]
    inputs = arch.get("input_shapes")
    if inputs is not None:
        model_shapes = [list(s) for s in inputs]  # without the batch dimension
        if len(model_shapes) != len(x_shapes):
            raise ModelMismatchError(
                f"Architecture {arch['id']} has {len(model_shapes)} inputs but dataset "
                f"{dataset!r} has {len(x_shapes)} x inputs. Received: input shapes "
                f"{model_shapes}, dataset x shapes {x_shapes}."
            )
        for i, (m, d) in enumerate(zip(model_shapes, x_shapes, strict=True)):
            if len(m) != len(d) or any(a is not None and a != b for a, b in zip(m, d, strict=True)):
                raise ModelMismatchError(
                    f"Input {i} of architecture {arch['id']} expects shape {m} but dataset "
                    f"{dataset!r} has x shape {d}. Preprocess with matching shapes or change "
                    "the model's input layer."
                )
    output = arch.get("output_shape")  # None for a model of several outputs
    n_classes = dataset_summary["num_classes"]
    if output is not None and output and output[-1] is not None and output[-1] != n_classes:
        raise ModelMismatchError(
            f"Architecture {arch['id']} outputs {output[-1]} units but dataset {dataset!r} has "
            f"{n_classes} classes (class values {dataset_summary['class_values']}). Make the "
            "last layer match, or preprocess with num_classes."
        )


def weights_size_kb(weights: Sequence[Any]) -> float:
    """MADlib's ``model_size``: the bytes of every weight array, in KB (193 float32: 0.75)."""
    return sum(int(w.nbytes) for w in weights) / 1024


def metric_names(compile_params: dict[str, Any]) -> tuple[list[str], str]:
    """The metric names as Keras reports them, and the loss as it was written."""
    from dvml.configs import object_text, reported_name

    metrics = [reported_name(m) for m in compile_params.get("metrics") or []]
    loss = compile_params.get("loss")
    return metrics, object_text(loss) if isinstance(loss, str | dict) else str(loss)


def aggregate(per_worker: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Combine workers' ``{"rows", "values"}`` into row-weighted means (exact for means)."""
    total = sum(int(p["rows"]) for p in per_worker)
    if total == 0:
        return {}
    keys = per_worker[0]["values"].keys()
    return {k: sum(p["values"][k] * p["rows"] for p in per_worker) / total for k in keys}


def iteration_record(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One iteration's records from every trainer → the registry's iteration row."""
    row: dict[str, Any] = {
        "iteration": records[0]["iteration"],
        "elapsed_s": max(r["elapsed"] for r in records),
    }
    for part in ("training", "validation"):
        found = [r[part] for r in records if part in r]
        if found:
            values = aggregate(found)
            row[f"{part}_loss"] = values.pop("loss", None)
            row[f"{part}_metrics"] = values
    return row


def class_value_fields(dataset_summary: dict[str, Any]) -> dict[str, Any]:
    """MADlib's ``<dependent_varname>_class_values``: one field per output."""
    names = dataset_summary["dependent_varname"]
    if isinstance(names, str):
        return {f"{names}_class_values": dataset_summary["class_values"]}
    return {
        f"{n}_class_values": v for n, v in zip(names, dataset_summary["class_values"], strict=True)
    }


def output_names(metrics: dict[str, Any], n_outputs: int) -> list[str] | None:
    """The Keras names of a multi-output model's outputs, read from its per-output losses
    (``dense_4_loss``, ``dense_5_loss``: Keras reports them in output order), or None."""
    names = [k[: -len("_loss")] for k in metrics if k.endswith("_loss") and k != "loss"]
    return names[:n_outputs] if len(names) >= n_outputs else None


def _first_metric_key(record: dict[str, Any], part: str, metric: str | None) -> str | None:
    """The key of the first compiled metric: ``accuracy``; for several outputs, the first
    output's (``dense_4_accuracy``)."""
    values = record.get(f"{part}_metrics") or {}
    if metric is None or metric in values:
        return metric
    names = output_names(values, 2)
    return f"{names[0]}_{metric}" if names else metric


def output_series(
    evaluated: list[dict[str, Any]],
    dataset_summary: dict[str, Any],
    first_metric: str | None,
    validated: bool,
) -> dict[str, Any]:
    """A multi-output model's loss and first metric per output, per iteration and final:
    ``<dependent_varname>_training_loss``, ``..._training_metrics``, ``..._training_loss_final``,
    ``..._training_metrics_final`` and the same for validation (MADlib's summary has only
    the total ``training_loss``). Nothing for a single-output model."""
    names = dataset_summary["dependent_varname"]
    if isinstance(names, str) or not evaluated:
        return {}
    out: dict[str, Any] = {}
    for part in ("training", "validation"):
        shown = part == "training" or validated
        found = [(r.get(f"{part}_metrics") or {}) for r in evaluated]
        keras = output_names(found[-1], len(names)) if shown else None
        for k, dep in enumerate(names):
            losses = [v.get(f"{keras[k]}_loss") for v in found] if keras else None
            values = (
                [v.get(f"{keras[k]}_{first_metric}") for v in found]
                if keras and first_metric
                else None
            )
            out[f"{dep}_{part}_loss"] = losses
            out[f"{dep}_{part}_metrics"] = values
            out[f"{dep}_{part}_loss_final"] = losses[-1] if losses else None
            out[f"{dep}_{part}_metrics_final"] = values[-1] if values else None
    return out


def _metric_series(
    evaluated: list[dict[str, Any]], first_metric: str | None, validated: bool
) -> dict[str, Any]:
    """MADlib's per-iteration and final training (and validation) losses and first metric
    (of the first output, for a multi-output model)."""
    out: dict[str, Any] = {}
    for part in ("training", "validation"):
        losses = [r.get(f"{part}_loss") for r in evaluated]
        values = [
            (r.get(f"{part}_metrics") or {}).get(_first_metric_key(r, part, first_metric))
            for r in evaluated
        ]
        shown = part == "training" or validated
        # No metric compiled: MADlib's metric columns are NULL, not a list of NULLs.
        measured = shown and first_metric is not None
        out[f"{part}_metrics_final"] = values[-1] if measured and values else None
        out[f"{part}_loss_final"] = losses[-1] if shown and losses else None
        out[f"{part}_metrics"] = values if measured else None
        out[f"{part}_loss"] = losses if shown else None
    return out


def _read(dataset: Any | None) -> dict[str, Any] | None:
    """What a job read of ``dataset`` (a :class:`~dvml.store.datasets.Dataset` resolved
    under the job's lease, so its version is the one the job read); None for no dataset."""
    if dataset is None:
        return None
    layout = getattr(dataset, "layout", None)
    if layout is None:  # not a catalog Dataset: only its name is known
        return {"name": getattr(dataset, "name", str(dataset)), "version": None}
    version = int(getattr(dataset, "version", 1))
    return dataset_lineage(dataset.name, version, layout, getattr(dataset, "versions", []) or [])


def lineage_record(
    *,
    training: Any,
    validation: Any | None,
    model: str,
    arch_id: int,
    compile_params: dict[str, Any],
    fit_params: dict[str, Any],
    version: str,
    warm_start: bool,
) -> dict[str, Any]:
    """A model's lineage as its fit knows it: the data read and the code (pure).

    The registry completes it when it saves the model (:mod:`dvml.registry.model_lineage`): the
    architecture's content hash and, for a warm start, the model it started from.
    """
    return {
        "model": model,
        "data": {"training": _read(training), "validation": _read(validation)},
        "code": {
            "dvml_version": version,
            "architecture_id": int(arch_id),
            "compile_params": format_params(compile_params),
            "fit_params": format_params(fit_params),
        },
        "warm_start": bool(warm_start),
    }


def build_summary(
    *,
    training: Any,
    validation: Any | None,
    model: str,
    arch_id: int,
    compile_params: dict[str, Any],
    fit_params: dict[str, Any],
    compile_text: str,
    fit_text: str,
    num_iterations: int,
    metrics_compute_frequency: int,
    name: str | None,
    description: str | None,
    start: str,
    end: str,
    iterations: list[dict[str, Any]],
    model_size_kb: float,
    trainers: list[str],
    weights_identical: bool,
    warm_start: bool,
    version: str,
    custom_objects: Sequence[str] = (),
) -> dict[str, Any]:
    """Every field of MADlib's ``madlib_keras_fit`` summary table, plus dvml's own.

    ``model_size_kb`` is MADlib's ``model_size``: the kilobytes of the weights themselves
    (:func:`weights_size_kb`), not of their serialized form. ``compile_text`` and
    ``fit_text`` are the parameters as the user wrote them (MADlib keeps the text); the
    parsed forms are kept beside them (``compile_params_parsed``, ``fit_params_parsed``).
    """
    metrics, loss = metric_names(compile_params)
    evaluated = [r for r in iterations if r.get("training_loss") is not None]
    ts = training.summary
    lineage = lineage_record(training=training, validation=validation, model=model,
                             arch_id=arch_id, compile_params=compile_params, fit_params=fit_params,
                             version=version, warm_start=warm_start)  # fmt: skip
    return {
        "source_table": training.name,
        "model": model,
        "dependent_varname": ts["dependent_varname"],
        "independent_varname": ts["independent_varname"],
        "model_arch_table": "model_arch",
        "model_id": arch_id,
        "compile_params": compile_text,
        "fit_params": fit_text,
        "compile_params_parsed": format_params(compile_params),
        "fit_params_parsed": format_params(fit_params),
        "num_iterations": num_iterations,
        "validation_table": validation.name if validation is not None else None,
        **madlib_values(custom_objects),
        "metrics_compute_frequency": metrics_compute_frequency,
        "name": name,
        "description": description,
        "model_size": model_size_kb,
        "start_training_time": start,
        "end_training_time": end,
        "metrics_elapsed_time": [r["elapsed_s"] for r in evaluated],
        "madlib_version": version,  # MADlib's name for the version that trained the model
        "version": version,
        "num_classes": ts["num_classes"],
        **class_value_fields(ts),
        "class_values": ts["class_values"],
        "dependent_vartype": ts["dependent_vartype"],
        "normalizing_const": ts["normalizing_const"],
        "metrics_type": metrics or None,  # MADlib: NULL without metrics
        "loss_type": loss,
        **_metric_series(evaluated, metrics[0] if metrics else None, validation is not None),
        "metrics_iters": [r["iteration"] for r in evaluated],
        **output_series(evaluated, ts, metrics[0] if metrics else None, validation is not None),
        # dvml's own fields
        "x_shapes": ts["x_shapes"],
        "image_size": ts.get("image_size"),
        "channels": ts.get("channels"),
        "training_dataset_id": ts["dataset_id"],
        # the version trained on (dvml.store.versions): the name may have moved on since
        "training_dataset_version": getattr(training, "version", 1),
        "validation_dataset_version": getattr(validation, "version", None),
        "trainers": trainers,
        "weights_identical_on_all_trainers": weights_identical,
        "warm_start": warm_start,
        # which data and code trained the model (dvml.lineage reads it)
        "lineage": lineage,
    }
