"""tf.data pipelines over local shared-memory views: one copy per batch, never more.

No ``from_tensor_slices`` of whole arrays (a full copy, and a 2 GB graph-constant limit): a
generator gathers each batch's rows from the views and hands TensorFlow that batch only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.resolve.batches import BatchPlan
from dvml.resolve.partitions import LocalPartitions

__all__ = ["evaluation_dataset", "training_dataset"]


def _signature(parts: LocalPartitions) -> tuple[Any, Any]:
    tf = tf_runtime.tensorflow()

    def spec(field: str) -> Any:
        shape = tuple(
            parts.summary["y_shape"] if field == "y" else parts.summary["x_shapes"][int(field[2:])]
        )
        return tf.TensorSpec(shape=(None, *shape), dtype=tf.float32)

    xs = tuple(spec(f) for f in parts.x_fields)
    return (xs[0] if len(xs) == 1 else xs), spec("y")


def _as_inputs(batch: dict[str, np.ndarray], x_fields: list[str]) -> tuple[Any, np.ndarray]:
    xs = tuple(batch[f] for f in x_fields)
    return (xs[0] if len(xs) == 1 else xs), batch["y"]


def _no_autoshard(dataset: Any) -> Any:
    tf = tf_runtime.tensorflow()

    options = tf.data.Options()
    # Each trainer already reads only its own partitions; sharding again would drop data.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def training_dataset(
    parts: LocalPartitions, batch_size: int, steps: int, seed: int, shuffle: bool = True
) -> Any:
    """An endless dataset of ``steps`` batches per epoch, reshuffled by index every epoch."""
    tf = tf_runtime.tensorflow()

    plan = BatchPlan(parts.buffer_rows, batch_size, steps, seed)
    x_fields = parts.x_fields

    def batches() -> Iterator[tuple[Any, np.ndarray]]:
        epoch = 0
        while True:
            for pieces in plan.epoch(epoch, shuffle):
                yield _as_inputs(parts.take(pieces), x_fields)
            epoch += 1

    dataset = tf.data.Dataset.from_generator(batches, output_signature=_signature(parts))
    return _no_autoshard(dataset.prefetch(2))


def evaluation_dataset(parts: LocalPartitions, batch_size: int) -> Any:
    """Every local row once, in order, the last batch possibly smaller."""
    tf = tf_runtime.tensorflow()

    x_fields = parts.x_fields

    def batches() -> Iterator[tuple[Any, np.ndarray]]:
        for b, rows in enumerate(parts.buffer_rows):
            for start in range(0, rows, batch_size):
                idx = np.arange(start, min(rows, start + batch_size))
                yield _as_inputs(parts.take([(b, idx)]), x_fields)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=_signature(parts))
    return _no_autoshard(dataset.prefetch(2))
