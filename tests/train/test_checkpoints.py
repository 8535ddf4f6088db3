"""The one resume rule of a lockstep job (:func:`dvml.train.runtime.checkpoints.resume_iteration`):
a rerun resumes after the last iteration that every participant completed and whose state is
still kept, else starts afresh. Pure: plain values in, an iteration out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from dvml.train.runtime.checkpoints import resume_iteration


def kept(*iterations: int) -> Callable[[int], bool]:
    return lambda i: i in iterations


CASES: list[tuple[str, Mapping[Any, Iterable[int]], Callable[[int], bool], int]] = [
    ("no participant: start afresh", {}, kept(1), 0),
    ("one participant, every state kept", {"w0": [1, 2, 3]}, kept(1, 2, 3), 3),
    ("older states pruned: the last is kept", {"w0": [1, 2, 3]}, kept(2, 3), 3),
    ("the last state is torn: the one before", {"w0": [1, 2, 3]}, kept(1, 2), 2),
    ("no state kept: start afresh", {"w0": [1, 2, 3]}, kept(), 0),
    ("one trainer is ahead: the last common one",
     {"w0": [1, 2, 3], "w1": [1, 2, 3, 4]}, kept(3, 4), 3),
    ("the common iteration's state is gone: an earlier one",
     {"w0": [1, 2, 3], "w1": [1, 2, 3, 4]}, kept(2, 4), 2),
    ("a participant completed nothing: start afresh", {"w0": [1, 2], "w1": []}, kept(1, 2), 0),
    ("nothing in common: start afresh", {1: [2, 3], 2: [1]}, kept(1, 2, 3), 0),
    ("order and repeats do not matter", {"w0": [3, 1, 2, 2], "w1": (2, 3, 1)}, kept(1, 2, 3), 3),
    ("any iterable, read once", {"w0": iter([1, 2]), "w1": iter([2, 1])}, kept(1, 2), 2),
]  # fmt: skip


@pytest.mark.parametrize(
    ("completed", "has_state", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_resume_iteration(
    completed: Mapping[Any, Iterable[int]], has_state: Callable[[int], bool], expected: int
) -> None:
    assert resume_iteration(completed, has_state) == expected


def test_only_iterations_every_participant_completed_are_looked_up() -> None:
    """A state is looked for only where all participants finished (a lagging trainer's
    missing iterations are never loaded from a peer's checkpoint)."""
    asked: list[int] = []

    def has_state(i: int) -> bool:
        asked.append(i)
        return True

    assert resume_iteration({"w0": [1, 2, 3, 4], "w1": [1, 2], "w2": [1, 2, 3]}, has_state) == 2
    assert set(asked) <= {1, 2}, asked
