"""The training pipeline over local views: groups of batches, one epoch = every planned row once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dvml.resolve import tfdata
from dvml.resolve.partitions import LocalPartitions

pytestmark = pytest.mark.tf


def _parts(rows: tuple[int, ...]) -> LocalPartitions:
    # Row r of the whole local data holds x = r (2 inputs) and a one-hot y of r % 3.
    start, xs0, xs1, ys = 0, [], [], []
    for n in rows:
        ids = np.arange(start, start + n, dtype=np.float32)
        xs0.append(np.repeat(ids[:, None], 4, axis=1))
        xs1.append(ids[:, None, None] * np.ones((1, 2, 2), np.float32))
        ys.append(np.eye(3, dtype=np.float32)[ids.astype(int) % 3])
        start += n
    return LocalPartitions(
        name="t",
        summary={"x_shapes": [[4], [2, 2]], "y_shape": [3]},
        instance_id=0,
        buffer_indices=list(range(len(rows))),
        fields={"x_0": xs0, "x_1": xs1, "y": ys},
    )


@pytest.mark.parametrize("group_bytes", [1, 10**9])  # one batch per call; every batch at once
def test_an_epoch_is_every_planned_row_once(
    monkeypatch: pytest.MonkeyPatch, group_bytes: int
) -> None:
    monkeypatch.setattr(tfdata, "GROUP_BYTES", group_bytes)
    parts = _parts((37, 50, 13))
    batch, steps = 8, 12  # 96 of the 100 rows per epoch
    dataset = tfdata.training_dataset(parts, batch, steps, seed=5)
    seen = []
    for (x0, x1), y in dataset.take(2 * steps):
        x0, x1, y = x0.numpy(), x1.numpy(), y.numpy()
        assert x0.shape == (batch, 4) and x1.shape == (batch, 2, 2) and y.shape == (batch, 3)
        ids = x0[:, 0].astype(int)
        np.testing.assert_array_equal(x1[:, 0, 0], ids)  # the inputs of a row stay together
        np.testing.assert_array_equal(y.argmax(axis=1), ids % 3)  # and with its label
        seen.append(ids)
    first, second = np.concatenate(seen[:steps]), np.concatenate(seen[steps:])
    assert len(set(first)) == len(first) == batch * steps
    assert len(set(second)) == batch * steps
    assert not np.array_equal(first, second)  # reshuffled every epoch


@pytest.mark.parametrize("group_bytes", [1, 10**9])
def test_with_covering_steps_every_row_is_trained_once_per_epoch_the_last_batch_short(
    monkeypatch: pytest.MonkeyPatch, group_bytes: int
) -> None:
    # sync="iteration" and the model hopper: 13 steps of 8 over 100 rows, the 13th of 4 rows
    from dvml.resolve.batches import steps_covering

    monkeypatch.setattr(tfdata, "GROUP_BYTES", group_bytes)
    parts = _parts((37, 50, 13))
    batch = 8
    steps = steps_covering(parts.rows, batch)
    assert steps == 13
    dataset = tfdata.training_dataset(parts, batch, steps, seed=5)
    sizes, seen = [], []
    for (x0, x1), y in dataset.take(3 * steps):
        ids = x0.numpy()[:, 0].astype(int)
        np.testing.assert_array_equal(x1.numpy()[:, 0, 0], ids)
        np.testing.assert_array_equal(y.numpy().argmax(axis=1), ids % 3)
        sizes.append(len(ids))
        seen.append(ids)
    assert sizes == ([batch] * 12 + [4]) * 3
    epochs = [np.concatenate(seen[e * steps : (e + 1) * steps]) for e in range(3)]
    for ids in epochs:
        assert sorted(ids.tolist()) == list(range(100))  # every row, once
    assert not np.array_equal(epochs[0], epochs[1])


def test_a_plan_of_more_steps_than_its_rows_cover_is_refused() -> None:
    from dvml.exceptions import ParameterError
    from dvml.resolve.batches import BatchPlan

    BatchPlan((37, 50, 13), batch_size=8, steps=13, seed=0)  # 12 full and one of 4
    with pytest.raises(ParameterError, match="at most 13 steps"):
        BatchPlan((37, 50, 13), batch_size=8, steps=14, seed=0)


def test_a_dataset_from_a_later_epoch_continues_the_same_sequence() -> None:
    # The data position: an iteration (or a resumed job) that builds its dataset anew starts
    # at the epoch where the previous one stopped, not at epoch 0 again.
    parts = _parts((37, 50, 13))
    batch, steps = 8, 12

    def ids(first_epoch: int, epochs: int) -> list[list[int]]:
        dataset = tfdata.training_dataset(parts, batch, steps, seed=5, first_epoch=first_epoch)
        return [
            x0.numpy()[:, 0].astype(int).tolist() for (x0, _), _ in dataset.take(epochs * steps)
        ]

    whole = ids(0, 3)
    assert ids(2, 1) == whole[2 * steps :]
    assert ids(1, 2) == whole[steps:]
    assert ids(0, 1) != ids(1, 1)  # epoch 1 is not epoch 0 again


def test_a_row_weight_adds_the_same_sample_weight_to_every_row_of_every_batch() -> None:
    # sync="step" with unequal local batches (dvml.resolve.batches.row_weights): the rows and
    # their order are those of the unweighted dataset, each with the trainer's weight
    parts = _parts((37, 50, 13))
    plain = list(tfdata.training_dataset(parts, 8, 12, seed=5).take(13))
    weighted = list(tfdata.training_dataset(parts, 8, 12, seed=5, row_weight=1.5).take(13))
    for ((x0, _), y), ((wx0, _), wy, w) in zip(plain, weighted, strict=True):
        np.testing.assert_array_equal(wx0.numpy(), x0.numpy())
        np.testing.assert_array_equal(wy.numpy(), y.numpy())
        assert w.shape == (8,) and w.dtype.name == "float32"
        np.testing.assert_array_equal(w.numpy(), np.full(8, 1.5, np.float32))


def test_the_training_dataset_says_it_is_endless() -> None:
    # Under MultiWorkerMirroredStrategy a dataset of unknown length costs an all-reduce per
    # step (do all trainers still have a batch?); an infinite one does not.
    from dvml import tf_runtime

    tf = tf_runtime.tensorflow()
    dataset = tfdata.training_dataset(_parts((20,)), 4, 5, seed=1)
    assert int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    assert len(list(dataset.take(12))) == 12  # and it is: more than two epochs of 5 steps


def test_trainer_pipelines_neither_shard_again_nor_autotune() -> None:
    # Each trainer reads only its own partitions (sharding again would drop rows), and tf.data's
    # autotuning thread slowed one of two single-core trainers by ~60 % (tfdata._trainer_options).
    from dvml import tf_runtime

    tf = tf_runtime.tensorflow()
    parts = _parts((20,))
    for dataset in (
        tfdata.training_dataset(parts, 4, 5, seed=1),
        tfdata.evaluation_dataset(parts, 4),
    ):
        options = dataset.options()
        assert options.autotune.enabled is False
        assert options.experimental_distribute.auto_shard_policy == (
            tf.data.experimental.AutoShardPolicy.OFF
        )
    mine = tf.data.Options()
    mine.autotune.enabled = True
    assert tfdata.evaluation_dataset(parts, 4).with_options(mine).options().autotune.enabled


def test_evaluation_steps_count_every_batch_of_every_buffer() -> None:
    from types import SimpleNamespace

    from dvml.resolve.tfdata import evaluation_steps

    parts: Any = SimpleNamespace(buffer_rows=(10, 16, 1))
    assert evaluation_steps(parts, 8) == 2 + 2 + 1  # each buffer ends on its own last batch
    assert evaluation_steps(parts, 100) == 3


def _compact_parts(rows: tuple[int, ...]) -> LocalPartitions:
    # The compact format: x_0 uint8 pixels (row r holds r), x_1 float32 as packed, y the class
    # index r % 3 as uint8.
    start, xs0, xs1, ys = 0, [], [], []
    for n in rows:
        ids = np.arange(start, start + n)
        xs0.append(np.repeat(ids[:, None], 4, axis=1).astype(np.uint8))
        xs1.append(ids[:, None, None] * np.ones((1, 2, 2), np.float32))
        ys.append((ids % 3).astype(np.uint8))
        start += n
    storage = {"compact": True, "x_dtypes": ["uint8", "float32"], "y": "index", "y_dtype": "uint8"}
    return LocalPartitions(
        name="c",
        summary={
            "x_shapes": [[4], [2, 2]],
            "y_shape": [5],
            "normalizing_const": 255.0,
            "storage": storage,
        },
        instance_id=0,
        buffer_indices=list(range(len(rows))),
        fields={"x_0": xs0, "x_1": xs1, "y": ys},
    )


def test_the_compact_format_is_decoded_on_the_fly() -> None:
    """uint8 x comes out float32 / normalizing_const, class indices as one-hot float32 of
    y_shape's width: what the float32 format holds."""
    parts = _compact_parts((30, 21))
    seen = []
    for (x0, x1), y in tfdata.training_dataset(parts, 8, 6, seed=2).take(6):
        x0, x1, y = x0.numpy(), x1.numpy(), y.numpy()
        assert x0.dtype == np.float32 and y.dtype == np.float32 and y.shape == (8, 5)
        ids = x1[:, 0, 0].astype(int)
        np.testing.assert_allclose(x0, np.repeat(ids[:, None], 4, axis=1) / np.float32(255.0))
        np.testing.assert_array_equal(y, np.eye(5, dtype=np.float32)[ids % 3])
        seen.append(ids)
    assert len(set(np.concatenate(seen))) == 48
    rows = 0
    for (x0, _), y in tfdata.evaluation_dataset(parts, 16):
        assert x0.dtype.name == "float32" and tuple(y.shape[1:]) == (5,)
        np.testing.assert_array_equal(y.numpy().sum(axis=1), 1.0)
        rows += len(y)
    assert rows == 51


