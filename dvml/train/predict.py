"""``dvml.evaluate``, ``dvml.predict`` and ``dvml.predict_byom``: run on the workers.

The workers' tasks run no TensorFlow themselves: each hands its rows to its worker's
inference session of this client (:mod:`dvml.train.inference`), a TensorFlow process of the
trainer runtime that is kept between calls, so the Dask workers stay free of TensorFlow.

Prediction reads every source the preprocessors read: DataFrames, and data in files at a
path or fsspec URL (Parquet/CSV tables, class folders of images, WebDataset shards), each
worker reading its own files. Probabilities are probabilities: a model compiled with a loss
``from_logits=True`` gets the softmax (sigmoid for a binary loss) of its outputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import current_client
from dvml.configs import parse_compile_params
from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError, TrainingError
from dvml.preprocess.locations import locate, read_table
from dvml.preprocess.shards import shard_names
from dvml.preprocess.sources import is_file_source, normalize_x
from dvml.preprocess.string_cells import restore_array_cells
from dvml.registry.database import TRAINED_SUMMARY_KEYS, Registry, opened_registry
from dvml.registry.weights import weights_to_bytes
from dvml.store.datasets import Dataset, buffer_workers, resolve_dataset
from dvml.train import inference
from dvml.train.runtime.sessions import inference_settings
from dvml.train.summary import aggregate, output_names

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["evaluate", "model_spec", "output_activation", "predict", "predict_byom"]

_BINARY_LOSSES = ("BinaryCrossentropy", "BinaryFocalCrossentropy")


def output_activation(compile_params: Any) -> str | None:
    """``"softmax"`` (``"sigmoid"`` for a binary loss) when the compiled loss says the model
    ends in logits (``from_logits=True``); None when its outputs are probabilities already.

    ``compile_params`` is :func:`~dvml.configs.parse_compile_params`' result.
    """
    loss = (compile_params or {}).get("loss") if isinstance(compile_params, dict) else None
    if not isinstance(loss, dict) or not (loss.get("config") or {}).get("from_logits"):
        return None
    return "sigmoid" if loss.get("class_name") in _BINARY_LOSSES else "softmax"


def _digest(weights: bytes, model_json: Any) -> str:
    """What a worker's model cache keys on besides the name: the weights AND the
    architecture (two registries can hold the same id and weights for different models)."""
    h = hashlib.sha256(weights)
    h.update(str(model_json).encode())
    return h.hexdigest()[:16]


def model_spec(registry: Registry, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a worker needs to rebuild a registered model, and the model's summary."""
    entry = registry.get_model(model, require=TRAINED_SUMMARY_KEYS)
    summary = entry["summary"]
    # The model's own copy of its architecture (saved with it); older models read the row.
    arch = {"model_json": summary.get("model_arch")}
    if arch["model_json"] is None:
        arch = registry.get_architecture(entry["arch_id"])

    blob = weights_to_bytes(entry["weights"])
    spec = {
        "key": f"{model}:{entry['version']}:{_digest(blob, arch['model_json'])}",
        "model_json": arch["model_json"],
        "weights": blob,
        "compile_params": parse_compile_params(summary["compile_params"]),
        "custom_objects": registry.custom_function_sources(summary.get("custom_objects", [])),
    }
    spec["output_activation"] = output_activation(spec["compile_params"])
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

    Parameters
    ----------
    model : str
        The registered model's name.
    dataset : str or Dataset
        A packed dataset with the model's class values.
    batch_size : int
        Rows per batch of the pass. Small rows are read up to 16 batches at once (within
        2 MiB of float32 x: ``dvml.placement.metrics_batch.evaluation_batch``); the loss and
        metrics are means over rows, so the batch does not change them.
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).

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
    settings = inference_settings(client.id)
    futures = [
        client.submit(
            inference.evaluate_local,
            ds.name,
            spec_future,
            batch_size,
            settings,
            workers=[workers[i].address],
            allow_other_workers=False,
            pure=False,
        )
        for i in instances
    ]
    values = aggregate([r for r in client.gather(futures) if r["rows"]])
    metrics = {k: v for k, v in values.items() if k != "loss"}
    types = summary.get("metrics_type") or []
    per_output = _per_output_scores(metrics, summary["dependent_varname"], types)
    first = next(iter(per_output.values()), {}) if per_output else {}
    return {
        "loss": values.get("loss"),
        "metric": first.get("metric") if per_output else (metrics.get(types[0]) if types else None),
        "metrics": metrics,
        "metrics_type": types,
        "loss_type": summary.get("loss_type"),
        "rows": sum(b["rows"] for b in ds.layout["buffers"]),
        # a multi-output model: each output's loss and first metric, by dependent variable
        **{f"{dep}_{k}": v for dep, scores in per_output.items() for k, v in scores.items()},
    }


