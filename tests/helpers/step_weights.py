"""One step of a two-output model, run three ways, for tests/train/test_step_weights.

``python -m tests.helpers.step_weights trainer WEIGHTED`` (with ``TF_CONFIG``, once per
trainer): a MultiWorkerMirroredStrategy trainer whose local batch is the first 6 of the 8
global rows (trainer 0) or the last 2 (trainer 1), each row weighted ``n * b / B`` when
WEIGHTED is 1 (dvml.resolve.tfdata's ``row_weight``) and unweighted when 0; trainer 0 first
runs dvml's speed probe alone (a collective in it would wait for trainer 1, which runs none).
``python -m tests.helpers.step_weights single 0``: one process, the 8 rows in one batch.
Each prints ``WEIGHTS {json}``: the weights after one SGD step from the same start.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

GLOBAL_BATCH = 8
SPLIT = (6, 2)  # unequal local batches: trainer 0 holds 6 rows of a step, trainer 1 holds 2


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(GLOBAL_BATCH, 5)).astype("float32")
    ya = rng.normal(size=(GLOBAL_BATCH, 2)).astype("float32")
    yb = np.eye(3, dtype="float32")[rng.integers(0, 3, GLOBAL_BATCH)]
    return x, ya, yb


def _model(tf_keras: object) -> object:
    keras = tf_keras
    inputs = keras.Input((5,))  # type: ignore[attr-defined]
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)  # type: ignore[attr-defined]
    a = keras.layers.Dense(2, name="a")(hidden)  # type: ignore[attr-defined]
    b = keras.layers.Dense(3, activation="softmax", name="b")(hidden)  # type: ignore[attr-defined]
    model = keras.Model(inputs, [a, b])  # type: ignore[attr-defined]
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5),  # type: ignore[attr-defined]
                  loss=["mse", "categorical_crossentropy"])  # fmt: skip
    return model


def main(mode: str, weighted: bool) -> None:
    import tensorflow as tf
    import tf_keras

    x, ya, yb = _data()
    if mode == "single":
        model = _model(tf_keras)
        model.fit(x, [ya, yb], batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    else:
        from dvml.train.runtime.speed_probe import SpeedProbe

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        start = 0 if index == 0 else SPLIT[0]
        rows = slice(start, start + SPLIT[index])
        weight = len(SPLIT) * SPLIT[index] / GLOBAL_BATCH if weighted else 1.0
        with strategy.scope():
            model = _model(tf_keras)
        if index == 0:
            seconds, _ = SpeedProbe(model, tf.constant(x[rows]), tf).measure(0.05)
            print("PROBE", seconds, flush=True)

        def dataset_fn(context: object) -> object:
            local = (x[rows], (ya[rows], yb[rows]), np.full(SPLIT[index], weight, "float32"))
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.OFF
            )
            data = tf.data.Dataset.from_tensors(local).repeat()
            return data.with_options(options)

        creator = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
        model.fit(creator, epochs=1, steps_per_epoch=1, verbose=0)
    print("WEIGHTS", json.dumps([w.tolist() for w in model.get_weights()]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1")
