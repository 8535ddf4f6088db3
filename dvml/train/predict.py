"""``dvml.evaluate``, ``dvml.predict`` and ``dvml.predict_byom``: run on the workers."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import current_client
from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError, TrainingError
from dvml.preprocess.sources import normalize_x
from dvml.preprocess.string_cells import restore_array_cells
from dvml.registry.database import TRAINED_SUMMARY_KEYS, Registry, opened_registry
from dvml.registry.weights import weights_to_bytes
from dvml.store.datasets import Dataset, buffer_workers, resolve_dataset
from dvml.train import inference
from dvml.train.params import parse_compile_params
from dvml.train.summary import aggregate

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["evaluate", "model_spec", "predict", "predict_byom"]


def model_spec(registry: Registry, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a worker needs to rebuild a registered model, and the model's summary."""
    entry = registry.get_model(model, require=TRAINED_SUMMARY_KEYS)
    arch = registry.get_architecture(entry["arch_id"])
    summary = entry["summary"]

    blob = weights_to_bytes(entry["weights"])
    spec = {
        "key": f"{model}:{entry['version']}:{hashlib.sha256(blob).hexdigest()[:16]}",
        "model_json": arch["model_json"],
        "weights": blob,
        "compile_params": parse_compile_params(summary["compile_params"]),
        "custom_objects": registry.custom_function_sources(summary.get("custom_objects", [])),
    }
    return spec, summary


def _share(client: Client, spec: dict[str, Any]) -> Any:
    """Send a model spec to every worker once, as ONE object.

    ``client.scatter(a_dict)`` would scatter each value under its key ("weights", ...), so two
    calls would share keys and release each other's data.
    """
    return client.scatter([spec], broadcast=True, hash=False)[0]