def _per_output_scores(
    metrics: dict[str, float], names: Any, types: list[str]
) -> dict[str, dict[str, float | None]]:
    """``{dependent_varname: {"loss": ..., "metric": ...}}`` of a multi-output model, from
    Keras' per-output keys (``dense_4_loss``, ``dense_4_accuracy``); empty for one output."""
    if isinstance(names, str):
        return {}
    keras = output_names(metrics, len(names)) or []
    return {
        dep: {
            "loss": metrics.get(f"{out}_loss"),
            "metric": metrics.get(f"{out}_{types[0]}") if types else None,
        }
        for dep, out in zip(names, keras, strict=False)
    }


def _predict(
    spec: dict[str, Any],
    data: Any,
    id_col: str | None,
    x: Any,
    pred_type: Any,
    class_values: list[Any],
    normalizing_const: float,
    class_name: str | list[str],
    client: Client,
    files: dict[str, Any],
) -> Any:
    import dask.dataframe as dd
    import pandas as pd

    if pred_type is None:
        pred_type = "prob"  # MADlib's NULL: its own default, every class with its probability
    _check_pred_type(pred_type)
    if is_file_source(data):
        where = locate(data, files["storage_options"], "data")
        if where.kind in ("images", "shards"):
            return _predict_files(
                spec, where, pred_type, class_values, normalizing_const, class_name, client,
                files,
            )  # fmt: skip
        data = read_table(where)
    if id_col is None or x is None:
        raise ArgumentError(
            "id_col= and x= name the id and feature columns of a table. Received: "
            f"id_col={id_col!r}, x={x!r}."
        )
    groups = normalize_x(x)
    if isinstance(data, pd.DataFrame):
        import dask

        with dask.config.set({"dataframe.convert-string": False}):
            data = dd.from_pandas(data, npartitions=max(1, min(len(data) // 500 + 1, 16)))
    if not isinstance(data, dd.DataFrame):
        raise ArgumentTypeError(
            "data must be a pandas or Dask DataFrame, or a path or URL (or a list of them) of "
            f"Parquet/CSV data, an image folder or tar shards. Received: {type(data).__name__}."
        )
    missing = [c for c in [id_col, *(c for g in groups for c in g)] if c not in data.columns]
    if missing:
        raise DataError(
            f"Columns {missing} are missing from data. Available: {list(data.columns)}."
        )
    data = restore_array_cells(data, [c for g in groups for c in g])
    spec_future = _share(client, spec)
    settings = inference_settings(client.id)
    meta = _meta(data._meta[id_col].to_numpy(), class_values, class_name, pred_type)
    parts = [
        client.submit(
            inference.predict_partition,
            part,
            spec_future,
            settings,
            groups,
            id_col,
            float(normalizing_const),
            None if class_values is None else list(class_values),
            class_name,
            pred_type,
            pure=False,
        )
        for part in client.compute(data.to_delayed())
    ]
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def _meta(ids: Any, class_values: list[Any], class_name: str | list[str], pred_type: Any) -> Any:
    import numpy as np

    return inference.format_predictions(ids, np.zeros((0, 1)), class_values, class_name,
                                        pred_type)  # fmt: skip


_IMAGES_PER_TASK = 256


def _predict_files(
    spec: dict[str, Any],
    where: Any,
    pred_type: Any,
    class_values: list[Any],
    normalizing_const: float,
    class_name: str | list[str],
    client: Client,
    files: dict[str, Any],
) -> Any:
    """Predictions of image files or tar shards: one task per shard or per 256 images, each
    reading its files from where they are (ids: paths, or "<shard file name>/<key>")."""
    import dask.dataframe as dd
    import numpy as np

    size = files.get("image_size")
    if size is None:
        raise ArgumentError(
            "image_size=(height, width) is needed to predict images, and the model records "
            f"none. Received: data={where.spec!r}. Pass image_size= (and channels=)."
        )
    image = {
        "size": [int(v) for v in size], "channels": int(files.get("channels") or 3),
        "image_ext": files.get("image_ext"), "label_ext": files.get("label_ext"),
        "storage_options": where.storage_options or None,  # with dvml.storage-timeout
    }  # fmt: skip
    if where.kind == "shards":
        shard_names(where.paths)  # ids are "<shard file name>/<key>": the names must differ
        chunks = [[p] for p in where.paths]
    else:
        chunks = [where.paths[i : i + _IMAGES_PER_TASK]
                  for i in range(0, len(where.paths), _IMAGES_PER_TASK)]  # fmt: skip
    spec_future = _share(client, spec)
    settings = inference_settings(client.id)
    parts = [
        client.submit(
            inference.predict_files,
            where.kind,
            chunk,
            spec_future,
            settings,
            image,
            float(normalizing_const),
            None if class_values is None else list(class_values),
            class_name,
            pred_type,
            pure=False,
        )
        for chunk in chunks
    ]
    meta = _meta(np.array([], dtype=object), class_values, class_name, pred_type)
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def _files_options(
    storage_options: Any, image_ext: Any, label_ext: Any, image_size: Any, channels: Any
) -> dict[str, Any]:
    from dvml import config

    options = config.get("storage-options", storage_options)
    if options is not None and not isinstance(options, dict):
        raise ArgumentTypeError(
            f"storage_options must be a dict of fsspec options. Received: {type(options).__name__}."
        )
    return {"storage_options": dict(options or {}), "image_ext": image_ext,
            "label_ext": label_ext, "image_size": image_size, "channels": channels}  # fmt: skip


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
    id_col: str | None = None,
    x: str | Sequence[Any] | None = None,
    pred_type: Any = "response",
    registry: Registry | str | None = None,
    client: Client | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] | None = None,
) -> Any:
    """Predict raw (not packed) rows with a registered model, on the workers.

    Parameters
    ----------
    model : str
        The registered model.
    data : DataFrame, str or list of str
        A pandas or Dask DataFrame, or any source :func:`dvml.training_preprocessor` reads
        from files (a path or fsspec URL of Parquet/CSV data, a folder of class folders of
        images, WebDataset tar shards), read by the workers.
    id_col, x : str
        The id column and the feature columns of a table. Images need neither: the id of
        an image file is its path; the id of a shard's sample is the shard's file name and
        the sample's key, ``"shard-000003.tar/0042"`` (webdataset's keys repeat from shard to
        shard: the key alone would pair the wrong rows). Two shards of one call with the same
        file name are refused (ArgumentError).
    pred_type : {"response", "prob"}, int, float or None
        ``"response"`` (the top class), ``"prob"`` (every class with its probability), an
        int k (the top k) or a float p (classes with probability >= p). None is MADlib's
        NULL, its default: ``"prob"``. Probabilities are
        probabilities: for a model compiled with a loss ``from_logits=True`` (recorded in its
        summary's compile_params) the softmax of its outputs (the sigmoid for
        ``BinaryCrossentropy``).
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).
    storage_options, image_ext, label_ext : optional
        As for :func:`dvml.training_preprocessor` (shards: the training set's extensions by
        default).

    Returns
    -------
    dask.dataframe.DataFrame
        MADlib's columns ``id, class_name, class_value, prob, rank``. The training set's
        normalization, image size and class values are applied.
    """
    client = current_client(client)
    with opened_registry(registry) as reg:
        spec, summary = model_spec(reg, model)
    files = _files_options(
        storage_options,
        image_ext if image_ext is not None else summary.get("image_ext"),
        label_ext if label_ext is not None else summary.get("label_ext"),
        summary.get("image_size"),
        summary.get("channels"),
    )
    return _predict(
        spec,
        data,
        id_col,
        x,
        pred_type,
        output_classes(summary),
        summary["normalizing_const"],
        summary["dependent_varname"],
        client,
        files,
    )


def output_classes(summary: dict[str, Any]) -> Any:
    """The class values predictions name: the summary's for a single output; for a
    multi-output model one full list per output, as long as the output (class indices for
    labels that came already one-hot encoded, None for padded classes)."""
    if isinstance(summary["dependent_varname"], str):
        return summary["class_values"]
    full = []
    for values, width in zip(summary["class_values"], summary["num_classes"], strict=True):
        named = list(range(int(width))) if values is None else list(values)
        full.append(named + [None] * (int(width) - len(named)))
    return full


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


def byom_outputs(class_values: Any, dependent_count: int | None) -> list[list[Any]] | None:
    """The class values of each output of a multi-output BYOM model (MADlib's
    ``dependent_count`` and 2-D ``class_values``, one list per output), or None for a
    single-output model.

    Without a registered dataset dvml does not know each output's width: a multi-output
    model needs its class values (``None`` is refused).
    """
    nested = (
        isinstance(class_values, Sequence)
        and not isinstance(class_values, str | bytes)
        and len(class_values) > 1
        and all(isinstance(v, list | tuple) for v in class_values)
    )
    count = len(class_values) if nested else 1
    if dependent_count is not None and (
        isinstance(dependent_count, bool) or not isinstance(dependent_count, int)
        or dependent_count < 1
    ):  # fmt: skip
        raise ArgumentError(
            "dependent_count must be a positive int. Received: "
            f"dependent_count={dependent_count!r}."
        )
    if dependent_count is not None and dependent_count != count and dependent_count > 1:
        raise DataError(
            f"dependent_count={dependent_count} needs class_values with one list per output "
            f"({dependent_count} lists). Received: class_values={class_values!r}."
        )
    if not nested:
        return None
    return [list(v) for v in class_values]


def predict_byom(
    arch_id: int,
    data: Any,
    id_col: str | None = None,
    x: str | Sequence[Any] | None = None,
    pred_type: Any = "response",
    class_values: Sequence[Any] | None = None,
    normalizing_const: float = 1.0,
    class_name: str | list[str] = "class",
    registry: Registry | str | None = None,
    client: Client | None = None,
    *,
    dependent_count: int | None = None,
    from_logits: bool = False,
    image_size: tuple[int, int] | None = None,
    channels: int | None = None,
    storage_options: dict[str, Any] | None = None,
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] | None = None,
) -> Any:
    """Predict with a model trained elsewhere: an architecture with its weights (BYOM).

    Parameters
    ----------
    arch_id : int
        A registered architecture with weights (:func:`dvml.load_keras_model`).
    data, id_col, x, pred_type : as for predict
        As for :func:`predict`: a DataFrame or any file source it reads.
    class_values : list, optional
        Names of the model's outputs (default: 0..n-1), flat or in MADlib's 2-D form (one
        list per output, ``[['a', 'b'], ['x', 'y', 'z']]`` for a multi-output model); the
        count must match the model's output size.
    normalizing_const : float
        What the inputs are divided by, as the training preprocessor's.
    class_name : str or list of str
        The ``class_name`` column; a multi-output model's rows default to MADlib's
        ``dependent_var_0``, ``dependent_var_1``, ...
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).
    dependent_count : int, optional
        MADlib's number of outputs of a multi-output model (each input row gives one row
        per output).
    from_logits : bool
        The model ends in logits: its outputs become probabilities (softmax; sigmoid for a
        single output).
    image_size, channels : optional
        Images are resized to ``image_size`` (default: the architecture's input height and
        width) with ``channels`` (default: its input's).
    storage_options, image_ext, label_ext : optional
        As for :func:`predict`.

    Returns
    -------
    dask.dataframe.DataFrame
        MADlib's columns ``id, class_name, class_value, prob, rank``.
    """
    client = current_client(client)
    outputs = byom_outputs(class_values, dependent_count)
    with opened_registry(registry) as reg:
        arch = reg.get_architecture(arch_id)
    if arch["weights"] is None:
        raise TrainingError(
            f"Architecture {arch_id} has no weights to predict with. Load it with "
            "dvml.load_keras_model(model_json, weights=...)."
        )

    n_out = (arch.get("output_shape") or [None])[-1]
    values: Any
    if outputs is None:
        values = byom_class_values(class_values, n_out, arch_id)
    else:
        values = outputs
        if not isinstance(class_name, list):
            class_name = [f"dependent_var_{i}" for i in range(len(outputs))]
        if len(class_name) != len(outputs):
            raise ArgumentError(
                f"class_name names {len(class_name)} outputs but class_values has "
                f"{len(outputs)}. Received: class_name={class_name!r}."
            )
    blob = weights_to_bytes(arch["weights"])
    spec = {
        "key": f"byom:{arch_id}:{_digest(blob, arch['model_json'])}",
        "model_json": arch["model_json"],
        "weights": blob,
        "output_activation": ("sigmoid" if n_out == 1 and outputs is None else "softmax")
        if from_logits
        else None,
    }
    if normalizing_const <= 0:
        raise ArgumentError(f"normalizing_const must be positive. Received: {normalizing_const!r}.")
    shapes = arch.get("input_shapes") or []
    first = list(shapes[0]) if shapes and isinstance(shapes[0], list | tuple) else []
    image_shape = first[-3:] if len(first) >= 3 else []
    files = _files_options(
        storage_options, image_ext, label_ext,
        image_size if image_size is not None else (image_shape[:2] or None),
        channels if channels is not None else (image_shape[2] if image_shape else None),
    )  # fmt: skip
    return _predict(
        spec, data, id_col, x, pred_type, values, normalizing_const, class_name, client, files
    )
