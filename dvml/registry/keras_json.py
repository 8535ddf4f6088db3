"""Read a Keras model's JSON (``model.to_json()``) without importing TensorFlow.

Only what the registry shows and what data checks need is read: the input shapes (without the
batch dimension) and the number of output units. Anything this module cannot tell for sure is
reported as None rather than guessed.

Keras 3 JSON is converted to tf-keras' form (:func:`tf_keras_json`), JSON to JSON, for the
common layers; anything else is refused by name.
"""

from __future__ import annotations

import json
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError, RegistryError

__all__ = [
    "TF_KERAS_LAYER_KEYS",
    "TF_KERAS_OBJECT_KEYS",
    "input_shapes",
    "is_keras3",
    "output_shape",
    "parse_model_json",
    "tf_keras_json",
    "to_tf_keras",
]

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


# --------------------------------------------------------------------- Keras 3 -> tf-keras
#
# dvml's trainers build models with tf-keras (Keras 2), the only Keras whose model.fit works
# under MultiWorkerMirroredStrategy here. ``from tensorflow.keras import ...`` gives Keras 3
# with TensorFlow >= 2.16 unless TF_USE_LEGACY_KERAS=1 is set, and Keras 3's JSON differs:
# ``module``/``registered_name`` wrappers around every object, ``DTypePolicy`` objects for
# dtypes, InputLayer's ``batch_shape``, ``build_config``, node lists as call arguments, and a
# few new layer arguments. For the layers below the conversion is exact; anything else is
# refused by name, before any trainer starts.

_REFUSE_HINT = (
    "Build the model with tf-keras instead: `import tf_keras as keras` (or set "
    "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported and use tf.keras), build the same "
    "layers, and pass model.to_json()."
)

_WEIGHTED = ("activation", "use_bias", "activity_regularizer", "bias_constraint")
_BIAS = ("bias_initializer", "bias_regularizer")
_KERNEL = ("kernel_constraint", "kernel_initializer", "kernel_regularizer")
_CONV = (
    *_WEIGHTED,
    *_BIAS,
    "data_format",
    "dilation_rate",
    "groups",
    "kernel_size",
    "padding",
    "strides",
)
_DEPTHWISE = ("depth_multiplier", "depthwise_constraint", "depthwise_initializer")
_POOL = ("data_format", "padding", "pool_size", "strides")
_NORM = (
    "axis",
    "center",
    "scale",
    "epsilon",
    "beta_constraint",
    "beta_initializer",
    "beta_regularizer",
    "gamma_constraint",
    "gamma_initializer",
    "gamma_regularizer",
)
_RNN = (
    *_WEIGHTED,
    *_BIAS,
    *_KERNEL,
    "dropout",
    "go_backwards",
    "recurrent_constraint",
    "recurrent_dropout",
    "recurrent_initializer",
    "recurrent_regularizer",
    "return_sequences",
    "return_state",
    "stateful",
    "time_major",
    "units",
    "unroll",
)

# layer class -> the config keys tf-keras 2.21 writes (and reads) besides name/dtype/trainable;
# tests/registry/test_keras3_json.py checks them against the installed tf-keras.
TF_KERAS_LAYER_KEYS: dict[str, tuple[str, ...]] = {
    "InputLayer": ("batch_input_shape", "optional", "ragged", "sparse"),
    "Dense": (*_WEIGHTED, *_BIAS, *_KERNEL, "units"),
    "Conv1D": (*_CONV, *_KERNEL, "filters"),
    "Conv2D": (*_CONV, *_KERNEL, "filters"),
    "Conv3D": (*_CONV, *_KERNEL, "filters"),
    "Conv2DTranspose": (*_CONV, *_KERNEL, "filters", "output_padding"),
    "DepthwiseConv2D": (*_CONV, *_DEPTHWISE, "depthwise_regularizer"),
    "SeparableConv2D": (
        *_CONV,
        *_KERNEL,
        *_DEPTHWISE,
        "depthwise_regularizer",
        "filters",
        "pointwise_constraint",
        "pointwise_initializer",
        "pointwise_regularizer",
    ),
    **{f"{kind}Pooling{d}D": _POOL for kind in ("Max", "Average") for d in (1, 2, 3)},
    **{
        f"Global{kind}Pooling{d}D": ("data_format", "keepdims")
        for kind in ("Max", "Average")
        for d in (1, 2)
    },
    "Flatten": ("data_format",),
    "Dropout": ("noise_shape", "rate", "seed"),
    "SpatialDropout1D": ("noise_shape", "rate", "seed"),
    "SpatialDropout2D": ("noise_shape", "rate", "seed"),
    "BatchNormalization": (
        *_NORM,
        "momentum",
        "moving_mean_initializer",
        "moving_variance_initializer",
    ),
    "LayerNormalization": _NORM,
    "Activation": ("activation",),
    "ReLU": ("max_value", "negative_slope", "threshold"),
    "LeakyReLU": ("alpha",),
    "ELU": ("alpha",),
    "Softmax": ("axis",),
    "PReLU": ("alpha_constraint", "alpha_initializer", "alpha_regularizer", "shared_axes"),
    "Reshape": ("target_shape",),
    "Permute": ("dims",),
    "RepeatVector": ("n",),
    "ZeroPadding1D": ("padding",),
    "ZeroPadding2D": ("data_format", "padding"),
    "Cropping2D": ("cropping", "data_format"),
    "UpSampling2D": ("data_format", "interpolation", "size"),
    "Rescaling": ("offset", "scale"),
    "Add": (),
    "Subtract": (),
    "Multiply": (),
    "Average": (),
    "Maximum": (),
    "Minimum": (),
    "Concatenate": ("axis",),
    "Embedding": (
        "activity_regularizer",
        "batch_input_shape",
        "embeddings_constraint",
        "embeddings_initializer",
        "embeddings_regularizer",
        "input_dim",
        "input_length",
        "mask_zero",
        "output_dim",
    ),
    "LSTM": (*_RNN, "implementation", "recurrent_activation", "unit_forget_bias"),
    "GRU": (*_RNN, "implementation", "recurrent_activation", "reset_after"),
    "SimpleRNN": _RNN,
}
_COMMON_KEYS = ("name", "dtype", "trainable")

