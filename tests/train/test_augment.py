"""Per-epoch augmentation (``dvml.fit(..., augment=...)``): the job-file codec, the trainers'
input pipeline (new random draws every epoch, labels untouched, only training batches), and
the refusals."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dvml.exceptions import ArgumentTypeError
from dvml.resolve import tfdata
from dvml.resolve.partitions import LocalPartitions
from dvml.train.runtime import augment as codec

pytestmark = pytest.mark.tf


def _images(rows: int) -> LocalPartitions:
    # Row r: a 4x4x1 image whose left half is r and right half is -r; label r % 2.
    ids = np.arange(rows, dtype=np.float32)
    x = np.concatenate(
        [
            np.repeat(ids[:, None, None, None], 2, axis=2),
            -np.repeat(ids[:, None, None, None], 2, axis=2),
        ],
        axis=2,
    ).repeat(4, axis=1)
    y = np.eye(2, dtype=np.float32)[ids.astype(int) % 2]
    return LocalPartitions(
        name="t", summary={"x_shapes": [[4, 4, 1]], "y_shape": [2]}, instance_id=0,
        buffer_indices=[0], fields={"x_0": [x], "y": [y]},
    )  # fmt: skip


def _through_job_file(augment: Any) -> Any:
    """What a trainer gets: encoded on the client, through JSON, decoded."""
    return codec.decode(json.loads(json.dumps(codec.encode(augment))))


def test_a_keras_layer_travels_as_its_config_and_flips_some_batches_each_epoch() -> None:
    import tf_keras

    flip = tf_keras.Sequential([tf_keras.layers.RandomFlip("horizontal", seed=3)])
    spec = codec.encode(flip)
    assert spec is not None and spec["kind"] == "keras" and "pickle" not in spec
    assert codec.describe(spec) == f"Sequential({flip.layers[0].name})"
    parts = _images(64)
    steps, batch = 8, 8
    dataset = tfdata.training_dataset(
        parts, batch, steps, seed=1, shuffle=False, augment=_through_job_file(flip)
    )
    flipped = []
    for x, y in dataset.take(4 * steps):
        x, y = x.numpy(), y.numpy()
        ids = np.abs(x[:, 0, :, 0]).max(axis=1).astype(int)  # the row, either way round
        np.testing.assert_array_equal(y.argmax(axis=1), ids % 2)  # labels untouched
        flipped.append(x[:, 0, 0, 0] < 0)  # the left half is -r: flipped (row 0 never)
    per_epoch = [np.concatenate(flipped[e * steps : (e + 1) * steps]) for e in range(4)]
    assert all(0 < f.sum() < len(f) for f in per_epoch)  # some rows flipped, not all
    assert len({f.tobytes() for f in per_epoch}) > 1  # new draws every epoch


def test_a_function_travels_as_code() -> None:
    import tensorflow as tf

    offset = 100.0  # a closure: shipped with the function

    def shift(x: Any) -> Any:
        return x + tf.constant(offset)

    spec = codec.encode(shift)
    assert spec is not None and spec["kind"] == "function"
    assert codec.describe(spec).endswith("shift")
    dataset = tfdata.training_dataset(_images(16), 4, 4, seed=1, augment=_through_job_file(shift))
    for x, _ in dataset.take(4):
        assert float(np.asarray(x).min()) >= 100.0 - 15.0


def test_nothing_to_augment_is_none() -> None:
    assert codec.encode(None) is None and codec.decode(None) is None
    assert codec.describe(None) is None


@pytest.mark.parametrize("bad", ["flip", 3, ["RandomFlip"]])
def test_anything_else_is_refused_with_what_to_pass(bad: Any) -> None:
    with pytest.raises(ArgumentTypeError, match="tf-keras layer or model, or a function"):
        codec.encode(bad)


def test_a_keras_3_layer_is_refused_naming_tf_keras() -> None:
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3"):
        pytest.skip("keras here is not Keras 3")
    with pytest.raises(ArgumentTypeError, match=r"tf_keras\.layers"):
        codec.encode(keras.layers.RandomFlip("horizontal"))
