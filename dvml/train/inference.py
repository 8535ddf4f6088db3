"""Worker-side inference: models cached per worker process, evaluate and predict tasks.

A model is built once per worker process and reused by every task that asks for the same
model version (its key), so evaluation and prediction pay TensorFlow's start-up once.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import numpy as np

from dvml.exceptions import DataError
from dvml.preprocess.encode import normalize, x_to_array
from dvml.registry.weights import weights_from_bytes
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import evaluation_dataset
from dvml.train.params import compile_kwargs
from dvml.train.trainer import custom_objects_from_sources

__all__ = ["evaluate_local", "format_predictions", "model_for", "predict_partition"]

_CACHE: OrderedDict[str, Any] = OrderedDict()
_CACHE_SIZE = 4
CALLS = {"builds": 0}  # how many models this process built (tests count cache hits)


def model_for(spec: dict[str, Any]) -> Any:
    """The compiled tf-keras model of ``spec`` (``key``, ``model_json``, ``weights``...)."""
    model = _CACHE.get(spec["key"])
    if model is not None:
        _CACHE.move_to_end(spec["key"])
        return model
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "" if spec.get("use_gpus") else "-1")
    import tf_keras as keras

    custom = custom_objects_from_sources(spec.get("custom_objects") or {})
    model = keras.models.model_from_json(spec["model_json"], custom_objects=custom)
    if spec.get("weights") is not None:
        model.set_weights(weights_from_bytes(spec["weights"]))
    if spec.get("compile_params"):
        model.compile(**compile_kwargs(spec["compile_params"], custom))
    CALLS["builds"] += 1
    _CACHE[spec["key"]] = model
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return model


def evaluate_local(dataset: str, spec: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Loss and metrics on this worker's local rows of ``dataset`` (rows=0 when none)."""
    parts = open_local(dataset, require=False)
    try:
        if parts.rows == 0:
            return {"rows": 0, "values": {}}
        model = model_for(spec)
        result = model.evaluate(evaluation_dataset(parts, batch_size), verbose=0, return_dict=True)
        return {"rows": parts.rows, "values": {k: float(v) for k, v in result.items()}}
    finally:
        parts.close()


def format_predictions(
    ids: np.ndarray, probs: np.ndarray, class_values: list[Any], class_name: str, pred_type: Any
) -> Any:
    """MADlib's prediction table: id, class_name, class_value, prob, rank.

    ``pred_type``: ``"response"`` (the top class), ``"prob"`` (every class), an int k (the top
    k classes) or a float p in (0, 1] (the classes with probability >= p).
    """
    import pandas as pd

    n, k = probs.shape
    order = np.argsort(-probs, axis=1, kind="stable")
    if pred_type == "response":
        keep = 1
    elif pred_type == "prob":
        keep = k
    elif isinstance(pred_type, int) and not isinstance(pred_type, bool):
        keep = min(pred_type, k)
    else:
        keep = k
    rows_id, rows_value, rows_prob, rows_rank = [], [], [], []
    values = list(class_values) + [None] * (k - len(class_values))  # padded classes
    for i in range(n):
        for rank in range(keep):
            c = order[i, rank]
            p = float(probs[i, c])
            if isinstance(pred_type, float) and p < pred_type:
                break
            rows_id.append(ids[i])
            rows_value.append(values[c])
            rows_prob.append(p)
            rows_rank.append(rank + 1)
    return pd.DataFrame(
        {
            "id": rows_id,
            "class_name": class_name,
            "class_value": rows_value,
            "prob": np.asarray(rows_prob, dtype="float64"),
            "rank": np.asarray(rows_rank, dtype="int64"),
        }
    )


def predict_partition(
    frame: Any,
    spec: dict[str, Any],
    x_groups: list[list[str]],
    id_col: str,
    normalizing_const: float,
    class_values: list[Any],
    class_name: str,
    pred_type: Any,
    batch_size: int = 256,
) -> Any:
    """Predict one raw (unpacked) partition with the training normalization applied."""
    if id_col not in frame.columns:
        raise DataError(f"The id column {id_col!r} is missing. Available: {list(frame.columns)}.")
    if len(frame) == 0:
        return format_predictions(
            np.array([]),
            np.zeros((0, max(1, len(class_values)))),
            class_values,
            class_name,
            pred_type,
        )
    xs = [normalize(x_to_array(frame, group), normalizing_const) for group in x_groups]
    model = model_for(spec)
    probs = model.predict(xs[0] if len(xs) == 1 else xs, batch_size=batch_size, verbose=0)
    return format_predictions(
        frame[id_col].to_numpy(), np.asarray(probs), class_values, class_name, pred_type
    )