# initializer / regularizer / constraint class -> tf-keras config keys
TF_KERAS_OBJECT_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "initializers": {
        "Zeros": (),
        "Ones": (),
        "Constant": ("value",),
        "GlorotUniform": ("seed",),
        "GlorotNormal": ("seed",),
        "HeNormal": ("seed",),
        "HeUniform": ("seed",),
        "LecunNormal": ("seed",),
        "LecunUniform": ("seed",),
        "RandomNormal": ("mean", "seed", "stddev"),
        "RandomUniform": ("maxval", "minval", "seed"),
        "TruncatedNormal": ("mean", "seed", "stddev"),
        "VarianceScaling": ("distribution", "mode", "scale", "seed"),
        "Orthogonal": ("gain", "seed"),
        "Identity": ("gain",),
    },
    "regularizers": {
        "L1": ("l1",),
        "L2": ("l2",),
        "L1L2": ("l1", "l2"),
        "OrthogonalRegularizer": ("factor", "mode"),
    },
    "constraints": {
        "MaxNorm": ("axis", "max_value"),
        "MinMaxNorm": ("axis", "max_value", "min_value", "rate"),
        "NonNeg": (),
        "UnitNorm": ("axis",),
        "RadialConstraint": (),
    },
}
_OBJECT_RENAMES = {"IdentityInitializer": "Identity", "OrthogonalInitializer": "Orthogonal"}

# Keras 3 arguments tf-keras lacks, with the values that mean what tf-keras does anyway.
_ANY = object()
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "quantization_config": (None,),
    "lora_rank": (None,),
    "lora_alpha": (None,),
    "synchronized": (False,),
    "renorm": (False,),
    "renorm_clipping": (None,),
    "renorm_momentum": (_ANY,),  # used only with renorm=True, refused above
    "rms_scaling": (False,),
    "zero_output_for_mask": (False,),
    "use_cudnn": ("auto",),
    "seed": (None,),
    "data_format": ("channels_last",),
    "input_axes": (None,),
    "output_axes": (None,),
    "autocast": (True,),
    "optional": (False,),
}
_RENAMED_ARGS = {
    ("LeakyReLU", "negative_slope"): "alpha",
    ("InputLayer", "batch_shape"): "batch_input_shape",
}
# Keras 3 RNNs take a seed for their dropout masks; tf-keras draws them unseeded.
_SEED_IGNORED = frozenset({"LSTM", "GRU", "SimpleRNN"})

_MODEL_CLASSES = frozenset({"Sequential", "Functional", "Model"})


def is_keras3(model: dict[str, Any]) -> bool:
    """Whether a parsed model JSON was written by Keras 3 (it wraps objects in ``module``)."""
    version = model.get("keras_version")
    return "module" in model or "registered_name" in model or str(version).startswith("3.")


def _refuse(what: str, received: str) -> RegistryError:
    return RegistryError(
        f"This Keras 3 model cannot be converted to tf-keras, which dvml's trainers use: "
        f"{what}. Received: {received}. Converted layers: "
        f"{', '.join(sorted(TF_KERAS_LAYER_KEYS))}, in Sequential and Functional models. "
        f"{_REFUSE_HINT}"
    )


