"""Resolve a backbone on the client: build it once, check it, and turn it into a shippable spec.

A backbone is given as a tf-keras model, an architecture id in the registry (with weights), a
Keras application name (``"MobileNetV2"``), or ``{"application": "ResNet50", "weights":
"/path/file.h5", "kwargs": {...}}``. Everything is checked here, before any Dask task runs:
the layer exists, the source images fit the backbone's input, a weights file matches the
architecture. Workers receive only the feature extractor's JSON and weights
(:meth:`Backbone.spec`) and rebuild it once per process (:mod:`dvml.features.featurize`).

dvml never downloads weights: ``"imagenet"`` is refused with the way to provide the file.

A Keras application expects the images it was trained on: pixels 0..255, passed through its
own ``preprocess_input`` (MobileNetV2 scales to [-1, 1], ResNet50 and VGG flip RGB to BGR and
subtract ImageNet's means, DenseNet normalises per channel; EfficientNet, ConvNeXt, RegNet,
MobileNetV3 and ResNetRS do it inside the model). Every one of these is an affine map of a
pixel's channels, so for an application backbone the extractor starts with ONE frozen 1x1
convolution, ``dvml_preprocess_input``, that undoes the dataset's ``normalizing_const`` and
applies the application's ``preprocess_input`` (:func:`application_preprocessing` reads the
map off tf-keras's own function). ``{"application": ..., "preprocess_input": False}`` turns it
off, for images already preprocessed that way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dvml import tf_runtime
from dvml.exceptions import ArgumentError, ArgumentTypeError, ModelMismatchError
from dvml.features.keys import json_fingerprint, weights_fingerprint
from dvml.registry import Registry
from dvml.registry.weights import weights_to_bytes

if TYPE_CHECKING:
    from dvml.registry import Registry

__all__ = [
    "APPLICATION_KEYS",
    "Backbone",
    "activations_per_row",
    "application_preprocessing",
    "keras_module",
    "resolve_backbone",
]

APPLICATION_KEYS = ("application", "weights", "kwargs", "seed", "preprocess_input")
_POOLING_LAYERS = {
    ("avg", 3): "GlobalAveragePooling1D",
    ("avg", 4): "GlobalAveragePooling2D",
    ("avg", 5): "GlobalAveragePooling3D",
    ("max", 3): "GlobalMaxPooling1D",
    ("max", 4): "GlobalMaxPooling2D",
    ("max", 5): "GlobalMaxPooling3D",
}


@dataclasses.dataclass(frozen=True)
class Backbone:
    """A checked feature extractor: backbone (cut at ``layer``) + pooling.

    Attributes
    ----------
    fingerprint : str
        sha256 of the whole backbone: architecture JSON and weight bytes.
    extractor_key : str
        ``fingerprint`` + layer + pooling + input shape: what a worker caches a model under.
    extractor_json : str
        The extractor's architecture, rebuilt on the workers.
    extractor_weights : bytes
        Its weights as ``.npz`` bytes (:func:`dvml.registry.weights_to_bytes`).
    feature_shape : list of int
        Shape of one row of features.
    activations_per_row : int
        Values its layers output per row, summed over the layers: a batch's activations, as
        the feature cache's memory plan counts them.
    """

    fingerprint: str
    extractor_key: str
    extractor_json: str
    extractor_weights: bytes
    description: str
    layer: str | None
    output_layer: str
    pooling: str | None
    input_shape: list[int]
    feature_shape: list[int]
    n_params: int
    activations_per_row: int = 0  # values the extractor's layers output per row, summed

    def spec(self, use_gpus: bool) -> dict[str, Any]:
        """What a worker needs to rebuild the extractor (sent once per worker)."""
        return {
            "key": self.extractor_key,
            "model_json": self.extractor_json,
            "weights": self.extractor_weights,
            "feature_shape": list(self.feature_shape),
            "use_gpus": bool(use_gpus),
        }

    def record(self) -> dict[str, Any]:
        """The JSON-able description kept in the cache's summary."""
        return {
            "fingerprint": self.fingerprint,
            "description": self.description,
            "layer": self.layer,
            "output_layer": self.output_layer,
            "pooling": self.pooling,
            "input_shape": list(self.input_shape),
            "feature_shape": list(self.feature_shape),
            "n_params": self.n_params,
        }


