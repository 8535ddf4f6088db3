"""The example data and model that ship with dvml: scikit-learn's digits and a small CNN.

Used by the demo (:mod:`dvml.demo`) and by job files that name ``sklearn:digits`` or the
``digits_cnn`` architecture (:mod:`dvml.jobs`). Nothing here touches a cluster.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMPILE_PARAMS", "digits_cnn_json", "digits_frame"]

# The compile parameters the demo trains the CNN with.
COMPILE_PARAMS = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', metrics=['accuracy']"
)


def digits_frame(seed: int = 0) -> Any:
    """scikit-learn's digits as a shuffled DataFrame: ``id``, ``pixels`` (8x8x1), ``label``."""
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {
            "id": np.arange(len(d.target)),
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target,
        }
    )
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def digits_cnn_json() -> str:
    """A small CNN for 8x8x1 digits, as Keras JSON (loads tf-keras)."""
    from dvml import tf_runtime

    keras = tf_runtime.keras()

    model = keras.Sequential(
        [
            keras.layers.InputLayer(input_shape=(8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    return str(model.to_json())
