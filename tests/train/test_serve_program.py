"""A serving trainer's model state: weights AND optimizer variables survive a hop (tf-keras)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dvml.configs import parse_compile_params, parse_fit_params
from dvml.examples import digits_cnn_json
from dvml.train.runtime import serve_program
from dvml.train.runtime.model_state import write_state

pytestmark = [pytest.mark.tf]

COMPILE = (
    "loss='categorical_crossentropy',optimizer='Adam(learning_rate=0.01)',metrics=['accuracy']"
)


def _job() -> dict:
    config = {
        "model_json": digits_cnn_json(),
        "compile_params": parse_compile_params(COMPILE),
        "fit_params": parse_fit_params("batch_size=16,epochs=1"),
    }
    return {"configs": {"1": config}, "seed": 0, "custom_objects": {}}


def test_weights_and_optimizer_state_move_with_the_model(tmp_path: Path) -> None:
    from dvml import tf_runtime

    tf_runtime.keras()
    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8, 1), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
    here = serve_program.Models(_job()).get(1)
    here.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = str(tmp_path / "state.npz")
    serve_program.save_state(here, path)

    # "the next worker": another model object of the same configuration
    there = serve_program.Models(_job()).get(1)
    serve_program.load_state(there, path)
    for a, b in zip(here.get_weights(), there.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    mine = serve_program.optimizer_variables(here)
    theirs = serve_program.optimizer_variables(there)
    assert int(theirs[0].numpy()) == 4  # Adam's step count: 64 rows / batch 16
    for a, b in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # both continue identically: the same next step from the same weights and moments
    here.train_on_batch(x[:16], y[:16])
    there.train_on_batch(x[:16], y[:16])
    for a, b in zip(here.get_weights(), there.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_fresh_state_keeps_the_seeded_initialisation_and_resets_the_optimizer(
    tmp_path: Path,
) -> None:
    from dvml import tf_runtime

    tf_runtime.keras()
    model = serve_program.Models(_job()).get(1)
    before = model.get_weights()
    serve_program.optimizer_variables(model)[0].assign(7)
    path = str(tmp_path / "fresh.npz")
    write_state(path, [], [])
    serve_program.load_state(model, path)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(serve_program.optimizer_variables(model)[0].numpy()) == 0
