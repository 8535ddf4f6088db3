"""Worker-side inference: models cached per worker process, evaluate and predict tasks.

A model is built once per worker process and reused by every task that asks for the same
model version (its key), so evaluation and prediction pay TensorFlow's start-up once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.exceptions import DataError
from dvml.preprocess.encode import normalize, x_to_array
from dvml.preprocess.tasks import decode_tar_shard, prepare_image_files
from dvml.registry.custom import custom_objects_from_sources
from dvml.registry.weights import weights_from_bytes
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import evaluation_dataset
from dvml.train.params import compile_kwargs

__all__ = [
    "evaluate_local",
    "format_predictions",
    "model_for",
    "output_probabilities",
    "predict_files",
    "predict_partition",
]

_CACHE = tf_runtime.ModelCache(4)
CALLS = {"builds": 0}  # how many models this process built (tests count cache hits)


def model_for(spec: dict[str, Any]) -> tuple[Any, str]:
    """The compiled tf-keras model of ``spec`` (``key``, ``model_json``, ``weights``...) and
    the device it runs on (``spec["use_gpus"]``; see :func:`dvml.tf_runtime.start`)."""
    device = tf_runtime.device_for(bool(spec.get("use_gpus")))

    def build() -> Any:
        custom = custom_objects_from_sources(spec.get("custom_objects") or {})
        params = spec.get("compile_params")
        kwargs = compile_kwargs(params, custom) if params else None
        blob = spec.get("weights")
        weights = weights_from_bytes(blob) if blob is not None else None
        with tf_runtime.tensorflow().device(device):
            model = tf_runtime.build_model(spec["model_json"], weights, custom, kwargs)
        CALLS["builds"] += 1
        return model

    # The device is part of the key: a model's variables live where it was built.
    return _CACHE.get((spec["key"], device), build), device


def evaluate_local(dataset: str, spec: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Loss and metrics on this worker's local rows of ``dataset`` (rows=0 when none)."""
    parts = open_local(dataset, require=False)
    try:
        if parts.rows == 0:
            return {"rows": 0, "values": {}}
        model, device = model_for(spec)
        with tf_runtime.tensorflow().device(device):
            data = evaluation_dataset(parts, batch_size)
            result = model.evaluate(data, verbose=0, return_dict=True)
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


def output_probabilities(outputs: np.ndarray, activation: str | None) -> np.ndarray:
    """The model's outputs as probabilities: ``softmax`` or ``sigmoid`` of logits (a model
    compiled with ``from_logits=True``), unchanged when ``activation`` is None."""
    out = np.asarray(outputs, dtype=np.float64)
    if activation == "softmax":
        shifted = out - out.max(axis=-1, keepdims=True)  # no overflow for large logits
        exp = np.exp(shifted)
        return np.asarray(exp / exp.sum(axis=-1, keepdims=True))
    if activation == "sigmoid":
        return np.asarray(1.0 / (1.0 + np.exp(-out)))
    return out


def _predict_arrays(
    ids: Any, xs: list[np.ndarray], spec: dict[str, Any], class_values: list[Any],
    class_name: str, pred_type: Any, batch_size: int,
) -> Any:  # fmt: skip
    model, device = model_for(spec)
    with tf_runtime.tensorflow().device(device):
        outputs = model.predict(xs[0] if len(xs) == 1 else xs, batch_size=batch_size, verbose=0)
    probs = output_probabilities(outputs, spec.get("output_activation"))
    return format_predictions(np.asarray(ids), probs, class_values, class_name, pred_type)


def predict_files(
    kind: str,
    paths: list[str],
    spec: dict[str, Any],
    image: dict[str, Any],
    normalizing_const: float,
    class_values: list[Any],
    class_name: str,
    pred_type: Any,
    batch_size: int = 256,
) -> Any:
    """Predict the images of image files or of one tar shard, read by this worker from where
    they are (``image``: ``size``, ``channels``, ``image_ext``, ``label_ext``,
    ``storage_options``).

    The id of an image file is its path; the id of a shard's sample is its key (webdataset's
    ``__key__``). Labels are not needed.
    """
    size, channels = tuple(image["size"]), int(image["channels"])
    options = image.get("storage_options")
    if kind == "shards":
        ids, images, _ = decode_tar_shard(
            paths[0], size, channels, image.get("image_ext"), image.get("label_ext") or "cls",
            options, require_labels=False,
        )  # fmt: skip
    else:
        ids = list(paths)
        images = prepare_image_files(paths, [""] * len(paths), size, channels, options)["x"][0]
    if len(ids) == 0:
        return format_predictions(
            np.array([]), np.zeros((0, max(1, len(class_values)))), class_values, class_name,
            pred_type,
        )  # fmt: skip
    xs = [normalize(images, normalizing_const)]
    return _predict_arrays(ids, xs, spec, class_values, class_name, pred_type, batch_size)


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
    return _predict_arrays(
        frame[id_col].to_numpy(), xs, spec, class_values, class_name, pred_type, batch_size
    )
