"""Steps of a two-output model, run three ways, for tests/train/test_step_weights.

``python -m tests.helpers.step_weights trainer WEIGHTED`` (with ``TF_CONFIG``, once per
trainer): a MultiWorkerMirroredStrategy trainer whose local batch is the first 6 of the 8
global rows (trainer 0) or the last 2 (trainer 1), each row weighted ``n * b / B`` when
WEIGHTED is 1 (dvml.resolve.tfdata's ``row_weight``) and unweighted when 0, its all-reduce
timed by dvml (dvml.train.runtime.collective_wait); trainer 1's input sleeps NAP seconds per
batch, so trainer 0 waits for it in the all-reduce. It prints ``WAIT seconds`` too.
``python -m tests.helpers.step_weights single 0``: one process, the 8 rows in one batch.
Each prints ``WEIGHTS {json}``: the weights after STEPS SGD steps from the same start.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

GLOBAL_BATCH = 8
SPLIT = (6, 2)  # unequal local batches: trainer 0 holds 6 rows of a step, trainer 1 holds 2
STEPS = 4
NAP = 0.15


def _nap() -> float:
    import time

    time.sleep(NAP)
    return 0.0


def _slept(tf: object) -> object:
    nap = tf.py_function(_nap, [], tf.float32)  # type: ignore[attr-defined]
    return tf.ensure_shape(nap, [])  # type: ignore[attr-defined]


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
        model.fit(x, [ya, yb], batch_size=GLOBAL_BATCH, epochs=STEPS, shuffle=False, verbose=0)
    else:
        from dvml.train.runtime.collective_wait import time_collective

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        start = 0 if index == 0 else SPLIT[0]
        rows = slice(start, start + SPLIT[index])
        weight = len(SPLIT) * SPLIT[index] / GLOBAL_BATCH if weighted else 1.0
        with strategy.scope():
            model = _model(tf_keras)
        timer = time_collective(model, tf)

        def dataset_fn(context: object) -> object:
            local = (x[rows], (ya[rows], yb[rows]), np.full(SPLIT[index], weight, "float32"))
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.OFF
            )
            data = tf.data.Dataset.from_tensors(local).repeat()
            if index == 1:  # a slow input: trainer 0 waits for it in every step's all-reduce
                data = data.map(lambda x, y, w: (x + _slept(tf), y, w))
            return data.with_options(options)

        creator = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
        model.fit(creator, epochs=1, steps_per_epoch=STEPS, verbose=0)
        print("WAIT", timer.seconds(), flush=True)
    print("WEIGHTS", json.dumps([w.tolist() for w in model.get_weights()]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1")