def test_the_metrics_pass_gives_what_keras_gives_at_the_training_batch() -> None:
    """local_metrics reads larger batches than training (evaluation_batch): the loss and
    metrics are means over rows, so they equal Keras's at the training batch."""
    from dvml.placement.metrics_batch import evaluation_batch
    from dvml.tf_runtime import keras
    from dvml.train.runtime.local_model import local_metrics

    parts = _parts((300, 211, 90))
    k = keras()
    a = k.Input((4,), name="a")
    b = k.Input((2, 2), name="b")
    h = k.layers.Concatenate()([a, k.layers.Flatten()(b)])
    model = k.Model([a, b], k.layers.Dense(3, activation="softmax")(k.layers.Dense(5)(h)))
    model.compile(loss="categorical_crossentropy", metrics=["accuracy"])
    assert evaluation_batch(8, 8) > 8  # the pass below does read larger batches
    got = local_metrics(model, parts, 8)
    x0, x1, y = (np.concatenate(parts.fields[f]) for f in ("x_0", "x_1", "y"))
    want = model.evaluate([x0, x1], y, batch_size=8, verbose=0, return_dict=True)
    assert got["rows"] == 601
    assert got["values"].keys() == want.keys()
    for name, value in want.items():
        assert got["values"][name] == pytest.approx(value, rel=1e-5)
