"""Write the Keras 3 model JSON fixtures of this folder (``<name>.json``).

Run with Keras 3, that is WITHOUT ``TF_USE_LEGACY_KERAS`` in the environment::

    env -u TF_USE_LEGACY_KERAS python tests/registry/keras3/generate.py

The JSON is what ``model.to_json()`` writes with ``from tensorflow.keras import ...`` under
TensorFlow 2.21 (Keras 3.x); the tests convert it to the tf-keras form without Keras 3.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if os.environ.get("TF_USE_LEGACY_KERAS"):
    sys.exit("unset TF_USE_LEGACY_KERAS: these fixtures must be written by Keras 3")

import keras
from keras import Input, Model, Sequential, layers


def iris() -> keras.Model:
    # MADlib's "Train Single Model" iris example.
    return Sequential(
        [
            Input((4,)),
            layers.Dense(10, activation="relu"),
            layers.Dense(10, activation="relu"),
            layers.Dense(3, activation="softmax"),
        ]
    )


def iris_built() -> keras.Model:
    # No Input: the shape comes from build() (Keras 3's build_input_shape / build_config).
    model = Sequential([layers.Dense(8, activation="relu"), layers.Dense(3, activation="softmax")])
    model.build((None, 4))
    return model


def cnn() -> keras.Model:
    return Sequential(
        [
            Input((28, 28, 1)),
            layers.Rescaling(1.0 / 255),
            layers.Conv2D(16, 3, padding="same", kernel_regularizer="l2", use_bias=False),
            layers.BatchNormalization(momentum=0.9),
            layers.Activation("relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, (3, 3), strides=2, kernel_initializer="he_normal", activation="relu"),
            layers.AveragePooling2D(pool_size=2, padding="same"),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(
                64,
                activation="relu",
                kernel_regularizer=keras.regularizers.L1L2(l1=1e-5, l2=1e-4),
                kernel_constraint=keras.constraints.MaxNorm(3),
            ),
            layers.Dense(10, activation="softmax"),
        ]
    )


def resnet_block() -> keras.Model:
    inputs = Input((16, 16, 3), name="image")
    x = layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    y = layers.Conv2D(8, 3, padding="same", name="branch_conv")(x)
    y = layers.BatchNormalization(name="branch_bn")(y)
    x = layers.Add(name="residual")([x, y])
    x = layers.ReLU(max_value=6.0, name="relu6")(x)
    a = layers.GlobalAveragePooling2D(name="gap")(x)
    b = layers.Flatten(name="flat")(layers.MaxPooling2D(4, name="pool")(x))
    merged = layers.Concatenate(name="merge")([a, b])
    merged = layers.Dropout(0.5, name="drop")(merged)
    outputs = layers.Dense(5, activation="softmax", name="out")(merged)
    return Model(inputs, outputs, name="resnet_block")


def two_inputs() -> keras.Model:
    left = Input((6,), name="left")
    right = Input((12,), name="right")
    r = layers.Reshape((3, 4), name="reshape")(right)
    r = layers.Flatten(name="flatten")(r)
    x = layers.Concatenate(axis=-1, name="concat")([layers.Dense(4, name="dl")(left), r])
    x = layers.Activation("tanh", name="act")(x)
    return Model([left, right], layers.Dense(2, activation="softmax", name="out")(x))


def text() -> keras.Model:
    inputs = Input((20,), dtype="int32", name="tokens")
    x = layers.Embedding(100, 8, name="embed")(inputs)
    x = layers.Conv1D(8, 3, activation="relu", name="conv1d")(x)
    x = layers.MaxPooling1D(2, name="pool1d")(x)
    x = layers.LSTM(8, return_sequences=True, name="lstm")(x)
    x = layers.GRU(6, name="gru")(x)
    outputs = layers.Dense(2, activation="softmax", name="out")(x)
    return Model(inputs, outputs)


def global_1d() -> keras.Model:
    return Sequential(
        [
            Input((10, 3)),
            layers.Conv1D(4, 3, padding="causal"),
            layers.AveragePooling1D(2),
            layers.GlobalAveragePooling1D(),
            layers.Dense(2, activation="sigmoid"),
        ]
    )


def digits_cnn() -> keras.Model:
    # For the 8x8 digits of tests/train/test_fit_cluster.py: a Keras 3 model trained by dvml.
    return Sequential(
        [
            Input((8, 8, 1)),
            layers.Conv2D(16, 3, activation="relu", padding="same"),
            layers.BatchNormalization(),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dropout(0.1),
            layers.Dense(10, activation="softmax"),
        ]
    )


def unsupported() -> keras.Model:
    # A layer outside the converted set: refused by name at load time.
    return Sequential(
        [Input((8, 8, 3)), layers.RandomFlip("horizontal"), layers.Flatten(), layers.Dense(2)]
    )


def zoo() -> dict[str, str]:
    """One tiny model per converted layer that the models above do not use: {layer: JSON}."""
    image, seq, flat = (6, 6, 2), (8, 3), (6,)
    one_input = {
        "Conv3D": ((4, 4, 4, 1), layers.Conv3D(2, 2)),
        "DepthwiseConv2D": (image, layers.DepthwiseConv2D(3, depth_multiplier=2)),
        "SeparableConv2D": (image, layers.SeparableConv2D(3, 3, padding="same")),
        "Conv2DTranspose": (image, layers.Conv2DTranspose(2, 3, strides=2)),
        "MaxPooling1D": (seq, layers.MaxPooling1D(2)),
        "MaxPooling3D": ((4, 4, 4, 1), layers.MaxPooling3D(2)),
        "AveragePooling3D": ((4, 4, 4, 1), layers.AveragePooling3D(2)),
        "GlobalMaxPooling1D": (seq, layers.GlobalMaxPooling1D()),
        "GlobalMaxPooling2D": (image, layers.GlobalMaxPooling2D(keepdims=True)),
        "SpatialDropout1D": (seq, layers.SpatialDropout1D(0.2)),
        "SpatialDropout2D": (image, layers.SpatialDropout2D(0.2)),
        "LayerNormalization": (seq, layers.LayerNormalization(epsilon=1e-5)),
        "LeakyReLU": (flat, layers.LeakyReLU(negative_slope=0.2)),
        "Softmax": (flat, layers.Softmax()),
        "ELU": (flat, layers.ELU(alpha=0.5)),
        "PReLU": (flat, layers.PReLU()),
        "Permute": (seq, layers.Permute((2, 1))),
        "RepeatVector": (flat, layers.RepeatVector(2)),
        "ZeroPadding1D": (seq, layers.ZeroPadding1D(1)),
        "ZeroPadding2D": (image, layers.ZeroPadding2D(1)),
        "Cropping2D": (image, layers.Cropping2D(1)),
        "UpSampling2D": (image, layers.UpSampling2D(2, interpolation="bilinear")),
        "SimpleRNN": (seq, layers.SimpleRNN(4, return_sequences=True)),
        "GRU": (seq, layers.GRU(4, reset_after=False)),
        "Embedding": ((5,), layers.Embedding(10, 3, mask_zero=True)),
    }
    out = {}
    for name, (shape, layer) in one_input.items():
        inputs = Input(shape, dtype="int32" if name == "Embedding" else "float32")
        x = layers.Flatten()(layer(inputs))
        out[name] = Model(inputs, layers.Dense(2)(x)).to_json()
    for merge in (layers.Subtract, layers.Multiply, layers.Average, layers.Maximum, layers.Minimum):
        a, b = Input((4,)), Input((4,))
        out[merge.__name__] = Model([a, b], layers.Dense(2)(merge()([a, b]))).to_json()
    return out


MODELS = {
    f.__name__: f
    for f in (
        iris,
        iris_built,
        cnn,
        resnet_block,
        two_inputs,
        text,
        global_1d,
        digits_cnn,
        unsupported,
    )
}

if __name__ == "__main__":
    here = Path(__file__).parent
    for name, build in MODELS.items():
        keras.utils.set_random_seed(0)
        (here / f"{name}.json").write_text(build().to_json() + "\n")
    (here / "zoo.json").write_text(json.dumps(zoo(), indent=0) + "\n")
    (here / "VERSION").write_text(f"keras {keras.__version__}\n")
