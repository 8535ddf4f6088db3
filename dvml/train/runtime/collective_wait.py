"""A ``sync="step"`` trainer's wait in the gradient all-reduce, timed inside the train step.

Under MultiWorkerMirroredStrategy the gradient all-reduce is inside the compiled train step,
so every trainer's step lasts as long as the slowest one's: the per-iteration
``fit_seconds`` of a fast and a slow trainer are equal and the straggler rule
(:mod:`dvml.train.stragglers`) had nothing to compare. What differs is where the time goes:
a fast trainer reaches the all-reduce first and waits in it for the slow one, which arrives
last and waits only for the transfer. :func:`time_collective` wraps the optimizer's gradient
aggregation (the one all-reduce of a step, :mod:`dvml.train.runtime.step_collectives`) in two
``tf.timestamp`` ops, ordered by control dependencies after the local gradients exist and
after the reduced gradients do, and adds the difference to a plain (not mirrored) variable
of the trainer; ``fit``'s eager sum of the metrics over the trainers at each epoch's end (the
other collective of an epoch) is timed too. Per iteration the trainer reports the sum as
``averaging_seconds``, the field in which ``sync="iteration"`` and an int ``k`` report their
averaging's wait, so ``fit_seconds - averaging_seconds`` is its own input and compute over
the whole iteration.

Why this and not a probe: an earlier design timed forward and backward passes of the model
on each trainer alone for 0.25 s per iteration. On a 2-core host shared with other work (load
average 13) it named the FAST trainer in two runs of four: a quarter of a second of one
process's wall time is a draw of the scheduler. The timestamps cost two small ops per step
and measure the whole iteration, which is what the rule of ``sync="iteration"`` measures too.

The gradient values pass through unchanged (identities after a control dependency), so the
weights stay what they were (tests/train/test_step_weights.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["CollectiveTimer", "time_collective"]


class CollectiveTimer:
    """The seconds a trainer spent in its collectives so far: its steps' gradient all-reduce
    (a float64 variable the traced step adds to) and the epochs' metric sums (eager)."""

    def __init__(self, tf: Any) -> None:
        # created outside the strategy's scope (the caller's duty): a plain variable, local
        # to this trainer, never mirrored nor all-reduced
        self.variable = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.tf = tf
        self.eager = 0.0
        # (monotonic time, seconds(), steps) at the end of a fit's first and last call of the
        # train function (steady_callback's)
        self.first: tuple[float, float, int] | None = None
        self.last: tuple[float, float, int] | None = None

    def seconds(self) -> float:
        return float(self.variable.numpy()) + self.eager

    def wrap_metrics(self, get_metrics_result: Callable[[], Any]) -> Callable[[], Any]:
        """``model.get_metrics_result``, its eager cross-replica calls timed: ``fit`` sums the
        metrics over the trainers once per epoch there, and a fast trainer waits in it too."""
        tf = self.tf

        def timed() -> Any:
            if not (tf.executing_eagerly() and tf.distribute.in_cross_replica_context()):
                return get_metrics_result()
            began = time.monotonic()
            try:
                return get_metrics_result()
            finally:
                self.eager += time.monotonic() - began

        return timed

    def steady_callback(self, keras: Any) -> Any:
        """A callback that marks, in each ``fit``, the end of its first call of the train
        function and of its last: :attr:`first` and :attr:`last` hold ``(monotonic time,
        seconds() then, steps done)``, and :meth:`steady` the stretch between them.

        Only in that stretch do the trainers run in lock-step, every step ending in the same
        all-reduce. The first call traces the step (the first fit's) and opens the
        collectives, and a trainer slowed at large does it slowly while its peer waits in
        places the timestamps do not see. After the last step each trainer leaves ``fit`` on
        its own: measured on a 2-core machine, an undisturbed trainer spent up to 7 s there
        more than its peer, which named it a straggler of its first iteration (CI, and 2 runs
        of 12). The straggler rule reads the stretch only (:mod:`dvml.train.stragglers`).
        """
        timer = self

        class Steady(keras.callbacks.Callback):
            def on_train_begin(self, logs: Any = None) -> None:
                timer.first = timer.last = None
                self.epoch = 0

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.epoch = int(epoch)

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                # batch: the call's last step in its epoch, from 0
                done = self.epoch * int(self.params.get("steps") or 0) + int(batch) + 1
                timer.last = (time.monotonic(), timer.seconds(), done)
                if timer.first is None:
                    timer.first = timer.last

        return Steady()

    def steady(self) -> dict[str, float] | None:
        """The lock-step stretch of the last ``fit`` (:meth:`steady_callback`): its
        ``seconds``, its wait in the collectives (``averaging_seconds``) and its ``steps``;
        None for a fit of one call of the train function."""
        if self.first is None or self.last is None or self.last[2] <= self.first[2]:
            return None
        return {
            "seconds": self.last[0] - self.first[0],
            "averaging_seconds": self.last[1] - self.first[1],
            "steps": self.last[2] - self.first[2],
        }

    def wrap(self, aggregate: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``aggregate`` (grads_and_vars -> grads_and_vars), timed."""
        tf, total = self.tf, self.variable

        def timed(grads_and_vars: Any) -> Any:
            pairs = list(grads_and_vars)
            local = [g for g, _ in pairs if g is not None]
            with tf.control_dependencies(tf.nest.flatten(local, expand_composites=True)):
                before = tf.timestamp()
            with tf.control_dependencies([before]):
                pairs = [(_same(tf, g), v) for g, v in pairs]
            reduced = list(aggregate(pairs))
            done = [g for g, _ in reduced if g is not None]
            with tf.control_dependencies(tf.nest.flatten(done, expand_composites=True)):
                added = total.assign_add(tf.timestamp() - before)
            with tf.control_dependencies([added]):
                return [(_same(tf, g), v) for g, v in reduced]

        return timed


def _same(tf: Any, gradient: Any) -> Any:
    """``gradient`` unchanged, as a new op (IndexedSlices stay IndexedSlices)."""
    if gradient is None:
        return None
    return tf.nest.map_structure(tf.identity, gradient, expand_composites=True)


def time_collective(model: Any, tf: Any) -> CollectiveTimer:
    """Time ``model``'s collectives: its optimizer's gradient all-reduce (tf-keras's optimizer
    or a legacy one) and the epochs' metric sums.

    Call it on the compiled model (after :func:`dvml.train.runtime.step_collectives.
    local_step_metrics`), outside the strategy's scope, before ``fit`` traces the train step.
    """
    timer = CollectiveTimer(tf)
    model.get_metrics_result = timer.wrap_metrics(model.get_metrics_result)
    optimizer = model.optimizer
    if hasattr(optimizer, "gradient_aggregator"):  # tf_keras.optimizers.legacy
        optimizer.gradient_aggregator = timer.wrap(optimizer.gradient_aggregator)
    else:
        optimizer.aggregate_gradients = timer.wrap(optimizer.aggregate_gradients)
    return timer
