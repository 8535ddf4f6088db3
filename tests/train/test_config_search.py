"""The pure planner of model configurations (dvml.configs): MADlib's grid and
random search, its grid strings, and every configuration parsed up front. No cluster."""

from __future__ import annotations

import math
import re

import pytest

from dvml import configs as cs
from dvml.configs import grids, parse_compile_params, parse_fit_params
from dvml.exceptions import ArgumentError, ArgumentTypeError

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.01]}],
    "metrics": ["accuracy"],
}
FIT = {"batch_size": [8, 16], "epochs": [1]}
MSE = {"loss": ["mse"]}


def opt(*entries: dict[str, object], **compile_grid: object) -> dict[str, object]:
    """A compile grid with loss 'mse' and these optimizer_params_list entries."""
    return {**MSE, **compile_grid, "optimizer_params_list": list(entries)}


def row(fit: str = "", model_id: object = 1, **extra: object) -> dict[str, object]:
    return {"model_id": model_id, "compile_params": "loss='mse'", "fit_params": fit, **extra}


def _lr(compile_params: str) -> float:
    spec = parse_compile_params(compile_params)["optimizer"]
    return float(spec["config"]["learning_rate"])


def test_grid_is_the_product_in_madlib_order() -> None:
    configs = cs.plan_configs([2, 1], COMPILE, FIT)
    assert len(configs) == 2 * 2 * 2  # architectures x learning rates x batch sizes
    assert [c.mst_key for c in configs] == list(range(1, 9))
    assert [c.model_id for c in configs] == [1, 1, 1, 1, 2, 2, 2, 2]  # sorted, outermost
    first = configs[0]
    assert first.compile_params == (
        "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', "
        "metrics=['accuracy']"
    )
    assert first.fit_params == "batch_size=8, epochs=1"
    assert configs[1].fit_params == "batch_size=16, epochs=1"  # the last key varies fastest
    for c in configs:  # every string is what the safe parsers accept
        parse_compile_params(c.compile_params)
        parse_fit_params(c.fit_params)


def test_grid_count_is_the_product_of_every_choice() -> None:
    compile_grid = {
        "loss": ["categorical_crossentropy", "mse"],
        "optimizer_params_list": [
            {"optimizer": ["SGD"], "lr": [0.1, 0.01, 0.001], "momentum": [0.0, 0.9]},
            {"optimizer": ["Adam", "RMSprop"], "lr": [0.001]},
        ],
        "metrics": [["accuracy"], ["accuracy", "AUC(name='auc')"]],
    }
    fit_grid = {"batch_size": [8, 16, 32], "epochs": [1, 2]}
    configs = cs.plan_configs([1, 2, 3], compile_grid, fit_grid)
    assert len(configs) == 3 * (2 * (3 * 2 + 2 * 1) * 2) * (3 * 2)
    assert len({(c.model_id, c.compile_params, c.fit_params) for c in configs}) == len(configs)
    assert "metrics=['accuracy', AUC(name='auc')]" in configs[-1].compile_params


def test_madlib_grid_strings_parse_like_dicts() -> None:
    text_compile = """{'loss': ['categorical_crossentropy'],
        'optimizer_params_list': [ {'optimizer': ['Adam'], 'lr': [0.001, 0.01]} ],
        'metrics': ['accuracy']}"""
    text_fit = "{'batch_size': [8, 16], 'epochs': [1]}"
    assert cs.plan_configs(1, text_compile, text_fit) == cs.plan_configs(1, COMPILE, FIT)
    assert cs.parse_grid(text_fit, "fit_params_grid") == FIT
    assert cs.parse_grid(None, "x") == {} and cs.parse_grid("  ", "x") == {}


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        ("{'epochs': [1]", "is not the text of a dict of literal values"),
        ("{'epochs': __import__('os')}", "is not the text of a dict of literal values"),
        ("[1, 2]", "must be a dict of parameter name to a list of choices"),
        ("{'epochs': 1}", "fit_params_grid['epochs'] must be a non-empty list of choices"),
        ("{'epochs': []}", "must be a non-empty list of choices"),
        ("{'epochs': [1e999]}", "not finite"),
        ("{'epochs': [" * 20 + "]" * 20 + "}", "nests too deeply"),
    ],
)
def test_bad_grid_text_is_refused(grid: str, expected: str) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError), match=re.escape(expected)):
        cs.plan_configs(1, {"loss": ["mse"]}, grid)


