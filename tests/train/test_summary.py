"""MADlib's fit summary fields, built from plain values (no cluster)."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import numpy as np

from dvml.train.runtime.plan import now, utc_text
from dvml.train.summary import build_summary, weights_size_kb


def _iris_weights() -> list[np.ndarray]:
    # MADlib's iris example: Dense(10) on 4 inputs, Dense(10), Dense(3): 193 parameters.
    shapes = [(4, 10), (10,), (10, 10), (10,), (10, 3), (3,)]
    return [np.zeros(s, np.float32) for s in shapes]


def test_model_size_is_the_weights_kilobytes() -> None:
    weights = _iris_weights()
    assert sum(w.size for w in weights) == 193
    assert weights_size_kb(weights) == 193 * 4 / 1024


def test_summary_has_madlibs_names() -> None:
    training = SimpleNamespace(
        name="iris_train",
        summary={
            "dependent_varname": "class_text",
            "independent_varname": ["attributes"],
            "num_classes": 3,
            "class_values": ["Iris-setosa", "Iris-versicolor", "Iris-virginica"],
            "dependent_vartype": "str",
            "normalizing_const": 1.0,
            "x_shapes": [[4]],
            "dataset_id": "abc",
        },
    )
    summary = build_summary(
        training=training, validation=None, model="iris_model", arch_id=1,
        compile_params={"loss": "categorical_crossentropy", "metrics": ["accuracy"]},
        fit_params={"batch_size": 16}, compile_text="", fit_text="", num_iterations=1,
        metrics_compute_frequency=1, name=None, description=None, start="s", end="e",
        iterations=[], model_size_kb=weights_size_kb(_iris_weights()), trainers=["w0"],
        weights_identical=True, warm_start=False, version="0.1.0",
    )  # fmt: skip
    assert summary["class_text_class_values"] == training.summary["class_values"]
    assert summary["madlib_version"] == "0.1.0"
    assert round(summary["model_size"], 2) == 0.75


def test_multi_output_series_and_predictions() -> None:
    from dvml.train.inference import format_predictions
    from dvml.train.summary import output_series

    record = {
        "iteration": 1,
        "training_loss": 1.5,
        "training_metrics": {"dense_4_loss": 1.0, "dense_5_loss": 0.5,
                             "dense_4_accuracy": 0.25, "dense_5_accuracy": 0.75},
    }  # fmt: skip
    ts = {"dependent_varname": ["a", "b"], "class_values": [["x", "y"], [0, 1, 2]]}
    series = output_series([record], ts, "accuracy", validated=False)
    assert series["a_training_loss"] == [1.0] and series["b_training_metrics_final"] == 0.75
    assert series["a_validation_loss"] is None
    assert output_series([record], {"dependent_varname": "a"}, "accuracy", False) == {}
    # one row per input row and output: class_name names the output, rank within it
    probs = np.array([[0.9, 0.1, 0.2, 0.7, 0.1]])
    table = format_predictions(np.array([7]), probs, ts["class_values"], ["a", "b"], "response")
    assert table[["id", "class_name", "class_value", "rank"]].values.tolist() == [
        [7, "a", "x", 1],
        [7, "b", 1, 1],
    ]


def test_summary_times_are_utc_iso_8601_seconds_with_the_offset() -> None:
    """Every summary's start/end_training_time has one form (fit's, fit_multiple's, each
    search's models' and automl's run summary): aware UTC, whole seconds."""
    text = utc_text(1_700_000_000.75)
    assert text == "2023-11-14T22:13:20+00:00"
    parsed = datetime.datetime.fromisoformat(text)
    assert parsed.utcoffset() == datetime.timedelta(0)
    assert parsed.timestamp() == 1_700_000_000
    current = datetime.datetime.fromisoformat(now())
    assert current.utcoffset() == datetime.timedelta(0) and current.microsecond == 0
