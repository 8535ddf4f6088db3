"""Keras models inside a trainer process: build, compile, and metrics over the LOCAL rows.

Shared by the trainer's programs (:mod:`dvml.train.runtime.sync_program`,
:mod:`dvml.train.runtime.serve_program`). Runs only in trainer processes: TensorFlow through
:mod:`dvml.tf_runtime`.
"""

from __future__ import annotations

import math
from typing import Any

from dvml import tf_runtime
from dvml.configs import compile_kwargs
from dvml.placement.metrics_batch import evaluation_batch
from dvml.resolve.tfdata import evaluation_dataset, evaluation_steps

__all__ = ["build_model", "compile_model", "fit_kwargs", "local_metrics"]


def build_model(model_json: str, weights_path: str | None, custom_objects: dict[str, Any]) -> Any:
    """The model from its JSON (layers' ``trainable`` flags are part of the JSON), with the
    weights in ``weights_path`` (registry bytes) when given."""
    weights = None
    if weights_path:
        from dvml.registry.weights import weights_from_bytes

        with open(weights_path, "rb") as f:
            weights = weights_from_bytes(f.read())
    return tf_runtime.build_model(model_json, weights, custom_objects)


def compile_model(
    model: Any,
    compile_params: dict[str, Any],
    custom_objects: dict[str, Any],
    steps_per_execution: int | None = None,
) -> None:
    """Compile ``model`` with parsed ``compile_params``; ``steps_per_execution`` is a default
    that the user's ``compile_params`` override."""
    kwargs = compile_kwargs(compile_params, custom_objects)
    if steps_per_execution is not None:
        kwargs.setdefault("steps_per_execution", steps_per_execution)
    model.compile(**kwargs)


def fit_kwargs(fit_params: dict[str, Any]) -> dict[str, Any]:
    """``model.fit`` keywords from parsed ``fit_params`` (dvml feeds the batches itself)."""
    # callbacks: built by fit_callbacks; sample_weight_mode: Keras 2's, no sample weights here
    skip = ("batch_size", "shuffle", "steps_per_epoch", "callbacks", "sample_weight_mode")
    kwargs = {k: v for k, v in fit_params.items() if k not in skip}
    kwargs.setdefault("epochs", 1)
    kwargs["verbose"] = 0
    return kwargs


def fit_callbacks(keras: Any, fit_params: dict[str, Any], *where: str) -> list[Any]:
    """The callbacks of ``fit_params`` (``TensorBoard`` only, checked by the parser), each
    writing under its ``log_dir`` joined with ``where`` (the trainer, and the model of a
    model-hopping job), so trainers never share one event file."""
    import os

    made = []
    for spec in fit_params.get("callbacks") or []:
        config = dict(spec["config"])
        config["log_dir"] = os.path.join(config["log_dir"], *where)
        made.append(getattr(keras.callbacks, spec["class_name"])(**config))
    return made


def local_metrics(model: Any, parts: Any, batch_size: int) -> dict[str, Any]:
    """Loss and metrics of ``model`` on every local row (aggregated over workers later), in
    batches of :func:`~dvml.placement.metrics_batch.evaluation_batch` rows."""
    row_values = sum(math.prod(a.shape[1:]) for f in parts.x_fields for a in parts.fields[f][:1])
    batch_size = evaluation_batch(batch_size, row_values)
    steps = evaluation_steps(parts, batch_size)  # compile_params may run several per call
    data = evaluation_dataset(parts, batch_size)
    result = model.evaluate(data, steps=steps, verbose=0, return_dict=True)
    return {"rows": parts.rows, "values": {k: float(v) for k, v in result.items()}}
