"""Model averaging between trainers, in the trainer process (loads TensorFlow).

The trainers still create a ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``: it sets up the
collective context between them. For ``sync="iteration"`` and ``sync=k`` the model is built
OUTSIDE the strategy's scope and trained with a plain ``model.fit`` on local rows; averaging is
ONE all-reduce (a TensorFlow collective, directly between the trainers, never through the
Dask client) of the flattened weights times the trainer's row count, with the row count
appended. The sum is computed in float64, so weights that are identical on every trainer
(frozen layers) come back bit for bit, and a ring all-reduce hands every trainer the same
bits, so the averaged weights are identical everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dvml.train.sync import flatten, unflatten

__all__ = ["Averager", "averaging_callback"]


class Averager:
    """Averages a model's weights over all trainers, weighted by ``rows``."""

    def __init__(self, strategy: Any, rows: int) -> None:
        self.strategy, self.rows = strategy, int(rows)
        self.count, self.seconds = 0, 0.0

    def all_reduce(self, vector: np.ndarray) -> np.ndarray:
        """The element-wise SUM of ``vector`` over every trainer."""
        from dvml import tf_runtime

        tf = tf_runtime.tensorflow()
        tensor = tf.constant(vector)
        distributed = self.strategy.experimental_distribute_values_from_function(
            lambda context: tensor
        )
        total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, distributed, axis=None)
        return np.asarray(total.numpy())

    def broadcast(self, model: Any, chief: bool) -> None:
        """Give every trainer the chief's weights (bit for bit).

        Each trainer builds its model outside the strategy's scope, so nothing else makes
        their random initial weights equal; averaging models that started apart destroys
        them. The others add zeros, so the sum is the chief's weights exactly.
        """
        weights = model.get_weights()
        vector = flatten(weights) if chief else np.zeros(sum(w.size for w in weights))
        model.set_weights(unflatten(self.all_reduce(vector), weights))

    def average(self, model: Any) -> None:
        """Replace every weight of ``model`` by the row-weighted mean over the trainers."""
        import time

        started = time.perf_counter()
        weights = model.get_weights()
        vector = np.append(flatten(weights) * float(self.rows), float(self.rows))
        total = self.all_reduce(vector)
        model.set_weights(unflatten(total[:-1] / total[-1], weights))
        self.count += 1
        self.seconds += time.perf_counter() - started


def averaging_callback(keras: Any, averager: Averager, every: int) -> Any:
    """A Keras callback that averages every ``every`` batches (local SGD, ``sync=k``).

    Every trainer runs the same number of steps (``steps_per_epoch`` is equal everywhere), so
    all of them reach each average together. :meth:`flush` averages what is left at the end
    of an iteration, so each iteration ends on identical weights.
    """

    class EveryKSteps(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.since = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.since += 1
            if self.since >= every:
                averager.average(self.model)
                self.since = 0

        def flush(self, model: Any) -> None:
            if self.since:
                averager.average(model)
                self.since = 0

    return EveryKSteps()
