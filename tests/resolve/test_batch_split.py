"""Splitting the global batch over trainers: even where possible, one row apart otherwise."""

from __future__ import annotations

import pytest

from dvml.exceptions import ParameterError
from dvml.resolve.batches import per_worker_batch_sizes, row_weights, steps_per_epoch


@pytest.mark.parametrize(
    ("global_batch", "rows", "expected"),
    [
        (32, [100, 100], [16, 16]),
        (5, [50, 50], [3, 2]),  # MADlib's iris example: batch_size=5 on 2 trainers
        (5, [50, 51], [2, 3]),  # the extra row goes to the worker holding more rows
        (7, [10, 11, 11], [2, 3, 2]),
        (3, [4, 4, 4], [1, 1, 1]),
        (10, [9, 9, 10, 10], [2, 2, 3, 3]),
    ],
)
def test_split_is_as_even_as_possible(
    global_batch: int, rows: list[int], expected: list[int]
) -> None:
    sizes = per_worker_batch_sizes(global_batch, rows)
    assert sizes == expected
    assert sum(sizes) == global_batch and max(sizes) - min(sizes) <= 1


def test_batch_smaller_than_trainers_is_refused_naming_both() -> None:
    with pytest.raises(ParameterError, match=r"at least 3\. Received: batch_size=2"):
        per_worker_batch_sizes(2, [10, 10, 10])


def test_steps_are_equal_for_all_and_fit_every_worker() -> None:
    rows, sizes = [50, 51], per_worker_batch_sizes(5, [50, 51])
    steps = steps_per_epoch(rows, sizes)
    assert steps == 17  # min(50 // 2, 51 // 3); the other way round it would be 50 // 3 = 16
    assert steps_per_epoch(rows, sizes[::-1]) == 16
    assert all(steps * b <= r for r, b in zip(rows, sizes, strict=True))
    assert steps_per_epoch([40, 41], 4) == 10  # one size for all still works


def test_steps_too_large_batch_names_the_short_worker() -> None:
    with pytest.raises(ParameterError, match="holds only 2 rows, fewer than its per-worker batch"):
        steps_per_epoch([10, 2], [2, 3])


@pytest.mark.parametrize(
    ("batches", "expected"),
    [
        ([16, 16], [1.0, 1.0]),  # even: unweighted
        ([6, 2], [1.5, 0.5]),  # a straggler's smaller share of the global batch of 8
        ([3, 2], [1.2, 0.8]),  # MADlib's iris batch 5 on 2 trainers
        ([1, 1, 2], [0.75, 0.75, 1.5]),
    ],
)
def test_row_weights_make_the_mean_of_local_means_the_global_mean(
    batches: list[int], expected: list[float]
) -> None:
    weights = row_weights(batches)
    assert weights == pytest.approx(expected)
    # tf-keras's rule: each trainer's weighted mean over its b rows, scaled by 1/n, summed;
    # with a loss of 1 per row the global mean is 1 (each row counts 1/B)
    n, total = len(batches), sum(batches)
    assert sum(w * b / b / n for w, b in zip(weights, batches, strict=True)) == pytest.approx(1)
    assert all(w / b / n == pytest.approx(1 / total) for w, b in zip(weights, batches, strict=True))


@pytest.mark.parametrize("batches", [[], [4, 0], [2.5, 2], [True, 3]])
def test_row_weights_refuse_what_is_not_a_batch_per_trainer(batches: list[object]) -> None:
    with pytest.raises(ParameterError, match=r"positive int.*Received: per_worker_batch="):
        row_weights(batches)  # type: ignore[arg-type]
