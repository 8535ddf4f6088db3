"""The batch of the metrics pass: how many rows a trainer evaluates at once.

Pure. Used by the trainers (:mod:`dvml.train.runtime.local_model`) and by the memory plans
(:mod:`dvml.placement.fit_memory`, :mod:`dvml.placement.hop_memory`), which count that batch.
"""

from __future__ import annotations

__all__ = ["EVAL_BYTES", "EVAL_SCALE", "evaluation_batch"]

# The metrics pass (every local row once, at the end of an iteration, and evaluate) reads
# batches of up to EVAL_SCALE training batches and EVAL_BYTES of float32 x: its cost per batch
# (a generator call, a Keras step) was most of the pass at small batches (the retrain workflow
# of B24c: 4 s for 440,000 rows at batch 256). The metrics are means over rows, so the batch
# does not change them. The bytes bound keeps image models at their training batch, where a
# larger one would raise the peak of the forward pass's activations.
EVAL_BYTES = 2 * 2**20
EVAL_SCALE = 16


def evaluation_batch(batch_size: int, row_values: int) -> int:
    """Rows per batch of the metrics pass: ``batch_size`` times up to ``EVAL_SCALE``, within
    ``EVAL_BYTES`` of float32 x (``row_values`` values per row), never below ``batch_size``.

    >>> evaluation_batch(256, 64)
    4096
    >>> evaluation_batch(32, 224 * 224 * 3)
    32
    """
    by_bytes = EVAL_BYTES // max(1, 4 * row_values * batch_size)
    return int(batch_size * max(1, min(EVAL_SCALE, by_bytes)))
