"""tf.data pipelines over local shared-memory views: copies per batch, never of the dataset.

No ``from_tensor_slices`` of whole arrays (a full copy, and a 2 GB graph-constant limit): a
generator gathers the rows of a group of batches from the views (one copy, at most
``GROUP_BYTES``), and ``unbatch`` slices each batch out of the group inside TensorFlow.

Both packed formats are read. The float32 format (x normalized, y one-hot) goes to Keras as
it is. The compact format (summary ``storage.compact``: uint8 x, y as class indices) is turned
into the same float32 x and one-hot y by one ``map`` per batch inside TensorFlow (a cast, a
division by ``normalizing_const``, ``tf.one_hot``: vectorised, parallel, no Python per row),
so a trainer sees the same tensors whichever format the dataset has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.resolve.batches import BatchPlan
from dvml.resolve.partitions import LocalPartitions

__all__ = ["evaluation_dataset", "evaluation_steps", "training_dataset"]


# A training generator call gathers up to this many bytes (and batches, below): the
# per-call cost of from_generator (a Python call, a py_func, the GIL) is paid once per group
# instead of once per batch. With the digits CNN at batch 128 on one thread that halved the
# time per step (3.1 ms to 1.6 ms), faster than from_tensor_slices(...).shuffle().batch().
GROUP_BYTES = 8 * 2**20
MAX_GROUP = 64


def _stored(parts: LocalPartitions) -> dict[str, Any]:
    """The packed format of ``parts``: each field's dtype and whether each y holds indices
    (one y per output of a multi-output set)."""
    n_y = len(parts.y_fields)
    if not parts.compact:
        return {"x": ["float32"] * len(parts.x_fields), "y": ["float32"] * n_y,
                "indices": [False] * n_y}  # fmt: skip
    storage = parts.summary["storage"]
    # labels already one-hot encoded stay one-hot float32 in the compact format
    kinds = storage.get("ys") or [storage.get("y", "index")]
    dtypes = storage.get("y_dtypes") or [storage["y_dtype"]]
    return {"x": list(storage["x_dtypes"]), "y": list(dtypes),
            "indices": [kind == "index" for kind in kinds]}  # fmt: skip


def _y_shapes(parts: LocalPartitions) -> list[list[int]]:
    return list(parts.summary.get("y_shapes") or [parts.summary["y_shape"]])


def _signature(parts: LocalPartitions, lead: tuple[Any, ...] = (None,)) -> tuple[Any, Any]:
    """What the generator yields: the fields as they are stored."""
    tf = tf_runtime.tensorflow()
    stored = _stored(parts)
    y_shapes = _y_shapes(parts)

    def y_spec(k: int) -> Any:
        shape = () if stored["indices"][k] else tuple(y_shapes[k])
        return tf.TensorSpec(shape=(*lead, *shape), dtype=tf.as_dtype(stored["y"][k]))

    def spec(field: str) -> Any:
        k = int(field[2:])
        shape = tuple(parts.summary["x_shapes"][k])
        return tf.TensorSpec(shape=(*lead, *shape), dtype=tf.as_dtype(stored["x"][k]))

    xs = tuple(spec(f) for f in parts.x_fields)
    ys = tuple(y_spec(k) for k in range(len(parts.y_fields)))
    return (xs[0] if len(xs) == 1 else xs), (ys[0] if len(ys) == 1 else ys)


def _decoded(dataset: Any, parts: LocalPartitions) -> Any:
    """``dataset`` (of batches as stored) as float32 x, normalized, and one-hot y: unchanged
    for the float32 format; one fused, parallel ``map`` per batch for the compact one."""
    stored = _stored(parts)
    if not any(stored["indices"]) and all(d == "float32" for d in stored["x"]):
        return dataset
    tf = tf_runtime.tensorflow()
    const = float(parts.summary["normalizing_const"])
    depths = [int(s[0]) for s in _y_shapes(parts)]
    raw = [d != "float32" for d in stored["x"]]

    def x_of(x: Any, k: int) -> Any:
        if not raw[k]:
            return x
        x = tf.cast(x, tf.float32)
        return x / const if const != 1.0 else x

    def y_of(y: Any, k: int) -> Any:
        if not stored["indices"][k]:
            return y
        return tf.one_hot(tf.cast(y, tf.int32), depths[k], dtype=tf.float32)

    def decode(x: Any, y: Any) -> tuple[Any, Any]:
        xs = tuple(x_of(v, k) for k, v in enumerate(x)) if isinstance(x, tuple) else x_of(x, 0)
        ys = tuple(y_of(v, k) for k, v in enumerate(y)) if isinstance(y, tuple) else y_of(y, 0)
        return xs, ys

    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _as_inputs(
    batch: dict[str, np.ndarray], x_fields: list[str], y_fields: list[str]
) -> tuple[Any, Any]:
    xs = tuple(batch[f] for f in x_fields)
    ys = tuple(batch[f] for f in y_fields)
    return (xs[0] if len(xs) == 1 else xs), (ys[0] if len(ys) == 1 else ys)


def _trainer_options(dataset: Any) -> Any:
    """``dataset`` with the options of a pipeline that shares its host's cores."""
    tf = tf_runtime.tensorflow()

    options = tf.data.Options()
    # Each trainer already reads only its own partitions; sharding again would drop data.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # No autotuning: its optimisation thread, in trainers that each own one core of a shared
    # host, cost one of two trainers ~1.2 s of a 1.9-s fit in one run of three (the B20 job,
    # digits CNN, batch 128: 3.1 s against 1.9 s, measured in standalone processes; with
    # autotune off 8 of 8 runs took 1.85-1.93 s). Nothing here needs tuning: the buffers are
    # fixed (prefetch(2)), and a parallel map's AUTOTUNE then means one call per core.
    # A user's own options (``dataset.with_options``) still win.
    options.autotune.enabled = False
    return dataset.with_options(options)


