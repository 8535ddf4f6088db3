"""One ``sync="step"`` trainer as dvml's trainer sets it up, for tests/train/test_step_collectives.

Run as ``python -m tests.helpers.step_probe STEPS`` with ``TF_CONFIG`` (and dvml's thread
budget) in the environment, once per trainer: it builds the digits CNN in a
MultiWorkerMirroredStrategy scope, trains ``STEPS`` steps on its own rows through dvml's
training dataset, and prints one ``PROBE {json}`` line: the all-reduces in the traced train
function, the epoch's logs, the last step's logs and a hash of the final weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np


def main(steps: int) -> None:
    from dvml import tf_runtime
    from dvml.resolve.partitions import LocalPartitions
    from dvml.resolve.tfdata import training_dataset
    from dvml.train.runtime.step_collectives import local_step_metrics, steps_per_execution
    from tests.helpers.models import cnn

    tf = tf_runtime.start()
    keras = tf_runtime.keras()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    rng = np.random.default_rng(task)  # each trainer its own rows
    rows = 256
    x = rng.random((rows, 8, 8, 1), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, rows)]
    parts = LocalPartitions(
        name="probe",
        summary={"x_shapes": [[8, 8, 1]], "y_shape": [10]},
        instance_id=task,
        buffer_indices=[0],
        fields={"x_0": [x], "y": [y]},
    )
    with strategy.scope():
        tf.random.set_seed(1)
        model = keras.models.model_from_json(cnn().to_json())
        model.compile(
            loss="categorical_crossentropy",
            optimizer="adam",
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution(steps),
        )
        local_step_metrics(model, tf)
    last_step: dict[str, float] = {}

    class LastStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
            last_step.update({k: float(v) for k, v in (logs or {}).items()})

    creator = keras.utils.experimental.DatasetCreator(
        lambda context: training_dataset(parts, 16, steps, seed=task)
    )
    history = model.fit(creator, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[LastStep()])
    graph = model.train_tf_function._list_all_concrete_functions()[0].graph.as_graph_def()
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
    weights = b"".join(w.tobytes() for w in model.get_weights())
    print(
        "PROBE "
        + json.dumps(
            {
                "all_reduces": sum(op.startswith("CollectiveReduce") for op in ops),
                "epoch": {k: float(v[-1]) for k, v in history.history.items()},
                "last_step": last_step,
                "weights": hashlib.sha256(weights).hexdigest(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