def test_random_search_is_reproducible_with_a_seed() -> None:
    compile_grid = {
        "loss": ["categorical_crossentropy"],
        "optimizer_params_list": [
            {
                "optimizer": ["SGD"],
                "lr": [0.0001, 0.1, "log"],
                "momentum": [0.5, 0.99, "log_near_one"],
            },
            {"optimizer": ["Adam"], "lr": [0.0001, 0.1, "log"]},
        ],
        "metrics": ["accuracy"],
    }  # fmt: skip
    fit_grid = {"batch_size": [4, 64, "linear"], "epochs": [1, 2]}
    first = cs.plan_configs([1, 2], compile_grid, fit_grid, "random", 12, seed=7)
    again = cs.plan_configs([1, 2], compile_grid, fit_grid, "random", 12, seed=7)
    other = cs.plan_configs([1, 2], compile_grid, fit_grid, "random", 12, seed=8)
    assert first == again
    assert first != other
    assert len(first) == 12 and [c.mst_key for c in first] == list(range(1, 13))
    for c in first:
        fit = parse_fit_params(c.fit_params)
        assert isinstance(fit["batch_size"], int) and 4 <= fit["batch_size"] <= 64
        assert fit["epochs"] in (1, 2)
        spec = parse_compile_params(c.compile_params)["optimizer"]
        assert 0.0001 <= spec["config"]["learning_rate"] <= 0.1
        if spec["class_name"] == "SGD":
            assert 0.5 <= spec["config"]["momentum"] <= 0.99


def test_log_scale_samples_are_in_range_and_spread_over_decades() -> None:
    grid = opt({"optimizer": ["Adam"], "lr": [1e-5, 1e-1, "log"]})
    rates = [_lr(c.compile_params) for c in cs.plan_configs(1, grid, None, "random", 400, 3)]
    assert all(1e-5 <= r <= 1e-1 for r in rates)
    decades = [sum(1 for r in rates if 10**k <= r < 10 ** (k + 1)) for k in range(-5, -1)]
    # Uniform in log10: about 100 per decade; a linear draw would put ~90% in the last one.
    assert all(60 <= d <= 140 for d in decades), decades
    linear = opt({"optimizer": ["Adam"], "lr": [1e-5, 1e-1, "linear"]})
    rates = [_lr(c.compile_params) for c in cs.plan_configs(1, linear, None, "random", 200, 3)]
    assert sum(r >= 1e-2 for r in rates) > 150
    assert all(len(f"{r:.12g}".replace("0.", "").lstrip("0")) <= 6 for r in rates)


