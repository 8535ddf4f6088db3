"""The configurations a search's memory plan is made from (pure): its space's largest."""

from __future__ import annotations

from dvml.configs.search_space import SearchSpace
from dvml.search.search_memory import largest_points

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [
        {"optimizer": ["Adam"], "lr": [0.001, 0.1, "log"]},
        {"optimizer": ["SGD"], "momentum": [0.5, 0.9]},
    ],
    "metrics": ["accuracy"],
}


def test_one_point_per_architecture_and_optimizer_at_the_largest_batch() -> None:
    space = SearchSpace([3, 5], COMPILE, {"batch_size": [8, 64, 16], "epochs": [1]})
    points = largest_points(space)
    assert [(m, "Adam" in c, "SGD" in c) for m, c, _ in points] == [
        (3, True, False), (3, False, True), (5, True, False), (5, False, True),
    ]  # fmt: skip
    assert all("batch_size=64" in f for _, _, f in points), points


def test_a_batch_range_is_planned_at_its_top() -> None:
    space = SearchSpace(
        [3], {"loss": ["categorical_crossentropy"], "optimizer_params_list": [
            {"optimizer": ["Adam"]}]}, {"batch_size": [8, 100, "linear"]},
    )  # fmt: skip
    assert [f for _, _, f in largest_points(space)] == ["batch_size=100"]
