"""The pure parts of the model-hopper job: the checkpoint fold and the one builder of MADlib's
tables (no cluster)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dvml.configs import format_params
from dvml.registry.weights import weights_to_bytes
from dvml.train.hop_job import fold_checkpoints
from dvml.train.hop_tables import Trained, build_tables, run_summary
from dvml.train.runtime.checkpoints import resume_points
from dvml.train.runtime.plan import checkpoint_dir


def _meta(k: int, t: int, has_state: bool, loss: float = 1.0) -> dict[str, Any]:
    return {"mst_key": k, "iteration": t, "has_state": has_state,
            "records": [{"mst_key": k, "iteration": t, "loss": loss}], "evals": []}  # fmt: skip


def test_fold_keeps_the_holders_of_kept_states_and_every_record() -> None:
    found = fold_checkpoints([
        ("w0", _meta(1, 1, False)), ("w0", _meta(1, 2, True)), ("w1", _meta(1, 2, True, 9.0)),
        ("w1", _meta(2, 1, True)), ("w1", _meta(2, 3, True)),
    ])  # fmt: skip
    assert found.holders == {1: {2: "w0"}, 2: {1: "w1", 3: "w1"}}
    assert found.has_state(1, 2) and not found.has_state(1, 1) and not found.has_state(3, 1)
    assert found.iterations(1) == [1, 2] and found.iterations(2) == [1, 3]
    # a checkpoint kept on two workers counts once, its first record read
    assert found.records[(1, 2)]["records"][0]["loss"] == 1.0
    assert set(found.records[(2, 3)]) == {"mst_key", "iteration", "records", "evals"}


def test_fold_gives_each_model_its_own_resume_point() -> None:
    found = fold_checkpoints([
        ("w0", _meta(1, 1, True)), ("w0", _meta(1, 2, True)),
        ("w1", _meta(2, 1, True)), ("w1", _meta(2, 3, True)),  # 2 lacks iteration 2
    ])  # fmt: skip
    points = resume_points({k: found.iterations(k) for k in (1, 2, 3)}, found.has_state)
    assert points == {1: 2, 2: 1, 3: 0}


def test_fold_of_no_checkpoint_is_empty() -> None:
    found = fold_checkpoints([])
    assert found.holders == {} and found.records == {} and found.iterations(1) == []


def test_checkpoint_dir_names_the_run_kind_and_key() -> None:
    path = checkpoint_dir("sel", "mop", "abc123")
    assert path.endswith("/checkpoints/sel-mop-abc123")
    assert checkpoint_dir("sel", "asha", "abc123") != path


def _job(valid: bool = True) -> Any:
    summary = {
        "dependent_varname": "y", "independent_varname": ["x"], "num_classes": 3,
        "class_values": ["a", "b", "c"], "dependent_vartype": "str", "normalizing_const": 1.0,
        "x_shapes": [[4]], "dataset_id": "d1",
    }  # fmt: skip
    train = SimpleNamespace(name="tr", summary=summary)
    return SimpleNamespace(
        train=train, valid=SimpleNamespace(name="va", summary=summary) if valid else None,
        workers=[SimpleNamespace(name="w0"), SimpleNamespace(name="w1")], frequency=1,
        custom_sources={}, augment=None,
        args=SimpleNamespace(use_gpus=False, metrics_compute_frequency=None),
    )  # fmt: skip


SPEC = {
    "compile_params": {"loss": "categorical_crossentropy", "metrics": ["accuracy"]},
    "fit_params": {"batch_size": 8},
    "model_json": '{"class_name": "Sequential"}',
}


def _entry(k: int, t: int, loss: float) -> dict[str, Any]:
    record = {"mst_key": k, "iteration": t, "elapsed": 0.5, "train_s": 0.25, "moving_s": 0.125}
    ev = {
        "training": {"rows": 10, "values": {"loss": loss, "accuracy": 0.5}},
        "validation": {"rows": 5, "values": {"loss": loss + 1, "accuracy": 0.25}},
    }
    return {"records": [record, record], "evals": [ev]}


def _tables(**kw: Any) -> Any:
    trained = [
        Trained(2, 7, SPEC, 2, summary={"asha_status": "finished"}, info={"rung": 1}),
        Trained(1, 7, SPEC, 2, texts=("loss='categorical_crossentropy'", "batch_size=8")),
    ]
    history = {1: {1: _entry(1, 1, 2.0), 2: _entry(1, 2, 1.0)}, 2: {1: _entry(2, 1, 3.0)}}
    weights = {1: weights_to_bytes([np.ones((2, 2), np.float32)]), **kw.get("weights", {})}
    times = {"start": "s", "end": "e", "name": "n", "description": None}
    return build_tables(_job(), "sel", trained, history, weights, times)


def test_tables_register_one_model_per_configuration_with_weights() -> None:
    tables = _tables()
    assert [m["name"] for m in tables.models] == ["sel_1"]  # 2 has no weights: not registered
    assert [r["mst_key"] for r in tables.info] == [1, 2]  # every configuration, in order
    model = tables.models[0]
    assert model["arch_id"] == 7 and len(model["iterations"]) == 2
    assert model["summary"] is tables.summaries[1]
    tables = _tables(weights={2: weights_to_bytes([np.zeros((3,), np.float32)])})
    assert [m["name"] for m in tables.models] == ["sel_1", "sel_2"]


def test_tables_keep_the_given_text_or_write_it_from_the_spec() -> None:
    tables = _tables()
    assert tables.summaries[1]["compile_params"] == "loss='categorical_crossentropy'"
    assert tables.summaries[2]["compile_params"] == format_params(SPEC["compile_params"])
    assert tables.summaries[2]["fit_params"] == format_params(SPEC["fit_params"])
    assert tables.info[1]["compile_params"] == tables.summaries[2]["compile_params"]


def test_tables_carry_the_schedulers_own_fields() -> None:
    tables = _tables()
    two = tables.summaries[2]
    assert two["asha_status"] == "finished" and two["mst_key"] == 2
    assert two["model_selection"] == "sel" and two["sync"] == "model_hopper"
    assert two["model_arch"] == SPEC["model_json"]
    assert tables.info[1]["rung"] == 1 and "rung" not in tables.info[0]
    # the history's seconds: two hops of 0.25 s training per iteration
    assert tables.info[0]["training_seconds"] == pytest.approx(1.0)
    assert tables.info[1]["training_seconds"] == pytest.approx(0.5)


def test_run_summary_has_madlibs_common_fields() -> None:
    summary = run_summary(_job(valid=False), {"name": "n", "description": "d"}, 3)
    assert summary["source_table"] == "tr" and summary["validation_table"] is None
    assert summary["metrics_compute_frequency"] == 3
    assert summary["y_class_values"] == ["a", "b", "c"]
    assert summary["object_table"] is None and summary["use_gpus"] is False
    assert summary["workers"] == ["w0", "w1"]
    assert (summary["name"], summary["description"]) == ("n", "d")
