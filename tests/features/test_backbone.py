"""Building and checking a backbone on the client, before any Dask task runs (real tf-keras)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dvml
from dvml.exceptions import ModelMismatchError
from dvml.features.backbone import application_preprocessing, resolve_backbone
from dvml.registry.weights import weights_from_bytes
from tests.helpers import keras

pytestmark = pytest.mark.tf


def tiny(input_shape: tuple[int, ...] = (32, 32, 3), seed: int = 1) -> Any:
    k = keras()
    k.utils.set_random_seed(seed)
    inputs = k.Input(input_shape, name="images")
    x = k.layers.Conv2D(4, 3, activation="relu", name="conv_a")(inputs)
    x = k.layers.MaxPooling2D(name="pool_a")(x)
    x = k.layers.Conv2D(6, 3, activation="relu", name="conv_b")(x)
    return k.Model(inputs, x, name="tiny")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[dvml.Registry]:
    reg = dvml.Registry(f"sqlite:///{tmp_path}/r.db")
    yield reg
    reg.close()


def test_model_output_layer_and_pooling() -> None:
    model = tiny()
    whole = resolve_backbone(model, None, None, [32, 32, 3])
    assert whole.feature_shape == [13, 13, 6]
    assert whole.output_layer == "conv_b"
    cut = resolve_backbone(model, "pool_a", "avg", [32, 32, 3])
    assert cut.feature_shape == [4]
    assert cut.fingerprint == whole.fingerprint  # same backbone ...
    assert cut.extractor_key != whole.extractor_key  # ... another extractor
    # The shipped extractor is the cut model: its weights are only those of conv_a.
    assert [w.shape for w in weights_from_bytes(cut.extractor_weights)] == [(3, 3, 3, 4), (4,)]


def test_the_extractor_rebuilt_from_json_computes_the_same_features() -> None:
    k = keras()
    model = tiny()
    bb = resolve_backbone(model, "conv_b", "max", [32, 32, 3])
    rebuilt = k.models.model_from_json(bb.extractor_json)
    rebuilt.set_weights(weights_from_bytes(bb.extractor_weights))
    x = np.random.default_rng(0).random((5, 32, 32, 3), dtype=np.float32)
    expected = np.asarray(model(x)).max(axis=(1, 2))
    np.testing.assert_allclose(rebuilt.predict_on_batch(x), expected, rtol=1e-5, atol=1e-6)


def test_fingerprint_follows_the_weights() -> None:
    model = tiny()
    before = resolve_backbone(model, None, "avg", [32, 32, 3]).fingerprint
    assert resolve_backbone(tiny(), None, "avg", [32, 32, 3]).fingerprint == before
    weights = model.get_weights()
    weights[0] = weights[0] + 0.01
    model.set_weights(weights)
    assert resolve_backbone(model, None, "avg", [32, 32, 3]).fingerprint != before


def test_missing_layer_lists_the_available_ones() -> None:
    with pytest.raises(ModelMismatchError) as info:
        resolve_backbone(tiny(), "conv_c", None, [32, 32, 3])
    message = str(info.value)
    assert "no layer named 'conv_c'" in message
    for name in ("images", "conv_a", "pool_a", "conv_b"):
        assert repr(name) in message


def test_images_that_do_not_fit_name_both_shapes() -> None:
    with pytest.raises(ModelMismatchError, match=r"\(28, 28, 1\).*\(32, 32, 3\)"):
        resolve_backbone(tiny(), None, None, [28, 28, 1])


def test_pooling_needs_spatial_axes() -> None:
    k = keras()
    flat = k.Sequential(
        [k.layers.InputLayer(input_shape=(32, 32, 3)), k.layers.Flatten(name="flat")]
    )
    with pytest.raises(ModelMismatchError, match="pooling='avg' needs spatial axes"):
        resolve_backbone(flat, None, "avg", [32, 32, 3])


def test_keras_application_by_name_is_seeded_and_deterministic() -> None:
    spec = {"application": "MobileNetV2", "kwargs": {"alpha": 0.35}}
    a = resolve_backbone(spec, None, "avg", [32, 32, 3])
    b = resolve_backbone(dict(spec), None, "avg", [32, 32, 3])
    assert a.fingerprint == b.fingerprint  # seeded weights, fixed input name: the same key
    assert a.feature_shape == [1280]
    assert "MobileNetV2(alpha=0.35, include_top=False)" in a.description


def test_application_errors() -> None:
    with pytest.raises(ValueError, match="No Keras application named 'MobileNetV9'"):
        resolve_backbone("MobileNetV9", None, None, [32, 32, 3])
    with pytest.raises(ValueError, match=r"never downloads.*'weights': '/path/to/file\.h5'"):
        resolve_backbone(
            {"application": "ResNet50", "weights": "imagenet"}, None, None, [32, 32, 3]
        )
    with pytest.raises(ValueError, match="path of an existing weights file"):
        resolve_backbone(
            {"application": "ResNet50", "weights": "/nope/w.h5"}, None, None, [32, 32, 3]
        )
    with pytest.raises(ModelMismatchError, match=r"cannot take the source images.*\(16, 16, 3\)"):
        resolve_backbone(
            {"application": "MobileNetV2", "kwargs": {"alpha": 0.35}}, None, None, [16, 16, 3]
        )
    with pytest.raises(ValueError, match="keys"):
        resolve_backbone({"app": "ResNet50"}, None, None, [32, 32, 3])


def test_weights_file_of_another_architecture_is_refused(tmp_path: Path) -> None:
    k = keras()
    wrong = str(tmp_path / "tiny.h5")
    tiny().save_weights(wrong)
    spec = {"application": "MobileNetV2", "weights": wrong, "kwargs": {"alpha": 0.35}}
    with pytest.raises(ModelMismatchError, match="weights file does not match MobileNetV2"):
        resolve_backbone(spec, None, None, [32, 32, 3])
    # A file of the same architecture loads, and its weights make the fingerprint.
    same = k.applications.MobileNetV2(
        weights=None, include_top=False, alpha=0.35, input_shape=(32, 32, 3)
    )
    first, second = str(tmp_path / "w1.h5"), str(tmp_path / "w2.h5")
    same.save_weights(first)
    same.set_weights([w * 0.5 for w in same.get_weights()])
    same.save_weights(second)
    a = resolve_backbone({**spec, "weights": first}, None, "avg", [32, 32, 3])
    b = resolve_backbone({**spec, "weights": second}, None, "avg", [32, 32, 3])
    assert a.fingerprint != b.fingerprint
    assert first in a.description and second in b.description


def test_custom_layers_are_refused() -> None:
    k = keras()

    class Twice(k.layers.Layer):
        def call(self, x: Any) -> Any:
            return 2 * x

    inputs = k.Input((32, 32, 3))
    model = k.Model(inputs, Twice()(k.layers.Conv2D(2, 3)(inputs)))
    with pytest.raises(ValueError, match=r"custom layer classes \['Twice'\]"):
        resolve_backbone(model, None, "avg", [32, 32, 3])


def test_registry_architecture_with_weights(registry: dvml.Registry) -> None:
    model = tiny()
    arch = dvml.load_keras_model(model, registry=registry)
    by_id = resolve_backbone(arch, "conv_b", "avg", [32, 32, 3], registry=registry)
    by_model = resolve_backbone(model, "conv_b", "avg", [32, 32, 3])
    assert by_id.fingerprint == by_model.fingerprint  # same JSON and weights: same key
    assert by_id.description.startswith(f"registry architecture {arch}")
    bare = dvml.load_keras_model(model.to_json(), registry=registry)
    with pytest.raises(ValueError, match="has no weights"):
        resolve_backbone(bare, None, None, [32, 32, 3], registry=registry)


def test_backbone_of_an_unknown_kind() -> None:
    with pytest.raises(TypeError, match="backbone must be a tf-keras model"):
        resolve_backbone(3.5, None, None, [32, 32, 3])
    with pytest.raises(TypeError, match="backbone must be a tf-keras model"):
        resolve_backbone(True, None, None, [32, 32, 3])


@pytest.mark.parametrize(
    ("application", "module"),
    [("MobileNetV2", "mobilenet_v2"), ("ResNet50", "resnet"), ("DenseNet121", "densenet"),
     ("EfficientNetB0", "efficientnet")],
)  # fmt: skip
def test_the_affine_map_is_the_applications_own_preprocess_input(
    application: str, module: str
) -> None:
    """Scale to [-1, 1], BGR flip and ImageNet means, per-channel normalisation, and an
    application that preprocesses inside the model: read off tf-keras's own functions."""
    import importlib

    preprocess = importlib.import_module(f"tf_keras.applications.{module}").preprocess_input
    packed = np.random.default_rng(0).random((50, 3), dtype=np.float32)  # pixels / 255
    found = application_preprocessing(keras(), application, 255.0)
    assert found is not None
    matrix, bias = found
    expected = np.asarray(preprocess(packed.reshape(1, 50, 1, 3) * 255.0)).reshape(50, 3)
    np.testing.assert_allclose(packed @ matrix.T + bias, expected, rtol=1e-5, atol=1e-4)
    if application == "EfficientNetB0":  # its preprocessing is inside: only the 255 back
        assert application_preprocessing(keras(), application, 1.0) is None


