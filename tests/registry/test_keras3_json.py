"""Keras 3 model JSON is converted to tf-keras' form at load time, or refused there by name.

The fixtures under keras3/ are real ``model.to_json()`` output of Keras 3 (written by
keras3/generate.py). The pure tests need no TensorFlow; the ``tf`` ones build the converted JSON
with tf-keras and compare its outputs with Keras 3's own, computed in a subprocess without
``TF_USE_LEGACY_KERAS`` (keras3/reference.py).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dvml
from dvml.exceptions import RegistryError
from dvml.registry import keras_json as kj

HERE = Path(__file__).parent / "keras3"


def _cases() -> dict[str, str]:
    out = {}
    for path in sorted(HERE.glob("*.json")):
        data = json.loads(path.read_text())
        if "config" in data:
            out[path.stem] = json.dumps(data)
        else:
            out.update({f"zoo_{name}": text for name, text in data.items()})
    return out


CASES = _cases()
CONVERTED = sorted(name for name in CASES if name != "unsupported")


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


@pytest.mark.parametrize("name", CONVERTED)
def test_keras3_json_converts_to_plain_tf_keras_form(name: str) -> None:
    original = json.loads(CASES[name])
    assert kj.is_keras3(original)
    text, model = kj.tf_keras_json(CASES[name])
    assert json.loads(text) == model and not kj.is_keras3(model)
    for obj in _walk(model):
        assert not {"module", "registered_name", "build_config", "batch_shape"} & set(obj), obj
        assert obj.get("class_name") not in ("DTypePolicy", "__keras_tensor__"), obj
    # Shapes the registry shows are read from the converted JSON as from tf-keras' own.
    assert kj.input_shapes(model) == kj.input_shapes(original)
    assert kj.output_shape(model) == kj.output_shape(original)


def test_known_shapes_and_forms() -> None:
    _, iris = kj.tf_keras_json(CASES["iris"])
    first = iris["config"]["layers"][0]
    assert first == {
        "class_name": "InputLayer",
        "config": {
            "batch_input_shape": [None, 4],
            "dtype": "float32",
            "sparse": False,
            "ragged": False,
            "name": first["config"]["name"],
            "optional": False,
        },
    }
    dense = iris["config"]["layers"][1]["config"]
    assert dense["dtype"] == "float32"
    assert dense["kernel_initializer"] == {"class_name": "GlorotUniform", "config": {"seed": None}}
    assert "quantization_config" not in dense
    _, two = kj.tf_keras_json(CASES["two_inputs"])
    assert two["config"]["input_layers"] == [["left", 0, 0], ["right", 0, 0]]
    assert two["config"]["output_layers"] == [["out", 0, 0]]
    concat = next(la for la in two["config"]["layers"] if la["name"] == "concat")
    assert concat["inbound_nodes"] == [[["dl", 0, 0, {}], ["flatten", 0, 0, {}]]]
    _, cnn = kj.tf_keras_json(CASES["cnn"])
    regularized = cnn["config"]["layers"][2]["config"]
    assert regularized["kernel_regularizer"] == {"class_name": "L2", "config": {"l2": 0.01}}
    leaky = json.loads(kj.tf_keras_json(CASES["zoo_LeakyReLU"])[0])
    assert any(la["config"].get("alpha") == 0.2 for la in leaky["config"]["layers"])


def test_tf_keras_json_is_stored_unchanged() -> None:
    text = json.dumps(
        {
            "class_name": "Sequential",
            "config": {
                "name": "s",
                "layers": [
                    {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4]}},
                    {"class_name": "Dense", "config": {"units": 3}},
                ],
            },
            "keras_version": "2.21.0",
            "backend": "tensorflow",
        }
    )
    assert kj.tf_keras_json(text) == (text, json.loads(text))


def test_unsupported_layer_is_refused_by_name_with_the_way_out() -> None:
    with pytest.raises(RegistryError) as info:
        kj.tf_keras_json(CASES["unsupported"])
    message = str(info.value)
    assert "RandomFlip" in message and "random_flip" in message
    assert "import tf_keras" in message and "TF_USE_LEGACY_KERAS=1" in message


def _edited(name: str, layer_class: str, **config: Any) -> str:
    model = copy.deepcopy(json.loads(CASES[name]))
    for layer in model["config"]["layers"]:
        if layer["class_name"] == layer_class:
            layer["config"].update(config)
            return json.dumps(model)
    raise AssertionError(layer_class)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_edited("cnn", "BatchNormalization", renorm=True), r"renorm=true"),
        (_edited("cnn", "BatchNormalization", synchronized=True), r"synchronized=true"),
        (_edited("zoo_LayerNormalization", "LayerNormalization", rms_scaling=True), "rms_scaling"),
        (_edited("iris", "Dense", quantization_config={"mode": "int8"}), "quantization_config"),
        (_edited("iris", "Dense", lora_rank=4), "lora_rank"),
        (
            _edited("zoo_ZeroPadding1D", "ZeroPadding1D", data_format="channels_first"),
            "data_format",
        ),
        (
            _edited(
                "iris",
                "Dense",
                dtype={"module": "keras", "class_name": "QuantizedDTypePolicy", "config": {}},
            ),
            "dtype",
        ),
        (
            _edited(
                "iris",
                "Dense",
                kernel_initializer={"module": "x", "class_name": "MyInit", "config": {}},
            ),
            "MyInit",
        ),
        (
            _edited("iris", "Dense", activation={"module": "m", "class_name": "f", "config": {}}),
            "activation",
        ),
    ],
)
def test_arguments_without_an_exact_tf_keras_form_are_refused(text: str, match: str) -> None:
    with pytest.raises(RegistryError, match=match):
        kj.tf_keras_json(text)


def test_custom_layers_subclassed_models_and_tensor_kwargs_are_refused() -> None:
    custom = json.loads(CASES["iris"])
    custom["config"]["layers"][1]["registered_name"] = "MyPackage>MyDense"
    with pytest.raises(RegistryError, match="custom layer"):
        kj.tf_keras_json(json.dumps(custom))
    subclassed = {"module": "m", "class_name": "MyModel", "config": {}, "registered_name": "M"}
    with pytest.raises(RegistryError, match="Sequential and Functional"):
        kj.tf_keras_json(json.dumps(subclassed))
    tensor_kwarg = json.loads(CASES["text"])
    lstm = next(la for la in tensor_kwarg["config"]["layers"] if la["class_name"] == "LSTM")
    node = lstm["inbound_nodes"][0]
    node["kwargs"] = {"initial_state": node["args"]}
    with pytest.raises(RegistryError, match="tensor as initial_state"):
        kj.tf_keras_json(json.dumps(tensor_kwarg))


def test_load_keras_model_stores_the_converted_json(tmp_path: Path) -> None:
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        arch_id = dvml.load_keras_model(CASES["iris"], name="iris3", registry=registry)
        stored = json.loads(registry.get_architecture(arch_id)["model_json"])
        assert not kj.is_keras3(stored)
        assert stored["config"]["layers"][0]["config"]["batch_input_shape"] == [None, 4]
        row = registry.list_architectures().set_index("id").loc[arch_id]
        assert row["input_shapes"] == [[4]] and row["output_shape"] == [3]
        with pytest.raises(RegistryError, match="RandomFlip"):
            dvml.load_keras_model(CASES["unsupported"], registry=registry)
        assert len(registry.list_architectures()) == 1
    finally:
        registry.close()


# ----------------------------------------------------------------------------- with TensorFlow


@pytest.fixture(scope="module")
def keras3_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Keras 3's weights, inputs and outputs for every fixture (in a subprocess)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    target = tmp_path_factory.mktemp("keras3") / "reference.npz"
    done = subprocess.run(
        [sys.executable, str(HERE / "reference.py"), str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 and "No module named 'keras'" in done.stderr:
        pytest.skip("Keras 3 is not installed")
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(target) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.tf
@pytest.mark.parametrize("name", CONVERTED)
def test_converted_model_computes_what_keras3_computes(
    name: str, keras3_reference: dict[str, np.ndarray]
) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    text, _ = kj.tf_keras_json(CASES[name])
    model = tf_keras.models.model_from_json(text)
    weights = [keras3_reference[f"{name}/w{i}"] for i in range(len(model.get_weights()))]
    assert f"{name}/w{len(weights)}" not in keras3_reference  # as many weights as Keras 3
    assert [w.shape for w in model.get_weights()] == [w.shape for w in weights]
    model.set_weights(weights)
    inputs = [keras3_reference[f"{name}/x{i}"] for i in range(len(model.inputs))]
    outputs = model(inputs if len(inputs) > 1 else inputs[0], training=False)
    np.testing.assert_allclose(
        np.asarray(outputs), keras3_reference[f"{name}/y"], rtol=1e-4, atol=1e-5
    )


@pytest.mark.tf
def test_layer_key_tables_match_tf_keras() -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    layers = tf_keras.layers
    required: dict[str, tuple[Any, ...]] = {
        "InputLayer": (),
        "Dense": (2,),
        "Dropout": (0.5,),
        "SpatialDropout1D": (0.5,),
        "SpatialDropout2D": (0.5,),
        "Activation": ("relu",),
        "Reshape": ((2,),),
        "Permute": ((2, 1),),
        "RepeatVector": (2,),
        "Rescaling": (1.0,),
        "Embedding": (10, 2),
        "LSTM": (2,),
        "GRU": (2,),
        "SimpleRNN": (2,),
        "DepthwiseConv2D": (3,),
    }
    for name, keys in kj.TF_KERAS_LAYER_KEYS.items():
        cls = getattr(layers, name)
        args = required.get(name, (2, 3) if "Conv" in name else ())
        config = cls(*args, **({"input_shape": (4,)} if name == "InputLayer" else {})).get_config()
        assert set(config) - {"name", "dtype", "trainable"} == set(keys), name
    for kind, classes in kj.TF_KERAS_OBJECT_KEYS.items():
        for name, keys in classes.items():
            config = getattr(getattr(tf_keras, kind), name)().get_config()
            assert set(config) == set(keys), (kind, name)


@pytest.mark.tf
def test_real_tf_keras_json_is_not_taken_for_keras3() -> None:
    # tf-keras also wraps layers in "module"/"registered_name"; only its top level differs.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    inputs = tf_keras.Input((4,))
    outputs = tf_keras.layers.Dense(2, kernel_regularizer="l2")(inputs)
    for model in (
        tf_keras.Model(inputs, outputs),
        tf_keras.Sequential(
            [tf_keras.layers.InputLayer(input_shape=(4,)), tf_keras.layers.Dense(2)]
        ),
    ):
        text = model.to_json()
        assert kj.tf_keras_json(text)[0] == text
