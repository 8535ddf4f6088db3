"""Worker-side inference tasks: evaluate and predict WITHOUT TensorFlow in the Dask worker.

Each task hands its work to its worker's *inference session* of the calling client
(:func:`dvml.train.runtime.sessions.infer`): a serving trainer process of the runtime that
holds TensorFlow already (the trainer of the client's fit that just ended on this worker, else
the worker's warm standby) and keeps the client's models compiled between calls. A Dask
worker process never imports TensorFlow, so its memory stays what it was before the job.

- evaluate: the trainer resolves the worker's LOCAL partitions of the packed dataset itself
  (zero-copy, as for training); only the loss and metrics come back;
- predict: the task keeps its partition (predict stays partition-parallel): it normalizes the
  feature columns here, writes them as ``.npy`` files into the session's owner-only directory,
  and formats the model's outputs, read back from one ``.npy``, into MADlib's table.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from typing import Any

import numpy as np

from dvml.exceptions import DataError
from dvml.preprocess.encode import normalize, x_to_array
from dvml.preprocess.shards import sample_ids, shard_names
from dvml.preprocess.tasks import decode_tar_shard, prepare_image_files
from dvml.train.runtime.protocol import Predict, Predicted, Score, Scored
from dvml.train.runtime.sessions import infer

__all__ = [
    "evaluate_local",
    "format_predictions",
    "model_outputs",
    "output_probabilities",
    "predict_files",
    "predict_partition",
]


def evaluate_local(
    dataset: str, spec: dict[str, Any], batch_size: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """Loss and metrics on this worker's local rows of ``dataset`` (rows=0 when none),
    computed by this worker's inference session (``settings``:
    :func:`~dvml.train.runtime.sessions.inference_settings`)."""

    def score(spec_path: str, directory: str) -> Score:
        return Score(model=spec["key"], spec=spec_path, dataset=dataset, batch_size=batch_size)

    answer = infer(settings, spec, score)
    if not isinstance(answer, Scored):
        raise DataError(f"An inference trainer answered {answer!r} to an evaluate command.")
    return {"rows": answer.rows, "values": dict(answer.values)}


def format_predictions(
    ids: np.ndarray,
    probs: np.ndarray,
    class_values: list[Any] | None,
    class_name: str | list[str],
    pred_type: Any,
) -> Any:
    """MADlib's prediction table: id, class_name, class_value, prob, rank.

    ``pred_type``: ``"response"`` (the top class), ``"prob"`` (every class), an int k (the top
    k classes) or a float p in (0, 1] (the classes with probability >= p).

    A multi-output model (``class_name`` a list: its dependent variables) has its outputs'
    probabilities side by side in ``probs`` and one list of class values per output, each
    as long as its output: its rows are those of each output in turn, ``class_name`` naming
    the output (MADlib's layout), ``rank`` counted within the output.
    """
    import pandas as pd

    if isinstance(class_name, list):
        frames, start = [], 0
        for name, values in zip(class_name, class_values or [], strict=True):
            width = len(values)
            part = probs[:, start : start + width]
            frames.append(format_predictions(ids, part, values, name, pred_type))
            start += width
        return pd.concat(frames, ignore_index=True)

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
    # Labels already one-hot encoded have no class values (None, as MADlib writes them): a
    # class is its column's index. Padded classes (num_classes) have the value None.
    values = list(range(k)) if class_values is None else list(class_values)
    values += [None] * (k - len(values))
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


def model_outputs(
    xs: list[np.ndarray], spec: dict[str, Any], settings: dict[str, Any], batch_size: int
) -> np.ndarray:
    """The model's raw outputs for the rows of ``xs`` (one array per model input), computed
    by this worker's inference session; the arrays travel as ``.npy`` files."""
    written: list[str] = []

    def predict(spec_path: str, directory: str) -> Predict:
        tag = uuid.uuid4().hex[:12]
        for i, x in enumerate(xs):
            path = os.path.join(directory, f"rows-{tag}-{i}.npy")
            with open(path, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as out:
                np.save(out, np.ascontiguousarray(x), allow_pickle=False)
            written.append(path)
        written.append(os.path.join(directory, f"outputs-{tag}.npy"))
        return Predict(model=spec["key"], spec=spec_path, inputs=written[:-1],
                       output=written[-1], batch_size=batch_size)  # fmt: skip

    try:
        answer = infer(settings, spec, predict)
        if not isinstance(answer, Predicted):
            raise DataError(f"An inference trainer answered {answer!r} to a predict command.")
        return np.load(answer.output, allow_pickle=False)
    finally:
        for path in written:
            with contextlib.suppress(OSError):
                os.remove(path)


def _predict_arrays(
    ids: Any, xs: list[np.ndarray], spec: dict[str, Any], settings: dict[str, Any],
    class_values: list[Any], class_name: str | list[str], pred_type: Any, batch_size: int,
) -> Any:  # fmt: skip
    outputs = model_outputs(xs, spec, settings, batch_size)
    activation = spec.get("output_activation")
    if isinstance(class_name, list):  # a multi-output model: each output on its own
        bounds = np.cumsum([0, *(len(v) for v in class_values)])
        probs = np.concatenate(
            [output_probabilities(outputs[:, a:b], activation)
             for a, b in itertools.pairwise(bounds)], axis=1,
        )  # fmt: skip
    else:
        probs = output_probabilities(outputs, activation)
    return format_predictions(np.asarray(ids), probs, class_values, class_name, pred_type)


def predict_files(
    kind: str,
    paths: list[str],
    spec: dict[str, Any],
    settings: dict[str, Any],
    image: dict[str, Any],
    normalizing_const: float,
    class_values: list[Any],
    class_name: str | list[str],
    pred_type: Any,
    batch_size: int = 256,
) -> Any:
    """Predict the images of image files or of one tar shard, read by this worker from where
    they are (``image``: ``size``, ``channels``, ``image_ext``, ``label_ext``,
    ``storage_options``).

    The id of an image file is its path; the id of a shard's sample is the shard's file name
    and its key (webdataset's ``__key__``), ``"shard-000003.tar/0042"``
    (:func:`dvml.preprocess.shards.sample_ids`: keys repeat from shard to shard). Labels are
    not needed.
    """
    size, channels = tuple(image["size"]), int(image["channels"])
    options = image.get("storage_options")
    if kind == "shards":
        keys, images, _ = decode_tar_shard(
            paths[0], size, channels, image.get("image_ext"), image.get("label_ext") or "cls",
            options, require_labels=False,
        )  # fmt: skip
        ids = sample_ids(shard_names(paths[:1])[0], keys)
    else:
        ids = list(paths)
        images = prepare_image_files(paths, [""] * len(paths), size, channels, options)["x"][0]
    if len(ids) == 0:
        return format_predictions(
            np.array([]), np.zeros((0, max(1, len(class_values or [])))), class_values, class_name,
            pred_type,
        )  # fmt: skip
    xs = [normalize(images, normalizing_const)]
    return _predict_arrays(ids, xs, spec, settings, class_values, class_name, pred_type, batch_size)


def predict_partition(
    frame: Any,
    spec: dict[str, Any],
    settings: dict[str, Any],
    x_groups: list[list[str]],
    id_col: str,
    normalizing_const: float,
    class_values: list[Any],
    class_name: str | list[str],
    pred_type: Any,
    batch_size: int = 256,
) -> Any:
    """Predict one raw (unpacked) partition with the training normalization applied."""
    if id_col not in frame.columns:
        raise DataError(f"The id column {id_col!r} is missing. Available: {list(frame.columns)}.")
    if len(frame) == 0:
        return format_predictions(
            np.array([]),
            np.zeros((0, max(1, len(class_values or [])))),
            class_values,
            class_name,
            pred_type,
        )
    xs = [normalize(x_to_array(frame, group), normalizing_const) for group in x_groups]
    return _predict_arrays(
        frame[id_col].to_numpy(), xs, spec, settings, class_values, class_name, pred_type,
        batch_size,
    )  # fmt: skip