def test_an_application_extractor_starts_with_its_preprocess_input() -> None:
    spec = {"application": "MobileNet", "kwargs": {"alpha": 0.25}}
    bb = resolve_backbone(spec, None, "avg", [32, 32, 3], normalizing_const=255.0)
    assert "preprocess_input" in bb.description
    extractor = keras().models.model_from_json(bb.extractor_json)
    extractor.set_weights(weights_from_bytes(bb.extractor_weights))
    assert extractor.layers[1].name == "dvml_preprocess_input"
    assert not extractor.layers[1].trainable
    packed = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
    expected = extractor.layers[-1](packed * 2.0 - 1.0).numpy()  # MobileNet: [-1, 1]
    np.testing.assert_allclose(extractor(packed).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_preprocess_input_can_be_turned_off_and_user_models_get_none() -> None:
    spec = {"application": "MobileNet", "kwargs": {"alpha": 0.25}}
    on = resolve_backbone(spec, None, "avg", [32, 32, 3], normalizing_const=255.0)
    off = resolve_backbone(
        {**spec, "preprocess_input": False}, None, "avg", [32, 32, 3], normalizing_const=255.0
    )
    assert "dvml_preprocess_input" in on.extractor_json
    assert "dvml_preprocess_input" not in off.extractor_json
    assert on.fingerprint != off.fingerprint  # another cache: other features
    assert (
        "dvml_preprocess_input"
        not in resolve_backbone(
            tiny(), None, "avg", [32, 32, 3], normalizing_const=255.0
        ).extractor_json
    )
    with pytest.raises(TypeError, match="preprocess_input must be True or False"):
        resolve_backbone({"application": "MobileNetV2", "preprocess_input": "yes"}, None,
                         None, [32, 32, 3])  # fmt: skip