def keras_module() -> Any:
    """tf-keras, started through :mod:`dvml.tf_runtime` (GPUs left to grow on demand)."""
    return tf_runtime.keras()


def resolve_backbone(
    backbone: Any,
    layer: str | None,
    pooling: str | None,
    input_shape: Sequence[int],
    registry: Registry | str | None = None,
    normalizing_const: float = 1.0,
) -> Backbone:
    """Build ``backbone`` on the client, check it against the source, and describe it.

    Parameters
    ----------
    backbone : tf-keras Model, int, str or dict
        See :func:`dvml.features.cache`.
    layer : str or None
        Layer whose output is the features; None for the backbone's output.
    pooling : {None, "avg", "max"}
        Global pooling over the spatial axes of that output.
    input_shape : sequence of int
        Shape of one source image (without the batch axis).
    registry : Registry, str or None
        Where an architecture id is looked up.
    normalizing_const : float
        What the source's pixels were divided by when they were packed: an application
        backbone's ``preprocess_input`` is applied to the pixels times this (0..255 for
        images packed with ``normalizing_const=255``).

    Raises
    ------
    ModelMismatchError
        The layer does not exist (the message lists the layers), the images do not fit the
        backbone's input (both shapes named), or a weights file does not match.
    """
    tf = tf_runtime.tensorflow()

    keras = keras_module()
    shape = [int(s) for s in input_shape]
    with tf.device("/CPU:0"):
        model, description, application = _build(keras, backbone, shape, registry)
        _check_input(model, shape, description)
        affine = None
        if application is not None and len(shape) == 3 and shape[-1] == 3:
            affine = application_preprocessing(keras, application, float(normalizing_const))
        fingerprint = _combine(json_fingerprint(model.to_json()),
                               weights_fingerprint(model.get_weights()),
                               *([] if affine is None else [repr(affine[0].tolist()),
                                                            repr(affine[1].tolist())]))  # fmt: skip
        output, output_layer = _layer_output(model, layer, description)
        output = _pool(keras, output, pooling, output_layer)
        extractor = keras.Model(model.inputs, output, name="dvml_feature_extractor")
        if affine is not None:
            extractor = _with_preprocessing(keras, extractor, shape, affine)
            description += f", its preprocess_input (pixels x {float(normalizing_const):g})"
        feature_shape = _feature_shape(extractor, shape, description)

        blob = weights_to_bytes(list(extractor.get_weights()))
        extractor_json = extractor.to_json()
        _check_rebuildable(keras, extractor, description)
    return Backbone(
        fingerprint=fingerprint,
        extractor_key=_combine(fingerprint, str(layer), str(pooling), str(shape)),
        extractor_json=extractor_json,
        extractor_weights=blob,
        description=description,
        layer=layer,
        output_layer=output_layer,
        pooling=pooling,
        input_shape=shape,
        feature_shape=feature_shape,
        n_params=int(extractor.count_params()),
        activations_per_row=activations_per_row(extractor),
    )


