"""Per-epoch data augmentation in the trainers: ``dvml.fit(..., augment=...)``.

The client encodes what the user passed as plain JSON for the job file (:func:`encode`); each
trainer decodes it (:func:`decode`) and its input pipeline maps every TRAINING batch's inputs
through it (:func:`dvml.resolve.tfdata.training_dataset`), so each epoch sees new random
transforms. The per-iteration metrics and the validation set read the rows as stored.

Two kinds are accepted:

- a tf-keras layer or model (``tf_keras.Sequential([RandomFlip("horizontal"),
  RandomRotation(0.1)])``): shipped as its config, not as code, and called with
  ``training=True`` (Keras's random preprocessing layers are identities otherwise);
- a function ``augment(x) -> x`` of TensorFlow ops on one batch of inputs (a tensor, or a
  tuple of tensors for several x columns): shipped as code (cloudpickle by value, as
  :func:`dvml.run` ships ``train_fn``), so the trainers run whatever it does.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

from dvml.exceptions import ArgumentTypeError
from dvml.train.runtime.shipped import pickle_by_value

__all__ = ["decode", "describe", "encode", "job_key_part"]

_EXAMPLE = (
    "Pass a tf-keras layer, e.g. tf_keras.Sequential([tf_keras.layers.RandomFlip('horizontal'), "
    "tf_keras.layers.RandomRotation(0.1)]), or a function of one batch of inputs, e.g. "
    "lambda x: tf.image.random_flip_left_right(x)."
)


def _keras_package(augment: Any) -> str | None:
    """``"tf_keras"`` or ``"keras"`` for a Keras layer or model, else None (no import)."""
    top = type(augment).__module__.split(".")[0]
    if top in ("tf_keras", "keras") and callable(getattr(augment, "get_config", None)):
        return top
    return None


def encode(augment: Any) -> dict[str, Any] | None:
    """The job file's form of ``augment`` (None: no augmentation).

    Raises
    ------
    ArgumentTypeError
        For anything but a tf-keras layer or model, or a function; for a Keras 3 layer (the
        trainers run tf-keras, as MultiWorkerMirroredStrategy needs).
    """
    if augment is None:
        return None
    package = _keras_package(augment)
    if package == "keras":
        raise ArgumentTypeError(
            f"augment is a Keras 3 {type(augment).__name__}; dvml's trainers run tf-keras "
            "(MultiWorkerMirroredStrategy needs it). Build it from tf_keras.layers instead: "
            "import tf_keras; tf_keras.Sequential([tf_keras.layers.RandomFlip('horizontal')])."
        )
    if package == "tf_keras":
        # the user built the layer, so tf-keras is loaded: serialize with it, start nothing
        config = json.dumps(sys.modules["tf_keras"].layers.serialize(augment))
        return {"kind": "keras", "config": config, "name": _describe_layer(augment)}
    if callable(augment):
        payload = base64.b64encode(pickle_by_value(augment)).decode("ascii")
        name = getattr(augment, "__qualname__", type(augment).__name__)
        return {"kind": "function", "pickle": payload, "name": f"function {name}"}
    raise ArgumentTypeError(
        f"augment must be a tf-keras layer or model, or a function. Received: "
        f"{type(augment).__name__} {augment!r:.80}. {_EXAMPLE}"
    )


def _describe_layer(layer: Any) -> str:
    """``Sequential(random_flip, random_rotation)`` or ``RandomFlip``: for the summary."""
    inner = getattr(layer, "layers", None)
    if inner:
        return f"{type(layer).__name__}({', '.join(x.name for x in inner)})"
    return type(layer).__name__


def describe(spec: dict[str, Any] | None) -> str | None:
    """What a fit augmented its training batches with (the model summary's ``augment``)."""
    return None if spec is None else str(spec["name"])


def job_key_part(spec: dict[str, Any] | None) -> Any:
    """What of ``spec`` names the job (a rerun resumes by its key): a layer's config; a
    function's name (its pickle is not byte-stable across processes)."""
    if spec is None:
        return None
    return spec.get("config") if spec["kind"] == "keras" else spec["name"]


def decode(spec: dict[str, Any] | None) -> Any:
    """(In a trainer.) The function ``x -> x`` that augments one batch of inputs, or None."""
    if spec is None:
        return None
    if spec["kind"] == "keras":
        from dvml import tf_runtime

        layer = tf_runtime.keras().layers.deserialize(json.loads(spec["config"]))

        def keras_augment(x: Any) -> Any:
            return layer(x, training=True)

        return keras_augment
    import cloudpickle

    return cloudpickle.loads(base64.b64decode(spec["pickle"]))
