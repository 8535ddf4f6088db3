"""A ``sync="step"`` trainer's own speed, measured where lock-step hides it.

Under MultiWorkerMirroredStrategy the gradient all-reduce is inside the compiled train step,
so every trainer's step lasts as long as the slowest one's: the per-iteration ``fit_seconds``
of a fast and a slow trainer are equal, and the straggler rule (:mod:`dvml.train.stragglers`)
has nothing to compare. :class:`SpeedProbe` measures what the lock-step hides: before each
iteration's ``fit``, each trainer times forward and backward passes of the model on one of
its own local batches (its share of the global batch), alone, with no collective.

Why no collective runs: the probe is a ``tf.function`` that computes the gradients with a
``GradientTape`` and applies none, called in the strategy's cross-replica context. Reading a
mirrored variable there reads the local copy; only ``strategy.run`` with an optimizer (or an
explicit ``reduce``) all-reduces. A probe run on one trainer of two while the other does
nothing returns (tests/train/test_step_weights.py): a collective would wait for the peer.

The passes run in inference mode (``training=False``): no batch-norm statistic or other
model state changes, and the cost of a forward and backward pass is the same as in training
to within the dropout masks. The loss is the sum of the outputs: the gradient's cost does not
depend on the loss function, and no compiled metric or loss tracker is touched.

How long: until ``min_seconds`` (:data:`PROBE_SECONDS`, 0.25 s) of wall time passed and at
least ``min_passes``. A slowdown that comes and goes faster than that (a CPU quota, a
SIGSTOP/SIGCONT duty cycle of 100 ms, a neighbour's bursts) is averaged over it; a probe of a
few passes would land in a running or a stopped phase and say 1x or 10x. The first call
traces the function and is not counted.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["MIN_PASSES", "PROBE_SECONDS", "SpeedProbe", "local_probe"]

PROBE_SECONDS = 0.25
"""Least wall time of one probe: two and a half periods of a 100-ms duty cycle."""

MIN_PASSES = 3


class SpeedProbe:
    """Times forward and backward passes of ``model`` on one local batch ``x``.

    Parameters
    ----------
    model : tf_keras.Model
        The trainer's model (built in the strategy's scope or not).
    x : tensor or tuple of tensors
        One local batch of inputs (the trainer's per-worker batch of rows).
    tf : module
        TensorFlow.
    """

    def __init__(self, model: Any, x: Any, tf: Any) -> None:
        self.x, self.tf = x, tf
        variables = model.trainable_variables

        @tf.function
        def passes(x: Any) -> Any:
            with tf.GradientTape() as tape:
                outputs = tf.nest.flatten(model(x, training=False))
                total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in outputs])
            grads = tape.gradient(total, variables)
            return tf.add_n([tf.reduce_sum(g) for g in grads if g is not None] + [total])

        self._passes = passes
        self._traced = False

    def measure(
        self, min_seconds: float = PROBE_SECONDS, min_passes: int = MIN_PASSES
    ) -> tuple[float, float]:
        """Run passes until ``min_seconds`` and ``min_passes``; return the seconds per pass and
        the probe's whole wall time (what it cost, tracing included)."""
        began = time.monotonic()
        if not self._traced:  # the trace is not the model's speed
            self._passes(self.x).numpy()
            self._traced = True
        n, start = 0, time.monotonic()
        while n < min_passes or time.monotonic() - start < min_seconds:
            # .numpy() waits for the pass: the time is the work's, not its dispatch's
            self._passes(self.x).numpy()
            n += 1
        end = time.monotonic()
        return (end - start) / n, end - began


def local_probe(model: Any, train: Any, batch_size: int, tf: Any) -> SpeedProbe:
    """A probe of ``model`` on the first ``batch_size`` rows of the trainer's local partitions
    (``train``, :func:`dvml.resolve.partitions.open_local`), decoded as training decodes them."""
    from dvml.resolve.tfdata import training_dataset

    # one batch, in stored order: one copy of batch_size rows, held for the whole fit
    x = next(iter(training_dataset(train, batch_size, 1, 0, shuffle=False)))[0]
    return SpeedProbe(model, x, tf)
