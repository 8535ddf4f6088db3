"""MADlib's hyperopt as a state machine (dvml.search.hyperopt_run): batches of as many
configurations as workers, losses told back, duplicates drawn again, journal replay. Pure."""

from __future__ import annotations

import math

import pytest

from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError
from dvml.search import journal as j
from dvml.search.automl_params import HyperoptParams
from dvml.search.hyperopt_run import Batch, HyperoptRun

COMPILE = {"loss": ["mse"], "optimizer_params_list": [{"optimizer": ["Adam"],
           "lr": [0.0001, 0.1, "log"]}]}  # fmt: skip
FIT = {"batch_size": [8, 16, 32]}


def run(algorithm: str = "tpe", num_configs: int = 5, workers: int = 2) -> HyperoptRun:
    space = SearchSpace([1, 2], COMPILE, FIT)
    return HyperoptRun(space, HyperoptParams(num_configs, 3, algorithm), workers, seed=4)


def drive(search: HyperoptRun) -> list[list[int]]:
    batches = []
    while (batch := search.next_batch()) is not None:
        batches.append(batch.keys)
        assert batch.num_iterations == 3
        search.report({k: (math.nan if k == 2 else 1.0 / k) for k in batch.keys})
    return batches


@pytest.mark.parametrize("algorithm", ["tpe", "rand"])
def test_batches_of_as_many_as_workers_and_the_best(algorithm: str) -> None:
    search = run(algorithm)
    assert drive(search) == [[1, 2], [3, 4], [5]]  # MADlib: round(5 / 2) = 3 batches
    assert search.best() == 5 and search.losses[2] is None  # NaN ranks last
    rows = [r for _, d in search.journal.pairs() if isinstance(d, Batch) for r in d.rows]
    assert len({(r["model_id"], r["compile_params"], r["fit_params"]) for r in rows}) == 5
    assert all(r["compile_params"].startswith("loss='mse', optimizer='Adam(") for r in rows)


def test_journal_replays_with_the_same_proposals() -> None:
    search = run("tpe", num_configs=12, workers=3)
    drive(search)
    text = search.journal.dumps()
    again = j.replay(j.Journal.loads(text), run("tpe", num_configs=12, workers=3))
    assert again.journal.dumps() == text and again.next_batch() is None
    other_seed = HyperoptRun(SearchSpace([1, 2], COMPILE, FIT), HyperoptParams(12, 3, "tpe"), 3, 5)
    with pytest.raises(ArgumentError, match="does not replay"):
        j.replay(j.Journal.loads(text), other_seed)


def test_out_of_order_reports_and_a_small_space_are_refused() -> None:
    search = run("rand")
    with pytest.raises(ArgumentError, match="No batch is pending"):
        search.report({1: 0.1})
    batch = search.next_batch()
    assert batch is not None
    with pytest.raises(ArgumentError, match="is not in batch 0"):
        search.report({9: 0.1})
    with pytest.raises(ArgumentError, match=r"Batch 0 is not finished: no loss reported for"):
        search.next_batch()
    tiny = HyperoptRun(SearchSpace([1], {"loss": ["mse"]}, {"batch_size": [8, 16]}),
                       HyperoptParams(3, 1, "rand"), 4, seed=0)  # fmt: skip
    with pytest.raises(ArgumentError, match="fewer than num_configs=3 distinct configurations"):
        tiny.next_batch()


def test_from_journal_rebuilds_the_run() -> None:
    search = run("tpe", num_configs=7, workers=2)
    batch = search.next_batch()
    assert batch is not None
    search.report({k: 0.5 for k in batch.keys})
    again = HyperoptRun.from_journal(search.journal.dumps())
    assert again.next_batch() == search.next_batch()  # same proposals: the sampler came back
    with pytest.raises(ArgumentError, match="not hyperopt's"):
        HyperoptRun.from_journal(j.Journal(header={"method": "asha"}))
