"""Configurations drawn from MADlib's grids (dvml.configs.search_space, dvml.search.samplers):
ranges in their own scale, conditional optimizer arguments, canonical strings, seeded random
and Optuna's TPE through ask and tell. Pure."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from dvml.configs.search_space import RandomDraw, SearchSpace
from dvml.exceptions import ArgumentError
from dvml.search.samplers import RandomSampler, TpeSampler, make_sampler

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [
        {"optimizer": ["Adam"], "lr": [0.0001, 0.1, "log"]},
        {"optimizer": ["SGD"], "lr": [0.001, 0.01], "momentum": [0.5, 0.99, "log_near_one"]},
    ],
    "metrics": ["accuracy"],
}
FIT = {"batch_size": [8, 64, "log"], "epochs": [1], "shuffle": [True]}


def test_dimensions_follow_the_grids() -> None:
    space = SearchSpace([2, 1, 2], COMPILE, FIT)
    names = [d.name for d in space.dims]
    assert names == [
        "model_id", "compile.loss", "optimizer", "optimizer.0.optimizer", "optimizer.0.lr",
        "optimizer.1.optimizer", "optimizer.1.lr", "optimizer.1.momentum", "compile.metrics",
        "fit.batch_size", "fit.epochs", "fit.shuffle",
    ]  # fmt: skip
    by = {d.name: d for d in space.dims}
    assert by["model_id"].choices == (1, 2)  # sorted, de-duplicated as MADlib does
    assert by["optimizer.1.momentum"].distribution == "log_near_one"
    assert by["optimizer.1.momentum"].parent == ("optimizer", 1)
    assert by["fit.batch_size"].integer and not by["optimizer.0.lr"].integer


def test_random_points_lie_in_their_ranges_and_parse() -> None:
    space = SearchSpace([1, 2], COMPILE, FIT)
    draw = RandomDraw(random.Random(7))
    points = [space.sample(draw) for _ in range(300)]
    adam = [p for p in points if p["optimizer"] == 0]
    sgd = [p for p in points if p["optimizer"] == 1]
    assert adam and sgd
    assert all("optimizer.1.momentum" not in p for p in adam)  # conditional: only its optimizer's
    lrs = [p["optimizer.0.lr"] for p in adam]
    assert all(0.0001 <= x <= 0.1 for x in lrs)
    # log scale: about as many draws below 0.00316 (the geometric middle) as above
    below = sum(x < math.sqrt(0.0001 * 0.1) for x in lrs) / len(lrs)
    assert 0.35 < below < 0.65
    momenta = [p["optimizer.1.momentum"] for p in sgd]
    assert all(0.5 <= m <= 0.99 for m in momenta)
    assert statistics.median(momenta) > 0.85  # log_near_one crowds towards 1
    batches = [p["fit.batch_size"] for p in points]
    assert all(isinstance(b, int) and 8 <= b <= 64 for b in batches)
    model_id, compile_text, fit_text = space.config(sgd[0])
    assert model_id in (1, 2)
    assert compile_text.startswith("loss='categorical_crossentropy', optimizer='SGD(")
    assert "momentum=" in compile_text and "metrics=['accuracy']" in compile_text
    assert fit_text.startswith("batch_size=") and "epochs=1" in fit_text


def test_bad_grids_are_refused_with_config_searchs_messages() -> None:
    with pytest.raises(ArgumentError, match="not a valid distribution"):
        SearchSpace([1], {"loss": ["mse"], "optimizer_params_list": [
            {"optimizer": ["Adam"], "lr": [0.1, 0.01, "log"]}]}, None)  # fmt: skip
    with pytest.raises(ArgumentError, match="has no 'optimizer' key"):
        SearchSpace([1], {"loss": ["mse"], "optimizer_params_list": [{"lr": [0.1]}]}, None)
    with pytest.raises(ArgumentError, match="must be a non-empty list of choices"):
        SearchSpace([1], {"loss": "mse"}, None)
    space = SearchSpace([1], {"loss": ["mse"]}, None)
    with pytest.raises(ArgumentError, match="misses the parameters"):
        space.config({"model_id": 0})


def test_random_sampler_is_seeded() -> None:
    space = SearchSpace([1, 2], COMPILE, FIT)
    first = [RandomSampler(space, 3).ask() for _ in range(1)]
    a, b = RandomSampler(space, 3), RandomSampler(space, 3)
    assert [a.ask() for _ in range(20)] == [b.ask() for _ in range(20)]
    assert first[0] == RandomSampler(space, 3).ask()
    assert [RandomSampler(space, 4).ask() for _ in range(1)] != first
    assert isinstance(make_sampler("rand", space, 1), RandomSampler)
    with pytest.raises(ArgumentError, match="Unknown sampler"):
        make_sampler("grid", space, 1)


def _loss(point: dict[str, object]) -> float:
    # best at Adam with lr = 0.01 and batch 16; SGD one worse
    if point["optimizer"] == 0:
        lr, penalty = float(point["optimizer.0.lr"]), 0.0  # type: ignore[arg-type]
    else:
        lr, penalty = [0.001, 0.01][point["optimizer.1.lr"]], 1.0  # type: ignore[index]
    batch = float(point["fit.batch_size"])  # type: ignore[arg-type]
    return (math.log10(lr) + 2) ** 2 + (math.log2(batch) - 4) ** 2 / 9 + penalty


def test_tpe_learns_from_what_it_is_told_and_is_seeded() -> None:
    space = SearchSpace([1], COMPILE, FIT)

    def run(sampler: RandomSampler | TpeSampler, n: int = 40, nan_every: int = 0) -> list[float]:
        losses = []
        for k in range(n):
            number, point = sampler.ask()
            loss = _loss(point)
            sampler.tell(number, math.nan if nan_every and k % nan_every == 0 else loss)
            losses.append(loss)
        return losses

    tpe = run(TpeSampler(space, seed=1))
    assert tpe == run(TpeSampler(space, seed=1))  # same seed, same tells: same proposals
    rand = run(RandomSampler(space, seed=1))
    # after its 10 random start-up trials TPE proposes better points than random search
    assert statistics.mean(tpe[-20:]) < 0.7 * statistics.mean(rand[-20:])
    # a NaN is told as a failed trial, which TPE leaves out; it still learns from the rest
    sampler = TpeSampler(space, seed=2)
    with_nans = run(sampler, nan_every=3)
    assert statistics.mean(with_nans[-20:]) < statistics.mean(rand[-20:])
    states = [t.state.name for t in sampler._study.trials]
    assert states.count("FAIL") == 14 and states.count("COMPLETE") == 26