def test_random_search_of_a_small_discrete_space() -> None:
    configs = cs.plan_configs([1], {"loss": ["mse"]}, FIT, "random", 2, seed=1)
    assert sorted(c.fit_params for c in configs) == [
        "batch_size=16, epochs=1",
        "batch_size=8, epochs=1",
    ]
    with pytest.raises(ArgumentError, match="cannot draw 3 distinct configurations from 2"):
        cs.plan_configs([1], {"loss": ["mse"]}, FIT, "random", 3, seed=1)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"search": "bayes"}, "search must be one of ['grid', 'random']"),
        ({"num_configs": 3}, "num_configs and seed are for random search"),
        ({"seed": 3}, "num_configs and seed are for random search"),
        ({"search": "random"}, "Random search needs num_configs"),
        ({"search": "random", "num_configs": 0}, "num_configs must be between 1 and"),
        ({"search": "random", "num_configs": True}, "Random search needs num_configs"),
    ],
)
def test_search_arguments(kwargs: dict[str, object], expected: str) -> None:
    with pytest.raises(ArgumentError, match=re.escape(expected)):
        cs.plan_configs(1, {"loss": ["mse"]}, FIT, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("compile_grid", "fit_grid", "search", "expected"),
    [
        # a distribution needs random search (MADlib refuses it in a grid too)
        (opt({"optimizer": ["Adam"], "lr": [0.001, 0.1, "log"]}),
         None, "grid", "compile_params_grid['lr'] is a distribution, which only random search"),
        (MSE, {"batch_size": [8, 64, "linear"]}, "grid",
         "fit_params_grid['batch_size'] is a distribution"),
        (MSE, {"batch_size": [8, "log"]}, "random", "looks like a distribution but has 2 items"),
        (MSE, {"batch_size": [64, 8, "linear"]}, "random", "low must be smaller than high"),
        (opt({"optimizer": ["SGD"], "lr": [0, 0.1, "log"]}),
         None, "random", "a 'log' distribution needs 0 < low"),
        (opt({"optimizer": ["SGD"], "momentum": [0.5, 1.0, "log_near_one"]}),
         None, "random", "needs 0 <= low < high < 1"),
    ],
)  # fmt: skip
def test_distributions_are_checked(
    compile_grid: dict[str, object], fit_grid: object, search: str, expected: str
) -> None:
    num = None if search == "grid" else 4
    with pytest.raises(ArgumentError, match=re.escape(expected)):
        cs.plan_configs(1, compile_grid, fit_grid, search, num, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("compile_grid", "fit_grid", "expected"),
    [
        # every configuration goes through the safe parser before anything is returned
        ({"loss": ["mse"], "optimizer_params_list": [{"optimizer": ["Adam"], "momentum": [0.9]}]},
         FIT, "Unknown optimizer argument 'momentum' for Adam"),
        (MSE, {"batch_size": [8, 0]}, "Parameter 'batch_size' must be a positive integer"),
        ({"loss": ["mse"]}, {"batch_sise": [8]}, "Unknown parameter 'batch_sise'"),
        ({"loss": ["mse"]}, {"callbacks": [["x"]]}, "Parameter 'callbacks' must be a list of"),
        ({"loss": ["sparse_categorical_crossentropy"]}, FIT, "dvml's labels are one-hot"),
        ({"loss": ["my_loss"]}, FIT, "Unknown loss 'my_loss'"),
        ({"loss": ["mse"], "metrics": ["acuracy"]}, FIT, "Unknown metric 'acuracy'"),
        ({"optimizer": ["adam"]}, FIT, "give no loss"),
        (opt({"lr": [0.1]}), FIT, "has no 'optimizer' key"),
        (opt({"optimizer": ["SGD"]}, optimizer=["adam"]),
         FIT, "optimizer_params_list'][0] repeats ['optimizer'] given outside it"),
        ({"loss": ["mse"], "optimizer_params_list": [{}]}, FIT, "must be a non-empty dict"),
        (MSE, {"optimizer_params_list": [{"optimizer": ["SGD"]}]},
         "belongs to compile_params_grid"),
    ],
)  # fmt: skip
def test_invalid_params_are_refused_up_front(
    compile_grid: dict[str, object], fit_grid: object, expected: str
) -> None:
    with pytest.raises(ArgumentError, match=re.escape(expected)) as info:
        cs.plan_configs(1, compile_grid, fit_grid)  # type: ignore[arg-type]
    message = str(info.value)
    if "refused" in message:  # it names the grid and the configuration at fault
        assert "Fix that entry of" in message and "Configuration: " in message


def test_random_search_refuses_a_sampled_bad_value() -> None:
    fit_grid = {"batch_size": [8], "epochs": [0, 1]}
    with pytest.raises(ArgumentError, match="Parameter 'epochs' must be a positive integer"):
        cs.plan_configs(1, {"loss": ["mse"]}, fit_grid, "random", 2, seed=0)


def test_custom_names_are_accepted_when_given() -> None:
    configs = cs.plan_configs(1, {"loss": ["my_loss"]}, None, custom_names=["my_loss"])
    assert configs[0].compile_params == "loss='my_loss'" and configs[0].fit_params == ""


def test_a_grid_too_large_is_refused_before_it_is_expanded() -> None:
    huge = {f"k{i}": list(range(10)) for i in range(9)}
    with pytest.raises(ArgumentError, match=r"The grid has 1000000000 configurations"):
        cs.plan_configs(1, {"loss": ["mse"]}, huge)


