"""Read a Keras model's JSON (``model.to_json()``) without importing TensorFlow.

Only what the registry shows and what data checks need is read: the input shapes (without the
batch dimension) and the number of output units. Anything this module cannot tell for sure is
reported as None rather than guessed.
"""

from __future__ import annotations

import json
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError

__all__ = ["input_shapes", "output_shape", "parse_model_json"]

# Layers that keep the shape of their input, so the units of a Dense before them still hold.
_SHAPE_KEEPING = frozenset(
    {
        "Activation",
        "ActivityRegularization",
        "AlphaDropout",
        "BatchNormalization",
        "Dropout",
        "ELU",
        "GaussianDropout",
        "GaussianNoise",
        "LayerNormalization",
        "LeakyReLU",
        "PReLU",
        "ReLU",
        "Softmax",
        "ThresholdedReLU",
    }
)


def parse_model_json(model_json: str) -> dict[str, Any]:
    """Parse and minimally check a Keras model JSON string.

    Raises
    ------
    ArgumentTypeError
        When ``model_json`` is not a string.
    ArgumentError
        When it is not JSON, or not an object with a ``"config"`` key.
    """
    if not isinstance(model_json, str):
        raise ArgumentTypeError(
            f"model_json must be a JSON string. Received: {type(model_json).__name__}. "
            "Pass model.to_json(), or the model itself to load_keras_model."
        )
    try:
        model = json.loads(model_json)
    except (ValueError, RecursionError) as exc:
        raise ArgumentError(
            f"model_json is not valid JSON: {exc}. Received: {model_json[:80]!r}. "
            "Pass the string that model.to_json() returns."
        ) from None
    if not isinstance(model, dict) or "config" not in model:
        raise ArgumentError(
            "model_json must be a Keras model description with a 'config' key. Received: "
            f"{model_json[:80]!r}. Pass the string that model.to_json() returns."
        )
    return model


def _layers(model: dict[str, Any]) -> list[dict[str, Any]]:
    config = model.get("config")
    layers = config if isinstance(config, list) else (config or {}).get("layers")
    if not isinstance(layers, list):
        return []
    return [layer for layer in layers if isinstance(layer, dict)]


def _is_sequential(model: dict[str, Any]) -> bool:
    return model.get("class_name") == "Sequential" or isinstance(model.get("config"), list)


def _shape(value: Any) -> list[int | None] | None:
    """A shape as a list of non-negative ints or None, or None when it is not one."""
    if not isinstance(value, list | tuple):
        return None
    for dim in value:
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
            return None
    return list(value)


def _layer_input_shape(layer: dict[str, Any] | None) -> list[int | None] | None:
    config = (layer or {}).get("config")
    if not isinstance(config, dict):
        return None
    for key in ("batch_input_shape", "batch_shape"):
        shape = _shape(config.get(key))
        if shape:
            return shape[1:]
    return None


def _layer_name(layer: dict[str, Any]) -> Any:
    config = layer.get("config")
    return layer.get("name") or (config.get("name") if isinstance(config, dict) else None)


def _endpoint_names(spec: Any) -> list[str] | None:
    """Names in ``input_layers``/``output_layers``: ``[[name, 0, 0], ...]`` or ``[name, 0, 0]``."""
    if not isinstance(spec, list) or not spec:
        return None
    if isinstance(spec[0], str):
        return [spec[0]]
    names = [item[0] for item in spec if isinstance(item, list) and item]
    if len(names) != len(spec) or not all(isinstance(name, str) for name in names):
        return None
    return names


def input_shapes(model: dict[str, Any]) -> list[list[int | None]] | None:
    """The shape of each model input without the batch dimension, or None when unknown.

    A Sequential model's shape comes from its first layer (an ``InputLayer`` or a layer with
    ``batch_input_shape``/``batch_shape``), else from ``build_input_shape``; a Functional
    model's from its ``input_layers``, else from its ``InputLayer`` layers.
    """
    layers = _layers(model)
    config = model.get("config")
    if _is_sequential(model):
        first = _layer_input_shape(layers[0]) if layers else None
        if first is not None:
            return [first]
        built = _shape(config.get("build_input_shape")) if isinstance(config, dict) else None
        return [built[1:]] if built else None
    by_name = {_layer_name(layer): layer for layer in layers}
    names = _endpoint_names(config.get("input_layers")) if isinstance(config, dict) else None
    if names is not None:
        inputs = [by_name.get(name) for name in names]
    else:
        inputs = [layer for layer in layers if layer.get("class_name") == "InputLayer"]
    shapes = [_layer_input_shape(layer) for layer in inputs]
    if not shapes or any(shape is None for shape in shapes):
        return None
    return [shape for shape in shapes if shape is not None]


def _inbound_name(layer: dict[str, Any]) -> str | None:
    """The one layer feeding ``layer`` in a Functional config, when that is plain to see."""
    nodes = layer.get("inbound_nodes")
    if not isinstance(nodes, list) or len(nodes) != 1:
        return None
    node = nodes[0]
    # tf-keras 2: [[["dense", 0, 0, {}]]]
    if isinstance(node, list) and len(node) == 1 and isinstance(node[0], list) and node[0]:
        name = node[0][0]
        return name if isinstance(name, str) else None
    # Keras 3: [{"args": [{"class_name": "__keras_tensor__", "config": {"keras_history": [...]}}]}]
    if isinstance(node, dict) and isinstance(node.get("args"), list) and len(node["args"]) == 1:
        arg = node["args"][0]
        history = arg.get("config", {}).get("keras_history") if isinstance(arg, dict) else None
        if isinstance(history, list) and history and isinstance(history[0], str):
            return history[0]
    return None


def output_shape(model: dict[str, Any]) -> list[int] | None:
    """``[units]`` of the Dense layer that produces the model's single output, or None.

    Layers that keep their input's shape (activations, dropout, normalization) after that
    Dense are looked through; anything else, or several outputs, gives None.
    """
    layers = _layers(model)
    if not layers:
        return None
    by_name = {_layer_name(layer): layer for layer in layers}
    config = model.get("config")
    layer: dict[str, Any] | None
    if _is_sequential(model):
        layer = layers[-1]
    else:
        names = _endpoint_names(config.get("output_layers")) if isinstance(config, dict) else None
        if names is None or len(names) != 1:
            return None
        layer = by_name.get(names[0])
    for position in range(len(layers), 0, -1):
        if layer is None:
            return None
        if layer.get("class_name") == "Dense":
            units = (layer.get("config") or {}).get("units")
            if isinstance(units, int) and not isinstance(units, bool) and units > 0:
                return [units]
            return None
        if layer.get("class_name") not in _SHAPE_KEEPING:
            return None
        if _is_sequential(model):
            layer = layers[position - 2] if position >= 2 else None
        else:
            layer = by_name.get(_inbound_name(layer))
    return None