def _dtype(value: Any, where: str) -> Any:
    """A Keras 3 dtype (a string or a ``DTypePolicy`` object) as tf-keras writes it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("class_name") in ("DTypePolicy", "FloatDTypePolicy"):
        name = (value.get("config") or {}).get("name")
        if isinstance(name, str) and name.startswith("mixed_"):
            return {"class_name": "Policy", "config": {"name": name}}
        if isinstance(name, str):
            return name
    raise _refuse(f"the dtype of {where} is not a plain dtype policy", json.dumps(value)[:200])


def _object(kind: str, value: Any, where: str) -> Any:
    """An initializer, regularizer or constraint: unwrap Keras 3's wrapper, check its keys."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, dict) or not isinstance(value.get("class_name"), str):
        raise _refuse(f"{where} is not a known {kind[:-1]}", json.dumps(value)[:200])
    written = str(value["class_name"])
    name = _OBJECT_RENAMES.get(written, written)
    known = TF_KERAS_OBJECT_KEYS[kind].get(name)
    registered = value.get("registered_name")
    if known is None or (registered not in (None, value["class_name"])):
        raise _refuse(
            f"{where} is {value['class_name']} (registered as {registered!r}), not one of "
            f"tf-keras' {kind} {sorted(TF_KERAS_OBJECT_KEYS[kind])}",
            json.dumps(value)[:200],
        )
    config = value.get("config") or {}
    if not isinstance(config, dict):
        raise _refuse(f"{where} has a config that is not an object", json.dumps(value)[:200])
    return {"class_name": name, "config": _filter(name, config, known, where)}


def _filter(
    class_name: str, config: dict[str, Any], known: tuple[str, ...], where: str
) -> dict[str, Any]:
    """Keep the keys tf-keras knows; drop Keras 3-only keys that hold their no-op value."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        target = _RENAMED_ARGS.get((class_name, key), key)
        if target in known or target in _COMMON_KEYS:
            out[target] = value
            continue
        if key == "seed" and class_name in _SEED_IGNORED:
            continue
        allowed = _NO_OP_VALUES.get(key, ())
        if _ANY in allowed or any(value == v and type(value) is type(v) for v in allowed):
            continue
        raise _refuse(
            f"{where} has the argument {key}={json.dumps(value)[:80]}, which tf-keras's "
            f"{class_name} does not have",
            f"{class_name} config keys {sorted(config)}",
        )
    return out


def _activation(value: Any, where: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    # Keras 3 writes a built-in activation function as {"class_name": "function", "config": name}
    if (
        isinstance(value, dict)
        and isinstance(value.get("config"), str)
        and str(value.get("module", "")).startswith("keras.activations")
    ):
        return value["config"]
    raise _refuse(f"the activation of {where} is not a built-in one", json.dumps(value)[:200])


def _layer_config(layer: dict[str, Any]) -> dict[str, Any]:
    class_name = layer.get("class_name")
    config = layer.get("config")
    name = config.get("name") if isinstance(config, dict) else None
    where = f"layer {name!r} ({class_name})"
    if class_name in _MODEL_CLASSES:
        return _model_config(layer)
    if class_name not in TF_KERAS_LAYER_KEYS or not isinstance(config, dict):
        raise _refuse(f"{where} is not one of the converted layers", f"class_name={class_name!r}")
    if layer.get("registered_name") not in (None, class_name):
        raise _refuse(f"{where} is a custom layer", f"registered_name={layer['registered_name']!r}")
    out = _filter(class_name, config, TF_KERAS_LAYER_KEYS[class_name], where)
    for key, value in list(out.items()):
        if key == "dtype":
            out[key] = _dtype(value, where)
        elif key == "activation" or key == "recurrent_activation":
            out[key] = _activation(value, where)
        elif key.endswith("_initializer"):
            out[key] = _object("initializers", value, f"{key} of {where}")
        elif key.endswith("_regularizer"):
            out[key] = _object("regularizers", value, f"{key} of {where}")
        elif key.endswith("_constraint"):
            out[key] = _object("constraints", value, f"{key} of {where}")
    return out


def _tensor_ref(arg: Any, where: str) -> list[Any]:
    config = arg.get("config") if isinstance(arg, dict) else None
    history = config.get("keras_history") if isinstance(config, dict) else None
    if (
        not isinstance(arg, dict)
        or arg.get("class_name") != "__keras_tensor__"
        or not isinstance(history, list)
        or len(history) != 3
    ):
        raise _refuse(f"{where} is called on something other than layer outputs", str(arg)[:200])
    return list(history)


def _literal_kwargs(kwargs: Any, where: str) -> dict[str, Any]:
    out = {}
    for key, value in (kwargs or {}).items():
        if value is None:
            continue  # Keras 3 writes mask=None for layers that take a mask; tf-keras does not
        if "__keras_tensor__" in json.dumps(value):
            raise _refuse(f"{where} is called with a tensor as {key}=", f"{key}={value!r}"[:200])
        out[key] = value
    return out


def _nodes(layer: dict[str, Any]) -> list[Any]:
    """Keras 3 ``inbound_nodes`` ({"args", "kwargs"} per call) in tf-keras' nested-list form."""
    where = f"layer {layer.get('name')!r} ({layer.get('class_name')})"
    nodes = []
    for node in layer.get("inbound_nodes") or []:
        if not isinstance(node, dict):
            raise _refuse(f"{where} has an inbound node that is not a Keras 3 call", str(node))
        args = node.get("args") or []
        if len(args) != 1:
            raise _refuse(f"{where} is called with {len(args)} positional arguments", str(args))
        tensors = args[0] if isinstance(args[0], list) else [args[0]]
        kwargs = _literal_kwargs(node.get("kwargs"), where)
        nodes.append([[*_tensor_ref(t, where), kwargs] for t in tensors])
    return nodes


