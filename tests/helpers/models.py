"""Small Keras models the tests train or featurize with (tf-keras, imported on first use)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["cnn", "digits_dense", "iris_mlp", "keras", "tiny_backbone"]


def keras() -> Any:
    """The ``tf_keras`` module, with ``TF_USE_LEGACY_KERAS=1`` as dvml's trainers use it."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    return tf_keras


def cnn(n_classes: int = 10, input_shape: tuple[int, ...] = (8, 8, 1)) -> Any:
    """The digits CNN: conv (``conv``), flatten, dense (``hidden``), softmax (``out``)."""
    k = keras()
    return k.Sequential(
        [
            k.layers.InputLayer(input_shape=input_shape),
            k.layers.Conv2D(16, 3, activation="relu", padding="same", name="conv"),
            k.layers.Flatten(),
            k.layers.Dense(32, activation="relu", name="hidden"),
            k.layers.Dense(n_classes, activation="softmax", name="out"),
        ]
    )


def digits_dense() -> Any:
    """The smallest digits model: 8x8x1 images, flattened, one softmax layer of 10."""
    k = keras()
    return k.Sequential(
        [
            k.layers.InputLayer(input_shape=(8, 8, 1)),
            k.layers.Flatten(),
            k.layers.Dense(10, activation="softmax"),
        ]
    )


def iris_mlp() -> Any:
    """A small dense net for iris: 4 inputs, 10 relu units, 3 softmax outputs."""
    k = keras()
    return k.Sequential(
        [
            k.layers.InputLayer(input_shape=(4,)),
            k.layers.Dense(10, activation="relu"),
            k.layers.Dense(3, activation="softmax"),
        ]
    )


def tiny_backbone(seed: int = 1, input_shape: tuple[int, ...] = (32, 32, 3)) -> Any:
    """A small conv net, seeded: the same weights every time for the same seed."""
    k = keras()
    k.utils.set_random_seed(seed)
    inputs = k.Input(input_shape, name="images")
    x = k.layers.Conv2D(8, 3, activation="relu", name="conv1")(inputs)
    x = k.layers.MaxPooling2D(name="pool1")(x)
    x = k.layers.Conv2D(16, 3, activation="relu", name="conv2")(x)
    return k.Model(inputs, x, name="tiny_backbone")
