"""Where a rerun of a lock-step job starts (:func:`dvml.train.runtime.lockstep.resume_from`),
from checkpoints each trainer wrote after its iterations
(:func:`dvml.train.runtime.sync_program.save_iteration`) in a real directory. No cluster: the
trainers' checkpoints are written and read here, as each trainer and its worker do."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from dvml.registry.weights import weights_from_bytes
from dvml.train.runtime.checkpoints import CheckpointStore
from dvml.train.runtime.launch import checkpoint_state
from dvml.train.runtime.lockstep import resume_from
from dvml.train.runtime.sync_program import save_iteration


def state(iteration: int, done: list[int], key: str = "job-1") -> dict[str, Any]:
    """A trainer's last checkpoint, as its worker reads it: after ``iteration``, with the
    iterations in ``done`` in its history."""
    return {
        "job_key": key,
        "iteration": iteration,
        "history": [{"iteration": i, "fit_loss": 1.0 / i} for i in done],
        "weights": f"weights after {iteration}".encode(),
    }


@pytest.mark.parametrize(
    "states",
    [
        pytest.param([], id="no trainer"),
        pytest.param([state(3, [1, 2, 3]), None], id="a trainer has no checkpoint"),
        pytest.param([state(3, [1, 2, 3]), state(3, [1, 2, 3], key="job-0")],
                     id="a trainer's checkpoint is of another job"),
        pytest.param([None, None], id="no checkpoint at all"),
    ],
)  # fmt: skip
def test_a_rerun_starts_afresh_unless_every_trainer_checkpointed_this_job(
    states: list[dict[str, Any] | None],
) -> None:
    assert resume_from(states, "job-1") is None


def test_trainers_at_the_same_iteration_resume_after_it() -> None:
    found = resume_from([state(3, [1, 2, 3]), state(3, [1, 2, 3])], "job-1")
    assert found is not None
    start, weights, history = found
    assert (start, weights) == (4, b"weights after 3")
    assert [r["iteration"] for r in history] == [1, 2, 3]


def test_a_trainer_ahead_of_the_others_is_not_followed() -> None:
    """w1 finished iteration 4, w0 only 3: every trainer resumes after 3, from the state of
    iteration 3 (w0's), with the history up to 3."""
    found = resume_from([state(3, [1, 2, 3]), state(4, [1, 2, 3, 4])], "job-1")
    assert found is not None
    start, weights, history = found
    assert (start, weights) == (4, b"weights after 3")
    assert [r["iteration"] for r in history] == [1, 2, 3]


def test_a_trainer_far_behind_sends_everyone_back_to_its_state() -> None:
    found = resume_from([state(2, [1, 2]), state(4, [1, 2, 3, 4]), state(4, [1, 2, 3, 4])],
                        "job-1")  # fmt: skip
    assert found is not None
    start, weights, history = found
    assert (start, weights) == (3, b"weights after 2")
    assert [r["iteration"] for r in history] == [1, 2]


def test_no_common_iteration_whose_state_is_kept_starts_afresh() -> None:
    """Each trainer keeps only its last state: w0's iteration 3 is not in w1's history (a
    history cut short) and w1's 5 not in w0's, so no kept state is common."""
    assert resume_from([state(3, [1, 2, 3]), state(5, [4, 5])], "job-1") is None


# -- the same rule over checkpoints written to disk --------------------------------------------


def _job(worker: str) -> dict[str, Any]:
    return {"job_key": "job-1", "fit_params": {"epochs": 2}, "worker_name": worker}


def _weights(iteration: int) -> list[np.ndarray]:
    return [np.full((2, 3), iteration, np.float32), np.arange(iteration, dtype=np.float64)]


def _train(directory: str, worker: str, iterations: int) -> None:
    """A trainer's checkpoints: one after each iteration, each replacing the one before."""
    store, history = CheckpointStore(directory), []
    for i in range(1, iterations + 1):
        history.append({"iteration": i, "fit_loss": 1.0 / i})
        save_iteration(store, _job(worker), i, _weights(i), list(history))


def test_a_checkpoint_holds_the_weights_history_and_next_data_position(
    tmp_path: pathlib.Path,
) -> None:
    directory = str(tmp_path / "checkpoints" / "job-1")
    _train(directory, "w0", 3)
    found = checkpoint_state(directory, "w0")
    assert found is not None
    assert found["job_key"] == "job-1" and found["iteration"] == 3
    assert [r["iteration"] for r in found["history"]] == [1, 2, 3]
    # the next iteration (4) starts at its first epoch: 3 iterations of 2 epochs are done
    assert found["data_position"] == {"iteration": 4, "epoch": 6}
    for got, expected in zip(weights_from_bytes(found["weights"]), _weights(3), strict=True):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_a_rerun_resumes_after_the_last_iteration_both_trainers_checkpointed(
    tmp_path: pathlib.Path,
) -> None:
    """w1 died during iteration 3 (its checkpoint is of iteration 2): the rerun starts at 3
    from the weights of iteration 2."""
    directory = str(tmp_path / "job-1")
    _train(directory, "w0", 3)
    _train(directory, "w1", 2)
    found = resume_from([checkpoint_state(directory, w) for w in ("w0", "w1")], "job-1")
    assert found is not None
    start, weights, history = found
    assert start == 3
    np.testing.assert_array_equal(weights_from_bytes(weights)[0], _weights(2)[0])
    assert [r["iteration"] for r in history] == [1, 2]


@pytest.mark.parametrize("damage", ["state removed", "record torn", "record removed"])
def test_a_torn_or_missing_checkpoint_of_one_trainer_starts_the_job_afresh(
    tmp_path: pathlib.Path, damage: str
) -> None:
    directory = tmp_path / "job-1"
    _train(str(directory), "w0", 2)
    _train(str(directory), "w1", 2)
    assert resume_from([checkpoint_state(str(directory), w) for w in ("w0", "w1")], "job-1")
    state_file, record = directory / "w1.npz", directory / "w1.npz.json"
    if damage == "state removed":
        state_file.unlink()
    elif damage == "record torn":
        record.write_text(record.read_text()[:20])
    else:
        record.unlink()
    states = [checkpoint_state(str(directory), w) for w in ("w0", "w1")]
    assert states[1] is None
    assert resume_from(states, "job-1") is None