@pytest.mark.parametrize(
    ("arch_ids", "error"),
    [("1", ArgumentTypeError), ([1, "2"], ArgumentTypeError), ([True], ArgumentTypeError),
     ([], ArgumentError), (1.5, ArgumentTypeError)],
)  # fmt: skip
def test_arch_ids_are_checked(arch_ids: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="arch_ids"):
        cs.plan_configs(arch_ids, {"loss": ["mse"]}, FIT)  # type: ignore[arg-type]
    assert cs.check_arch_ids([3, 1, 3]) == [1, 3]


def test_cross_configs_is_madlibs_load_model_selection_table() -> None:
    configs = cs.cross_configs(
        [1, 2],
        ["loss='mse', optimizer='SGD(lr=0.1)'", "loss='mse',optimizer='SGD(learning_rate=0.1)'",
         {"loss": "mae"}],
        ["batch_size=8, epochs=1", "epochs=1, batch_size=8", "batch_size=16"],
    )  # fmt: skip
    # the spellings of one parameter set count once, whatever the order of their keys (as
    # MADlib's load_model_selection_table); the first text is kept as the user wrote it
    assert len(configs) == 2 * 2 * 2
    assert configs[0].compile_params == "loss='mse', optimizer='SGD(lr=0.1)'"
    assert [c.fit_params for c in configs[:2]] == ["batch_size=8, epochs=1", "batch_size=16"]
    with pytest.raises(ArgumentError, match=re.escape("fit_params_list[1] is refused")):
        cs.cross_configs(1, "loss='mse'", ["batch_size=8", "batch_size=eight"])
    with pytest.raises(ArgumentError, match=re.escape("compile_params_list[0] is refused")):
        cs.cross_configs(1, "loss='mse', optimizer=__import__('os')", None)


def test_check_config_rows() -> None:
    rows = [
        {"model_id": 1, "compile_params": "loss='mse'", "fit_params": "batch_size=8"},
        {"model_id": 1, "compile_params": {"loss": "mse"}, "fit_params": {"batch_size": 16}},
    ]
    configs = cs.check_config_rows(rows)
    assert [c.mst_key for c in configs] == [1, 2]
    assert configs[1].fit_params == "batch_size=16"
    keyed = [dict(r, mst_key=k) for r, k in zip(rows, (10, 5), strict=True)]
    assert [c.mst_key for c in cs.check_config_rows(keyed)] == [5, 10]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([], "has no rows"),
        ([{"model_id": 1, "compile_params": "loss='mse'"}], "missing ['fit_params']"),
        ([row(lr=1)], "unknown ['lr']"),
        ([row(model_id="1")], "model_id must be one integer"),
        ([{"model_id": 1, "compile_params": "loss='mse'", "fit_params": "epochs=-1"}],
         "row 0 of the model selection table is refused: Parameter 'epochs'"),
        ([{"model_id": 1, "compile_params": "loss='mse'", "fit_params": ""}] * 2,
         "row 1 is the same configuration as row 0"),
        ([{"mst_key": 1, "model_id": 1, "compile_params": "loss='mse'", "fit_params": ""},
          {"mst_key": 1, "model_id": 2, "compile_params": "loss='mse'", "fit_params": ""}],
         "row 1 repeats mst_key=1 of row 0"),
        ([{"mst_key": 1, "model_id": 1, "compile_params": "loss='mse'", "fit_params": ""},
          {"model_id": 2, "compile_params": "loss='mse'", "fit_params": ""}],
         "mst_key is given in 1 of 2 rows"),
        ([{"mst_key": 0, "model_id": 1, "compile_params": "loss='mse'", "fit_params": ""}],
         "mst_key must be a positive integer"),
    ],
)  # fmt: skip
def test_bad_rows_are_refused_naming_the_row(rows: list[dict[str, object]], expected: str) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError), match=re.escape(expected)):
        cs.check_config_rows(rows)


def test_sampled_integers_stay_within_bounds() -> None:
    fit_grid = {"batch_size": [1, 3, "log"], "epochs": [1]}
    configs = cs.plan_configs(1, {"loss": ["mse"]}, fit_grid, "random", 3, seed=0)
    assert sorted(parse_fit_params(c.fit_params)["batch_size"] for c in configs) == [1, 2, 3]
    assert math.isclose(grids.rounded(0.123456789), 0.123457)