def training_dataset(
    parts: LocalPartitions,
    batch_size: int,
    steps: int,
    seed: int,
    shuffle: bool = True,
    augment: Callable[[Any], Any] | None = None,
    first_epoch: int = 0,
    row_weight: float | None = None,
) -> Any:
    """An endless dataset (infinite cardinality) of ``steps`` batches per epoch, reshuffled by
    index every epoch; with ``steps`` of :func:`~dvml.resolve.batches.steps_covering` the last
    batch of each epoch is short and every local row is trained once per epoch.

    Epoch ``e``'s order is a function of ``seed`` and ``e`` alone
    (:class:`~dvml.resolve.batches.BatchPlan`): a dataset built with ``first_epoch=e`` yields
    what the dataset built with ``first_epoch=0`` yields from its epoch ``e`` on. That is the
    data position a job resumes at: a training run that builds a new dataset for each call of
    ``model.fit`` (each iteration) or after a restart continues with the next unseen epoch
    instead of replaying epoch 0.

    The generator gathers a group of batches per call (one copy of their rows, shaped
    ``(group, batch_size, ...)``) and ``unbatch`` hands them to Keras one batch at a time.
    ``augment`` (``x -> x`` on one batch of inputs, after decoding) runs in a parallel ``map``
    on every batch: each epoch draws new random transforms.

    ``row_weight`` (``sync="step"`` with unequal local batches): every element becomes
    ``(x, y, sample_weight)`` with this weight on each row, so that the step's gradient stays
    the mean over the global batch's rows (:func:`dvml.resolve.batches.row_weights`).
    """
    tf = tf_runtime.tensorflow()

    plan = BatchPlan(tuple(parts.buffer_rows), batch_size, steps, seed)
    x_fields, y_fields = parts.x_fields, parts.y_fields
    group = _group_size(parts, batch_size, steps)
    short = plan.short_batch

    def gathered(chunk: list[Any], size: int) -> tuple[Any, Any]:
        rows = parts.take([piece for pieces in chunk for piece in pieces])
        shaped = {f: a.reshape(len(chunk), size, *a.shape[1:]) for f, a in rows.items()}
        return _as_inputs(shaped, x_fields, y_fields)

    def groups() -> Iterator[tuple[Any, Any]]:
        epoch = int(first_epoch)
        while True:
            batches = list(plan.epoch(epoch, shuffle))
            full = batches[:-1] if short else batches
            for start in range(0, len(full), group):
                yield gathered(full[start : start + group], batch_size)
            if short:  # the epoch's last rows: a group of its own, one smaller batch
                yield gathered(batches[-1:], short)
            epoch += 1

    # A short last batch makes the batch dimension vary (one trace of the train step all the
    # same: Keras traces for the dataset's element spec, whose batch dimension is then None).
    signature = _signature(parts, lead=(None, None if short else batch_size))
    dataset = tf.data.Dataset.from_generator(groups, output_signature=signature).unbatch()
    dataset = _decoded(dataset, parts)
    if augment is not None:
        dataset = dataset.map(
            lambda x, y: (augment(x), y), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
    if row_weight is not None:
        weight = tf.constant(row_weight, tf.float32)

        def weighted(x: Any, y: Any) -> tuple[Any, Any, Any]:
            rows = tf.shape(tf.nest.flatten(y)[0])[0]  # a short last batch too
            return x, y, tf.fill([rows], weight)

        dataset = dataset.map(weighted, deterministic=True)
    # Endless, and saying so: for a dataset of unknown length MultiWorkerMirroredStrategy's
    # iterator all-reduces at every step whether each trainer still has a batch (one gRPC
    # round trip per step on CPU, see dvml.train.runtime.step_collectives).
    endless = tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
    return _trainer_options(dataset.apply(endless).prefetch(2))


def _group_size(parts: LocalPartitions, batch_size: int, steps: int) -> int:
    """Batches gathered per generator call: at most GROUP_BYTES, MAX_GROUP and one epoch."""
    row_bytes = sum(arrays[0][:1].nbytes for arrays in parts.fields.values() if arrays)
    by_bytes = GROUP_BYTES // max(1, row_bytes * batch_size)
    return int(max(1, min(by_bytes, MAX_GROUP, steps)))


def evaluation_steps(parts: LocalPartitions, batch_size: int) -> int:
    """How many batches :func:`evaluation_dataset` yields: a model compiled to run several
    steps per call (``steps_per_execution`` in ``compile_params``) cannot evaluate a dataset
    of unknown length without it."""
    return sum(-(-int(rows) // batch_size) for rows in parts.buffer_rows)


def evaluation_dataset(parts: LocalPartitions, batch_size: int) -> Any:
    """Every local row once, in order, the last batch possibly smaller."""
    tf = tf_runtime.tensorflow()

    x_fields, y_fields = parts.x_fields, parts.y_fields

    def batches() -> Iterator[tuple[Any, Any]]:
        for b, rows in enumerate(parts.buffer_rows):
            for start in range(0, rows, batch_size):
                idx = np.arange(start, min(rows, start + batch_size))
                yield _as_inputs(parts.take([(b, idx)]), x_fields, y_fields)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=_signature(parts))
    return _trainer_options(_decoded(dataset, parts).prefetch(2))
