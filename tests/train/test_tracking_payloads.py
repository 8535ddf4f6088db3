"""What a ``dvml.run`` sends to MLflow and to its TensorBoard stream (pure, no cluster)."""

from __future__ import annotations

import math

from dvml.tracking.runs import DatasetInput, dataset_input, user_run
from dvml.train.job_scalars import report_scalars


def test_a_user_run_logs_every_finite_metric_at_its_step_and_its_datasets() -> None:
    history = [
        {"step": 1, "elapsed_s": 2.5, "loss": 0.9, "accuracy": 0.5},
        {"step": 2, "elapsed_s": 4.0, "loss": math.nan, "accuracy": 0.75},
    ]
    inputs = [DatasetInput("digits", "id-1", "training"),
              DatasetInput("digits_val", "id-2", "validation")]  # fmt: skip
    payload = user_run("loop", {"sync": "step", "config.lr": 0.01, "seed": None}, inputs,
                       history, {"version": "9"})  # fmt: skip
    assert payload.name == "loop" and payload.tags == {"dvml.kind": "run", "dvml.version": "9"}
    assert payload.params == {"sync": "step", "config.lr": "0.01"}  # None is not a parameter
    assert sorted(payload.metrics) == [
        ("accuracy", 0.5, 1), ("accuracy", 0.75, 2), ("elapsed_s", 2.5, 1),
        ("elapsed_s", 4.0, 2), ("loss", 0.9, 1),
    ]  # fmt: skip
    assert [(d.name, d.digest, d.context) for d in payload.inputs] == [
        ("digits", "id-1", "training"), ("digits_val", "id-2", "validation"),
    ]  # fmt: skip


def test_a_dataset_input_is_named_by_its_version_with_its_content_digest() -> None:
    read = dataset_input("digits", 2, "a" * 64, "fallback-id", "training")
    assert (read.name, read.digest, read.context) == ("digits@v2", "a" * 36, "training")
    old = dataset_input("digits", None, None, "fallback-id", "validation")
    assert (old.name, old.digest) == ("digits", "fallback-id")


def test_report_scalars_average_and_each_trainer() -> None:
    record = {"step": 3, "elapsed_s": 7.0, "loss": 0.5, "note": "text"}
    reports = [
        {"worker": "w0", "elapsed": 6.5, "metrics": {"loss": 0.4}},
        {"worker": "w1", "elapsed": 7.0, "metrics": {"loss": 0.6, "bad": math.inf}},
    ]
    assert report_scalars(record, reports) == {
        "loss": 0.5, "seconds/elapsed": 7.0,
        "trainer/w0/elapsed_seconds": 6.5, "trainer/w0/loss": 0.4,
        "trainer/w1/elapsed_seconds": 7.0, "trainer/w1/loss": 0.6,
    }  # fmt: skip