def evaluate(
    model: str,
    dataset: str | Dataset,
    batch_size: int = 256,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> dict[str, Any]:
    """Loss and metric of a registered model on a packed dataset, computed where it lives.

    Returns
    -------
    dict
        ``loss``, ``metric`` (the first compiled metric), ``metrics`` (all), ``metrics_type``,
        ``loss_type`` and ``rows``.
    """
    client = current_client(client)
    with opened_registry(registry) as reg:
        spec, summary = model_spec(reg, model)
    ds = resolve_dataset(dataset, client)
    if ds.summary["class_values"] != summary["class_values"]:
        raise DataError(
            f"Dataset {ds.name!r} has class values {ds.summary['class_values']} but model "
            f"{model!r} was trained on {summary['class_values']}. Preprocess it with "
            "dvml.validation_preprocessor(..., training=<the model's training set>)."
        )
    # One task per vineyard instance that holds buffers, in instance order.
    live = buffer_workers(client, ds, TrainingError)
    workers = {b["instance_id"]: w for b, w in zip(ds.layout["buffers"], live, strict=True)}
    instances = sorted(workers)
    spec_future = _share(client, spec)
    futures = [
        client.submit(
            inference.evaluate_local,
            ds.name,
            spec_future,
            batch_size,
            workers=[workers[i].address],
            allow_other_workers=False,
            pure=False,
        )
        for i in instances
    ]
    values = aggregate([r for r in client.gather(futures) if r["rows"]])
    metrics = {k: v for k, v in values.items() if k != "loss"}
    types = summary.get("metrics_type") or []
    return {
        "loss": values.get("loss"),
        "metric": metrics.get(types[0]) if types else None,
        "metrics": metrics,
        "metrics_type": types,
        "loss_type": summary.get("loss_type"),
        "rows": sum(b["rows"] for b in ds.layout["buffers"]),
    }


def _predict(
    spec: dict[str, Any],
    data: Any,
    id_col: str,
    x: Any,
    pred_type: Any,
    class_values: list[Any],
    normalizing_const: float,
    class_name: str,
    client: Client,
) -> Any:
    import dask.dataframe as dd
    import pandas as pd

    _check_pred_type(pred_type)
    groups = normalize_x(x)
    if isinstance(data, pd.DataFrame):
        import dask

        with dask.config.set({"dataframe.convert-string": False}):
            data = dd.from_pandas(data, npartitions=max(1, min(len(data) // 500 + 1, 16)))
    if not isinstance(data, dd.DataFrame):
        raise ArgumentTypeError(
            f"data must be a pandas or Dask DataFrame. Received: {type(data).__name__}."
        )
    missing = [c for c in [id_col, *(c for g in groups for c in g)] if c not in data.columns]
    if missing:
        raise DataError(
            f"Columns {missing} are missing from data. Available: {list(data.columns)}."
        )
    data = restore_array_cells(data, [c for g in groups for c in g])
    spec_future = _share(client, spec)
    meta = inference.format_predictions(
        data._meta[id_col].to_numpy(),
        __import__("numpy").zeros((0, 1)),
        class_values,
        class_name,
        pred_type,
    )
    parts = [
        client.submit(
            inference.predict_partition,
            part,
            spec_future,
            groups,
            id_col,
            float(normalizing_const),
            list(class_values),
            class_name,
            pred_type,
            pure=False,
        )
        for part in client.compute(data.to_delayed())
    ]
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def _check_pred_type(pred_type: Any) -> None:
    ok = (
        pred_type in ("response", "prob")
        or (isinstance(pred_type, int) and not isinstance(pred_type, bool) and pred_type >= 1)
        or (isinstance(pred_type, float) and 0.0 < pred_type <= 1.0)
    )
    if not ok:
        raise ArgumentError(
            "pred_type must be 'response', 'prob', an int k >= 1 (top k) or a float p in (0, 1] "
            f"(classes with probability >= p). Received: pred_type={pred_type!r}."
        )


def predict(
    model: str,
    data: Any,
    id_col: str,
    x: str | Sequence[Any],
    pred_type: Any = "response",
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> Any:
    """Predict raw (not packed) rows with a registered model, on the workers.

    The training set's normalization and class values are applied. Returns a Dask DataFrame
    with MADlib's columns ``id, class_name, class_value, prob, rank``.
    """
    client = current_client(client)
    with opened_registry(registry) as reg:
        spec, summary = model_spec(reg, model)
    return _predict(
        spec,
        data,
        id_col,
        x,
        pred_type,
        summary["class_values"],
        summary["normalizing_const"],
        summary["dependent_varname"],
        client,
    )


def byom_class_values(class_values: Any, n_out: int | None, arch_id: int) -> list[Any]:
    """The class names of a BYOM model's outputs, from either of MADlib's forms.

    ``class_values`` is a flat list (``['a', 'b', 'c']``) or MADlib's 2-D form, one list per
    model output (``[['a', 'b', 'c']]``); dvml predicts single-output models, so the 2-D form
    holds exactly one list. None names the outputs 0..n-1. The count must equal the model's
    output size: a shorter or longer list would label rows wrongly.
    """
    if class_values is None:
        return list(range(n_out or 0))
    if isinstance(class_values, str | bytes) or not isinstance(class_values, Sequence):
        raise DataError(
            "class_values must be a list of class names, or MADlib's form with one list per "
            f"model output. Received: {class_values!r}."
        )
    values = list(class_values)
    nested = [isinstance(v, list | tuple) for v in values]
    if any(nested):
        if not all(nested) or len(values) != 1:
            raise DataError(
                "class_values in MADlib's 2-D form must hold one list per model output, and "
                f"architecture {arch_id} has one output. Received {len(values)} entries: "
                f"{class_values!r}. Pass [[name, ...]] or a flat [name, ...]."
            )
        values = list(values[0])
    if n_out is not None and len(values) != n_out:
        raise DataError(
            f"class_values names {len(values)} classes but architecture {arch_id} has {n_out} "
            f"outputs. Received: {class_values!r}. Give one name per output, in output order."
        )
    return values


def predict_byom(
    arch_id: int,
    data: Any,
    id_col: str,
    x: str | Sequence[Any],
    pred_type: Any = "response",
    class_values: Sequence[Any] | None = None,
    normalizing_const: float = 1.0,
    class_name: str = "class",
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> Any:
    """Predict with a model trained elsewhere: an architecture with its weights (BYOM).

    ``class_values`` name the model's outputs (default: 0..n-1), as a flat list or in
    MADlib's 2-D form (one list per output); the count must match the model's output size.
    """
    client = current_client(client)
    with opened_registry(registry) as reg:
        arch = reg.get_architecture(arch_id)
    if arch["weights"] is None:
        raise TrainingError(
            f"Architecture {arch_id} has no weights to predict with. Load it with "
            "dvml.load_keras_model(model_json, weights=...)."
        )

    n_out = (arch.get("output_shape") or [None])[-1]
    values = byom_class_values(class_values, n_out, arch_id)
    blob = weights_to_bytes(arch["weights"])
    spec = {
        "key": f"byom:{arch_id}:{hashlib.sha256(blob).hexdigest()[:16]}",
        "model_json": arch["model_json"],
        "weights": blob,
    }
    if normalizing_const <= 0:
        raise ArgumentError(f"normalizing_const must be positive. Received: {normalizing_const!r}.")
    return _predict(spec, data, id_col, x, pred_type, values, normalizing_const, class_name, client)
