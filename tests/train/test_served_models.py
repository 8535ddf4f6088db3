"""What an inference session's trainer does with a model spec, without a cluster (tf-keras).

The spec travels as owner-only files; the Score/Predict commands and their answers survive the
protocol; a served model predicts what the same weights predict in plain tf-keras, from the
``.npy`` files a worker writes, and is built once per key.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from dvml.examples import digits_cnn_json
from dvml.registry.weights import weights_to_bytes
from dvml.train.runtime.protocol import Predict, Predicted, Score, Scored, encode, parse
from dvml.train.runtime.served import ServedModels, read_spec, write_spec

# parse_compile_params' result for "loss='categorical_crossentropy', optimizer='adam',
# metrics=['accuracy']" (parsing imports tf-keras; these tests need no TensorFlow but the last)
COMPILE = {"loss": "categorical_crossentropy", "optimizer": "adam", "metrics": ["accuracy"]}


def _spec(weights: list[np.ndarray] | None, model_json: str = "{}") -> dict:
    return {
        "key": "digits:1:abcd",
        "model_json": model_json,
        "weights": weights_to_bytes(weights) if weights is not None else None,
        "compile_params": COMPILE,
        "custom_objects": {},
        "output_activation": None,
    }


def test_commands_and_answers_survive_the_protocol() -> None:
    lines = [
        Score(model="m:1:ab", spec="/d/model-1.json", dataset="digits_val", batch_size=256),
        Predict(
            model="m:1:ab",
            spec="/d/model-1.json",
            inputs=["/d/a.npy", "/d/b.npy"],
            output="/d/out.npy",
            batch_size=64,
        ),
        Scored(rows=397, values={"loss": 0.25, "accuracy": 0.9}),
        Predicted(rows=12, output="/d/out.npy"),
    ]
    for line in lines:
        assert parse(encode(line)) == line


def test_a_spec_is_written_owner_only_and_read_back(tmp_path: Path) -> None:
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
    path = write_spec(str(tmp_path), "model-1", _spec(weights))
    for name in ("model-1.json", "model-1.npz"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600
    back = read_spec(path)
    assert back["weights"] == _spec(weights)["weights"]
    assert back["compile_params"] == COMPILE
    assert read_spec(write_spec(str(tmp_path), "model-2", _spec(None)))["weights"] is None


@pytest.mark.tf
def test_a_served_model_predicts_what_plain_tf_keras_predicts(tmp_path: Path) -> None:
    from dvml import tf_runtime

    keras = tf_runtime.keras()
    plain = keras.models.model_from_json(digits_cnn_json())
    weights = [w + 0.01 for w in plain.get_weights()]
    plain.set_weights(weights)
    x = np.random.default_rng(3).random((50, 8, 8, 1), dtype=np.float32)
    np.save(tmp_path / "rows.npy", x)
    spec_path = write_spec(str(tmp_path), "model-1", _spec(weights, digits_cnn_json()))
    served = ServedModels()
    for i in range(2):
        out = str(tmp_path / f"out-{i}.npy")
        answer = served.predict(
            Predict(
                model="digits:1:abcd",
                spec=spec_path,
                inputs=[str(tmp_path / "rows.npy")],
                output=out,
                batch_size=16,
            )
        )
        assert answer == Predicted(rows=50, output=out)
        np.testing.assert_allclose(np.load(out), plain.predict(x, verbose=0), rtol=1e-5)
    assert served.builds == 1  # built once, then served from the cache