def _combine(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def application_preprocessing(
    keras: Any, name: str, normalizing_const: float = 1.0
) -> tuple[np.ndarray, np.ndarray] | None:
    """The affine map ``x -> A @ x + b`` of one RGB pixel, as packed (divided by
    ``normalizing_const``), that Keras application ``name``'s ``preprocess_input`` applies to
    the raw pixel; None when it is the identity.

    Read off tf-keras's own ``preprocess_input`` with probe pixels (every mode, ``tf``,
    ``torch``, ``caffe`` and the applications that preprocess inside the model, is affine per
    pixel), and checked on one more pixel.
    """
    import importlib

    function = _applications(keras)[name]
    preprocess = importlib.import_module(function.__module__).preprocess_input
    probes = np.array([[0, 0, 0], [100, 0, 0], [0, 100, 0], [0, 0, 100], [37, 211, 90]],
                      dtype=np.float32)  # fmt: skip
    out = np.asarray(preprocess(probes.reshape(1, 5, 1, 3).copy()), dtype=np.float64)
    out = out.reshape(5, 3)
    bias = out[0]
    matrix = np.stack([(out[1 + c] - bias) / 100.0 for c in range(3)], axis=1)
    if not np.allclose(matrix @ probes[4] + bias, out[4], atol=1e-3):
        raise ModelMismatchError(  # no tf-keras application does this today
            f"{name}'s preprocess_input is not an affine map of a pixel's channels, which dvml "
            f"can apply. Received: application={name!r}. Pass {{'application': {name!r}, "
            "'preprocess_input': False}} and preprocess the images yourself."
        )
    matrix = matrix * float(normalizing_const)  # the packed pixels back to 0..255 first
    if np.allclose(matrix, np.eye(3)) and np.allclose(bias, 0.0):
        return None
    return matrix.astype(np.float32), bias.astype(np.float32)


def _with_preprocessing(
    keras: Any, extractor: Any, shape: list[int], affine: tuple[np.ndarray, np.ndarray]
) -> Any:
    """``extractor`` behind a frozen 1x1 convolution that applies ``affine`` per pixel."""
    matrix, bias = affine
    images = keras.Input(shape=tuple(shape), name="dvml_images")
    layer = keras.layers.Conv2D(3, 1, name="dvml_preprocess_input", trainable=False)
    preprocessed = layer(images)
    layer.set_weights([matrix.T.reshape(1, 1, 3, 3), bias])  # kernel[0, 0, in, out]
    return keras.Model(images, extractor(preprocessed), name="dvml_feature_extractor")


def _build(keras: Any, backbone: Any, shape: list[int],
           registry: Registry | str | None) -> tuple[Any, str, str | None]:  # fmt: skip
    """The model, its description, and the Keras application whose ``preprocess_input`` it
    needs in front (None: a user's model, or ``preprocess_input=False``)."""
    if isinstance(backbone, str):
        backbone = {"application": backbone}
    if isinstance(backbone, dict):
        model, description = _from_application(keras, backbone, shape)
        wanted = backbone.get("preprocess_input", True)
        if not isinstance(wanted, bool):
            raise ArgumentTypeError(
                f"preprocess_input must be True or False. Received: {wanted!r}. False when the "
                "images are already preprocessed the way the application expects."
            )
        return model, description, backbone["application"] if wanted else None
    return (*_build_model(keras, backbone, registry), None)


def _build_model(keras: Any, backbone: Any, registry: Registry | str | None) -> tuple[Any, str]:
    if isinstance(backbone, keras.Model):
        if not backbone.built or not backbone.inputs:
            raise ArgumentError(
                f"The backbone model {backbone.name!r} has no inputs yet. Received: an unbuilt "
                "model. Give it an Input layer (keras.Input or InputLayer) or call it once."
            )
        return backbone, f"tf-keras model {backbone.name!r}"
    if hasattr(backbone, "to_json") and hasattr(backbone, "get_weights"):
        raise ArgumentTypeError(
            f"The backbone is a {type(backbone).__module__}.{type(backbone).__name__}, not a "
            "tf-keras model. dvml runs legacy Keras (tf-keras, not Keras 3): build it with "
            "`import tf_keras as keras`."
        )
    if isinstance(backbone, bool):
        raise ArgumentTypeError(_what_backbone(backbone))
    if isinstance(backbone, int | np.integer):
        return _from_registry(keras, int(backbone), registry)
    raise ArgumentTypeError(_what_backbone(backbone))


def _what_backbone(backbone: Any) -> str:
    return (
        "backbone must be a tf-keras model, an architecture id in the registry, a Keras "
        "application name such as 'MobileNetV2', or {'application': 'ResNet50', 'weights': "
        f"'/path/file.h5'}}. Received: {type(backbone).__name__} {backbone!r:.80}."
    )


def _from_registry(keras: Any, arch_id: int, registry: Registry | str | None) -> tuple[Any, str]:
    reg = registry if isinstance(registry, Registry) else Registry(registry)
    try:
        arch = reg.get_architecture(arch_id)
    finally:
        if reg is not registry:
            reg.close()
    if arch["weights"] is None:
        raise ArgumentError(
            f"Architecture {arch_id} in the registry has no weights: its features would be "
            "those of random weights, different on every build. Received: an architecture "
            "without weights. Load it with dvml.load_keras_model(model) or (model_json, weights)."
        )
    try:
        model = keras.models.model_from_json(arch["model_json"])
    except Exception as exc:  # unknown layer classes, malformed configs
        raise ArgumentError(
            f"Architecture {arch_id} in the registry cannot be built: {type(exc).__name__}: "
            f"{exc}. Received: arch_id={arch_id}. Custom layers cannot be used as a backbone "
            "by id; pass the model object instead."
        ) from None
    try:
        model.set_weights(arch["weights"])
    except ValueError as exc:
        raise ModelMismatchError(
            f"The weights stored with architecture {arch_id} do not fit its layers: {exc}. "
            "Load the architecture again with matching weights."
        ) from None
    name = f" ({arch['name']})" if arch.get("name") else ""
    return model, f"registry architecture {arch_id}{name}"


def _applications(keras: Any) -> dict[str, Callable[..., Any]]:
    return {n: getattr(keras.applications, n) for n in dir(keras.applications)
            if n[:1].isupper() and callable(getattr(keras.applications, n))}  # fmt: skip


def _from_application(keras: Any, spec: dict[str, Any], shape: list[int]) -> tuple[Any, str]:
    unknown = sorted(set(spec) - set(APPLICATION_KEYS))
    if unknown or "application" not in spec:
        raise ArgumentError(
            f"An application backbone is a dict with keys {list(APPLICATION_KEYS)} "
            f"('application' required). Received: keys {sorted(spec)}."
        )
    name, weights = spec["application"], spec.get("weights")
    kwargs = dict(spec.get("kwargs") or {})
    apps = _applications(keras)
    if name not in apps:
        raise ArgumentError(
            f"No Keras application named {name!r}. Received: application={name!r}. Available: "
            f"{sorted(apps)}."
        )
    taken = sorted({"weights", "input_shape", "input_tensor"} & set(kwargs))
    if taken:
        raise ArgumentError(
            f"kwargs of an application may not set {taken}: the input shape comes from the "
            f"source images and weights from 'weights'. Received: kwargs={kwargs!r}."
        )
    if weights == "imagenet":
        raise ArgumentError(
            f"weights='imagenet' would download the {name} weights, and dvml never downloads. "
            f"Received: weights='imagenet'. On a machine with network access run "
            f"`tf_keras.applications.{name}(weights='imagenet', include_top=False)` (the file "
            "lands in ~/.keras/models/), copy the .h5 file here, and pass "
            f"{{'application': {name!r}, 'weights': '/path/to/file.h5'}}."
        )
    if weights is not None and (not isinstance(weights, str | os.PathLike)
                                or not os.path.isfile(weights)):  # fmt: skip
        raise ArgumentError(
            f"weights must be None (random weights, seeded) or the path of an existing weights "
            f"file. Received: weights={weights!r}. Save one with model.save_weights('w.h5')."
        )
    kwargs.setdefault("include_top", False)
    seed = int(spec.get("seed", 0))
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))

    def build() -> Any:
        tensor = keras.Input(shape=tuple(shape), name="dvml_input")  # a fixed name: stable JSON
        return apps[name](weights=None, input_tensor=tensor, input_shape=tuple(shape), **kwargs)

    try:
        model = _seeded(keras, seed, build)
    except ValueError as exc:
        raise ModelMismatchError(
            f"{name}({args}) cannot take the source images: {exc}. Received: images of shape "
            f"{tuple(shape)}. Preprocess them to a size the application accepts (image_size=)."
        ) from None
    description = f"{name}({args})"
    if weights is None:
        return model, f"{description}, random weights (seed {seed})"
    path = os.path.abspath(os.fspath(weights))
    try:
        model.load_weights(path)
    except Exception as exc:  # h5py, ValueError, TF errors: all mean the same here
        raise ModelMismatchError(
            f"The weights file does not match {description} built for images of shape "
            f"{tuple(shape)}: {type(exc).__name__}: {exc}. Received: weights={path!r}. Use the "
            "file saved from exactly this architecture (same application, kwargs and "
            "include_top)."
        ) from None
    return model, f"{description}, weights {path}"