def _endpoints(spec: Any) -> list[Any]:
    """Keras 3 writes one input/output as ``[name, 0, 0]``; tf-keras always as a list of them."""
    if isinstance(spec, list) and spec and isinstance(spec[0], str):
        return [spec]
    return list(spec or [])


def _model_config(model: dict[str, Any]) -> dict[str, Any]:
    """A Sequential or Functional model (top level or nested) in tf-keras' form."""
    class_name = model.get("class_name")
    config = model.get("config")
    if class_name not in _MODEL_CLASSES or not isinstance(config, dict):
        raise _refuse("only Sequential and Functional models are converted", f"{class_name!r}")
    if model.get("registered_name") not in (None, class_name) or class_name == "Model":
        raise _refuse(
            "subclassed models have no layer graph in their JSON",
            f"class_name={class_name!r}, registered_name={model.get('registered_name')!r}",
        )
    layers = config.get("layers")
    if not isinstance(layers, list):
        raise _refuse("the model has no list of layers", f"config keys {sorted(config)}")
    frozen = config.get("trainable") is False
    out: dict[str, Any] = {"name": config.get("name")}
    converted = []
    for layer in layers:
        if not isinstance(layer, dict):
            raise _refuse("a layer is not a JSON object", str(layer)[:80])
        entry: dict[str, Any] = {"class_name": layer.get("class_name")}
        entry["config"] = _layer_config(layer)
        if frozen and isinstance(entry["config"], dict) and "trainable" in entry["config"]:
            entry["config"]["trainable"] = False
        if class_name == "Functional":
            entry["name"] = layer.get("name")
            entry["inbound_nodes"] = _nodes(layer)
        converted.append(entry)
    out["layers"] = converted
    if class_name == "Sequential":
        if config.get("build_input_shape") is not None:
            out["build_input_shape"] = config["build_input_shape"]
    else:
        out["input_layers"] = _endpoints(config.get("input_layers"))
        out["output_layers"] = _endpoints(config.get("output_layers"))
    return out


def to_tf_keras(model: dict[str, Any]) -> dict[str, Any]:
    """Convert a parsed Keras 3 model JSON to the form tf-keras' ``model_from_json`` reads.

    Pure JSON to JSON, without TensorFlow. The weights keep their order and shapes, so
    ``model.get_weights()`` of the Keras 3 model fits the converted one.

    Parameters
    ----------
    model : dict
        What :func:`parse_model_json` returned for a Keras 3 ``model.to_json()``.

    Returns
    -------
    dict
        ``{"class_name": ..., "config": ..., "backend": "tensorflow"}`` in tf-keras' form.

    Raises
    ------
    RegistryError
        Naming the first layer, argument or object that has no exact tf-keras form, with how
        to build the model with tf-keras instead.
    """
    return {
        "class_name": model.get("class_name"),
        "config": _model_config(model),
        "backend": "tensorflow",
    }


def tf_keras_json(model_json: str) -> tuple[str, dict[str, Any]]:
    """The JSON dvml stores for ``model_json``: tf-keras' form, converted from Keras 3 if needed.

    Returns
    -------
    tuple of (str, dict)
        The JSON text to store (``model_json`` itself unless it was Keras 3) and its parsed
        form.

    Raises
    ------
    RegistryError
        When a Keras 3 model uses something that has no exact tf-keras form.
    """
    model = parse_model_json(model_json)
    if not is_keras3(model):
        return model_json, model
    converted = to_tf_keras(model)
    return json.dumps(converted), converted
