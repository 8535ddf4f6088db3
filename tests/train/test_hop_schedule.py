"""Pure pieces of fit_multiple: the hop schedule, configuration checks, the info table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from dvml.configs import check_config_rows
from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.train.fit_multiple import model_name
from dvml.train.hop_schedule import (
    build_info,
    hop_schedule,
    iteration_rows,
    model_histories,
)

COMPILE = (
    "loss='categorical_crossentropy',optimizer='Adam(learning_rate=0.001)',metrics=['accuracy']"
)


@pytest.mark.parametrize(("models", "workers"), [(4, 2), (3, 2), (2, 2), (1, 2), (2, 3), (5, 3)])
def test_every_model_visits_every_worker_once_per_iteration(models: int, workers: int) -> None:
    rounds = hop_schedule(models, workers)
    assert len(rounds) == workers
    for m in range(models):
        assert sorted(w for round_ in rounds for mm, w in round_ if mm == m) == list(range(workers))
    for r, round_ in enumerate(rounds):
        assert round_ == [(m, (m + r) % workers) for m in range(models)]  # Cerebro's rule


@pytest.mark.parametrize(
    ("models", "workers", "idle"), [(4, 2, 0), (3, 2, 0), (1, 2, 1), (2, 5, 3)]
)
def test_idle_workers_per_round_follow_madlibs_rule(models: int, workers: int, idle: int) -> None:
    for round_ in hop_schedule(models, workers):
        assert workers - len({w for _, w in round_}) == idle


def test_a_schedule_needs_models_and_workers() -> None:
    with pytest.raises(ArgumentError, match="n_models=0"):
        hop_schedule(0, 2)


def _row(key: Any, **kw: Any) -> dict[str, Any]:
    return {
        "mst_key": key,
        "model_id": 1,
        "compile_params": COMPILE,
        "fit_params": "batch_size=8",
        **kw,
    }


def test_configs_from_a_dataframe_or_a_list_are_sorted_by_key() -> None:
    # fit_multiple's rows go through the one check of model selection rows (dvml.configs).
    frame = pd.DataFrame([_row(2, fit_params="batch_size=16"), _row(1)])
    checked = check_config_rows(frame.to_dict("records"))
    assert [c.mst_key for c in checked] == [1, 2]
    assert all(type(c.mst_key) is int and type(c.model_id) is int for c in checked)
    assert check_config_rows([_row(np.int64(3))])[0].mst_key == 3


@pytest.mark.parametrize("bad", ["configs_table", 3, {"mst_key": 1}, None])
def test_other_config_types_are_refused(bad: Any) -> None:
    with pytest.raises(ArgumentTypeError, match="list of rows"):
        check_config_rows(bad)


def test_bad_config_records_are_refused() -> None:
    with pytest.raises(ArgumentError, match="no rows"):
        check_config_rows([])
    with pytest.raises(ArgumentError, match="missing"):
        check_config_rows([{"mst_key": 1}])
    with pytest.raises(ArgumentError, match="repeats mst_key=1"):
        check_config_rows([_row(1), _row(1, model_id=2)])
    with pytest.raises(ArgumentError, match="mst_key must be a positive integer"):
        check_config_rows([_row("1")])
    with pytest.raises(ArgumentError, match="mst_key must be a positive integer"):
        check_config_rows([_row(0)])  # one mst_key rule: 0 was accepted here before
    with pytest.raises(ArgumentTypeError, match="must be a dict"):
        check_config_rows(["x"])


def test_info_rows_carry_the_summaries_and_the_seconds() -> None:
    configs = [c.as_dict() for c in check_config_rows([_row(1)])]
    names = (
        "compile_params fit_params model_type model_size metrics_elapsed_time metrics_type "
        "loss_type training_metrics_final training_loss_final training_metrics training_loss "
        "validation_metrics_final validation_loss_final validation_metrics validation_loss "
        "metrics_iters"
    )
    summary: dict[str, Any] = dict.fromkeys(names.split(" "))
    summary["training_loss_final"] = 0.5
    rows = build_info(
        configs, {1: model_name("out", 1)}, {1: summary}, {1: {"training_s": 2.0, "moving_s": 0.25}}
    )
    assert rows[0]["model_name"] == "out_1"
    assert rows[0]["training_loss_final"] == 0.5
    assert rows[0]["moving_seconds"] == 0.25


def _hop(k: int, t: int, elapsed: float) -> dict[str, Any]:
    return {"mst_key": k, "iteration": t, "elapsed": elapsed, "train_s": 1.0, "moving_s": 0.5}


def test_histories_fold_checkpointed_and_new_iterations_into_madlibs_rows() -> None:
    """A search's history over two steps (iterations numbered over the whole search): the
    first step's iteration comes from a checkpoint record, the second's from its hops; the
    rows give MADlib's metrics_iters counted over the search and the summed seconds."""
    evaluation = {"training": {"rows": 10, "values": {"loss": 0.5, "accuracy": 0.9}}}
    kept = [{"mst_key": 1, "iteration": 1, "records": [_hop(1, 1, 2.0)], "evals": [evaluation]}]
    hops = [_hop(1, 2, 3.0), _hop(1, 2, 3.5), _hop(1, 4, 6.0), _hop(2, 4, 6.1)]
    later = {"training": {"rows": 10, "values": {"loss": 0.25, "accuracy": 1.0}}}
    evals = {(1, 4): [later], (2, 4): [later]}
    history = model_histories([1, 2], kept, hops, evals)
    assert sorted(history[1]) == [1, 2, 4] and sorted(history[2]) == [4]
    rows, seconds = iteration_rows(history[1])
    assert [r["iteration"] for r in rows if "training_loss" in r] == [1, 4]
    assert [r["training_loss"] for r in rows if "training_loss" in r] == [0.5, 0.25]
    assert [r["elapsed_s"] for r in rows] == [2.0, 3.5, 6.0]
    assert seconds == {"training_s": 4.0, "moving_s": 2.0}


def test_each_model_resumes_from_its_own_last_kept_state() -> None:
    """Issue 42: a model two iterations ahead has pruned its first state, a lagging one has
    only its first: each resumes from its own (the old rule, one iteration every model still
    had a state of, found none and started everyone over)."""
    from dvml.train.runtime.checkpoints import resume_iteration, resume_points

    done = {1: [1, 2, 3], 2: [1]}
    kept = {(1, 2), (1, 3), (2, 1)}
    # the old rule over the iterations whose state is kept: nothing in common, start over
    assert resume_iteration({1: [2, 3], 2: [1]}, lambda i: True) == 0
    assert resume_points(done, lambda k, i: (k, i) in kept) == {1: 3, 2: 1}
    # a gap in a model's records (a lost record file): not beyond it, the history must be whole
    assert resume_points({1: [1, 3]}, lambda k, i: True) == {1: 1}
    # no record, or no state kept: afresh
    assert resume_points({1: [], 2: [1, 2]}, lambda k, i: False) == {1: 0, 2: 0}


def test_resumed_from_iteration_of_a_run() -> None:
    from dvml.train.hop_schedule import resumed_from

    assert resumed_from({1: 0, 2: 0}) is None  # nothing resumed
    assert resumed_from({1: 3, 2: 1}) == 1  # every model has its iterations up to 1
    assert resumed_from({1: 2, 2: 0}) == 0  # one model started afresh, the other resumed