def _seeded(keras: Any, seed: int, build: Callable[[], Any]) -> Any:
    """Build with seeded random weights, then restore Python's and numpy's random states."""
    tf = tf_runtime.tensorflow()

    py_state, np_state = random.getstate(), np.random.get_state()
    keras.utils.set_random_seed(seed)
    try:
        return build()
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        tf.random.set_seed(None)


def _check_input(model: Any, shape: list[int], description: str) -> None:
    if len(model.inputs) != 1:
        raise ModelMismatchError(
            f"The backbone {description} has {len(model.inputs)} inputs; a feature cache feeds "
            f"one (the images). Received: input shapes {model.input_shape}."
        )
    expected = list(model.inputs[0].shape[1:])
    same_rank = len(expected) == len(shape)
    fits = same_rank and all(e is None or e == s for e, s in zip(expected, shape, strict=True))
    if not fits:
        raise ModelMismatchError(
            f"The source images have shape {tuple(shape)} but the backbone {description} "
            f"expects inputs of shape {tuple(expected)}. Preprocess the images to that size "
            "(image_size=, channels=) or build the backbone for the images' shape."
        )


def _layer_output(model: Any, layer: str | None, description: str) -> tuple[Any, str]:
    if layer is None:
        if len(model.outputs) != 1:
            raise ModelMismatchError(
                f"The backbone {description} has {len(model.outputs)} outputs; name one "
                "layer with layer=."
            )
        return model.outputs[0], model.layers[-1].name
    names = [lay.name for lay in model.layers]
    if layer not in names:
        raise ModelMismatchError(
            f"The backbone {description} has no layer named {layer!r}. Received: "
            f"layer={layer!r}. Available layers ({len(names)}): {names}."
        )
    try:
        output = model.get_layer(layer).output
    except AttributeError as exc:  # a layer called at several places has no single output
        raise ModelMismatchError(
            f"Layer {layer!r} of the backbone {description} has no single output ({exc}). "
            "Name a layer that is called once."
        ) from None
    if isinstance(output, list | tuple):
        raise ModelMismatchError(
            f"Layer {layer!r} of the backbone {description} has {len(output)} outputs. Name a "
            "layer with one output."
        )
    return output, layer


