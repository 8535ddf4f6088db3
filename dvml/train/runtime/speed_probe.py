"""A ``sync="step"`` trainer's own speed, measured where lock-step hides it.

Under MultiWorkerMirroredStrategy the gradient all-reduce is inside the compiled train step,
so every trainer's step lasts as long as the slowest one's: the per-iteration ``fit_seconds``
of a fast and a slow trainer are equal, and the straggler rule (:mod:`dvml.train.stragglers`)
has nothing to compare. :class:`SpeedProbe` measures what the lock-step hides: once per
iteration, at the end of its ``fit``'s first epoch (:meth:`SpeedProbe.callback`: every trainer
at the same moment), each trainer times forward and backward passes of the model on its own
local rows, with no collective.

Why no collective runs: the probe is a ``tf.function`` that computes the gradients with a
``GradientTape`` and applies none, on a model with the trainer's architecture whose variables
are plain (the trainer's evaluator, built outside the strategy's scope): nothing in it can
all-reduce. (A model built in the scope works too, called outside ``fit``; inside ``fit``'s
callbacks, which run in the strategy's scope, reading a mirrored variable's handle fails.) A
probe run on one trainer of two while the other does nothing returns
(tests/train/test_step_weights.py): a collective would wait for the peer. The layers and the
batch are the trainer's, so the work is its step's forward and backward passes; the weights'
values do not change the time.

The passes run in inference mode (``training=False``): no batch-norm statistic or other
model state changes, and the cost of a forward and backward pass is the same as in training
to within the dropout masks. The loss is the sum of the outputs: the gradient's cost does not
depend on the loss function, and no compiled metric or loss tracker is touched.

Every trainer probes the same work: a pass over the even share of the global batch
(``probe_batch``, what the lock-step launch tells each ``sync="step"`` trainer), on its own
rows, whatever its own share of the batch (a trainer that gave rows away for its speed runs
smaller steps, and a step's time is not linear in tiny batches): the figures of two trainers
compare their speeds, not their shares.

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
        self.batch_size = int(tf.nest.flatten(x)[0].shape[0])  # rows per probed pass
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
        self.last: tuple[float, float] | None = None  # the last measure()

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
        self.last = ((end - start) / n, end - began)
        return self.last

    def callback(self, keras: Any) -> Any:
        """A Keras callback that measures once per ``fit``, at the end of its first epoch.

        Why there: ``fit`` has just summed the epoch's metrics over the trainers (a collective,
        dvml.train.runtime.step_collectives), so every trainer probes at the same moment, each
        while the others probe too, as they train. A probe before ``fit`` ran while a slower
        trainer was still starting (tracing, reading): the fast one's probe competed with
        that work for the host's cores and named the fast one (seen on a 2-core host).
        """
        probe = self

        class _Probe(keras.callbacks.Callback):
            def on_train_begin(self, logs: Any = None) -> None:
                probe.last, self.done = None, False

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                if not self.done:
                    probe.measure()
                    self.done = True

        return _Probe()


def local_probe(model: Any, train: Any, batch_size: int, tf: Any) -> SpeedProbe:
    """A probe of ``model`` on ``batch_size`` rows of the trainer's local partitions (``train``,
    :func:`dvml.resolve.partitions.open_local`), decoded as training decodes them: the first
    ones, repeated when it holds fewer (a trainer that gave rows away probes the same work)."""
    from dvml.resolve.tfdata import training_dataset

    # one batch, in stored order: one copy of batch_size rows, held for the whole fit
    held = max(1, min(batch_size, int(train.rows)))
    x = next(iter(training_dataset(train, held, 1, 0, shuffle=False)))[0]
    if held < batch_size:
        x = tf.nest.map_structure(lambda t: tf.gather(t, tf.range(batch_size) % held), x)
    probe = SpeedProbe(model, x, tf)
    probe.batch_size = batch_size
    probe.measure(0.0, 1)  # traced now, before the fit: the trace is not the model's speed
    return probe