def _pool(keras: Any, output: Any, pooling: str | None, layer: str) -> Any:
    if pooling is None:
        return output
    rank = len(output.shape)
    cls = _POOLING_LAYERS.get((pooling, rank))
    if cls is None:
        raise ModelMismatchError(
            f"pooling={pooling!r} needs spatial axes, but layer {layer!r} outputs shape "
            f"{tuple(output.shape)}. Use pooling=None, or a layer with a (h, w, c) output."
        )
    return getattr(keras.layers, cls)(name="dvml_pooling")(output)


def _feature_shape(extractor: Any, shape: list[int], description: str) -> list[int]:
    """The shape of one row of features, from the graph; a zero image probes it if needed."""
    try:
        out_shape = list(extractor.compute_output_shape((None, *shape))[1:])
    except Exception:  # some layers cannot tell their output shape statically
        out_shape = [None]
    if any(s is None for s in out_shape):
        try:
            out = extractor.predict_on_batch(np.zeros((1, *shape), dtype=np.float32))
        except Exception as exc:
            raise ModelMismatchError(
                f"The backbone {description} fails on images of shape {tuple(shape)}: "
                f"{type(exc).__name__}: {exc}. Preprocess the images to the backbone's input "
                "size."
            ) from None
        out_shape = list(np.asarray(out).shape[1:])
    if not out_shape:
        raise ModelMismatchError(
            f"The features of {description} are one scalar per image; a feature cache needs "
            "a vector or feature maps. Name another layer."
        )
    return [int(s) for s in out_shape]


def activations_per_row(model: Any) -> int:
    """The values ``model``'s layers output per row, summed (nested models' layers counted
    once each, input layers left out); a layer without one known output shape counts 0."""
    total = 0
    for layer in _all_layers(model):
        if hasattr(layer, "layers") or type(layer).__name__ == "InputLayer":
            continue
        try:
            shapes = layer.output_shape
        except (AttributeError, RuntimeError):  # called at several places, or never
            continue
        for shape in shapes if isinstance(shapes, list) else [shapes]:
            dims = list(shape)[1:]
            if all(isinstance(d, int) for d in dims):
                total += math.prod(dims)
    return total


def _check_rebuildable(keras: Any, model: Any, description: str) -> None:
    """Workers rebuild the extractor from JSON alone: refuse layers only this process knows."""
    custom = sorted({type(layer).__name__ for layer in _all_layers(model)
                     if not type(layer).__module__.startswith("tf_keras.")})  # fmt: skip
    if custom:
        raise ArgumentError(
            f"The backbone {description} uses custom layer classes {custom}, which the workers "
            "cannot rebuild from its JSON. Received: a model with custom layers. Build the "
            "backbone from standard tf-keras layers."
        )


def _all_layers(model: Any) -> list[Any]:
    found = []
    for layer in model.layers:
        found.append(layer)
        if hasattr(layer, "layers"):  # a nested model
            found.extend(_all_layers(layer))
    return found
