"""The pure pieces of dvml.fit's ``sync``: validation, the automatic choice, the weighted mean."""

from __future__ import annotations

import numpy as np
import pytest

import dvml
from dvml.train.sync import check_sync, choose_sync, flatten, unflatten, weighted_average


@pytest.mark.parametrize("good", [None, "step", "iteration", 1, 5, np.int64(3)])
def test_check_sync_accepts_the_modes(good: object) -> None:
    assert check_sync(good) == good


@pytest.mark.parametrize("bad", ["epoch", "Step", "", 0, -2, 1.5, True, False, [1], "3"])
def test_check_sync_refuses_other_values(bad: object) -> None:
    with pytest.raises(ValueError, match=r"sync must be 'step', 'iteration'.*Received: sync="):
        check_sync(bad)


def test_fit_refuses_a_bad_sync_before_touching_a_cluster() -> None:
    # no client exists in this test: the error must come from the up-front check
    with pytest.raises(ValueError, match=r"Received: sync='epochs'"):
        dvml.fit("any", "model", 1, "loss='mse'", sync="epochs", client=object())  # type: ignore[arg-type]


def test_choose_sync_default_and_explicit() -> None:
    assert choose_sync(None, True, [1, 2])[0] == "step"
    assert choose_sync(None, True, [1, 0])[0] == "iteration"  # one trainer without a GPU
    assert choose_sync(None, False, [1, 1])[0] == "iteration"  # GPUs not used
    assert choose_sync(None, False, [])[0] == "iteration"
    _, why = choose_sync(None, False, [0, 0])
    assert "CPU" in why and "averaged" in why
    assert choose_sync("step", False, [0, 0]) == ("step", "sync='step' was asked for")
    assert choose_sync(4, True, [1, 1])[0] == 4
    with pytest.raises(ValueError, match="Received: sync='x'"):
        choose_sync("x", False, [])


def test_weighted_average_matches_the_definition() -> None:
    rng = np.random.default_rng(0)
    shapes = [(3, 2), (2,), (4, 1, 2)]
    trainers = [[rng.random(s, dtype=np.float32) for s in shapes] for _ in range(3)]
    rows = [100, 300, 50]
    got = weighted_average(trainers, rows)
    for i, shape in enumerate(shapes):
        expected = sum(
            t[i].astype(np.float64) * r for t, r in zip(trainers, rows, strict=True)
        ) / sum(rows)
        assert got[i].shape == shape and got[i].dtype == np.float32
        np.testing.assert_allclose(got[i], expected, rtol=1e-6)


def test_identical_weights_average_to_themselves_bit_for_bit() -> None:
    # frozen layers are identical on every trainer and must stay exactly as they were
    w = [np.random.default_rng(1).normal(size=(50, 7)).astype(np.float32)]
    got = weighted_average([w, w], [748, 749])
    assert got[0].tobytes() == w[0].tobytes()


def test_flatten_round_trip_and_errors() -> None:
    like = [np.zeros((2, 3), np.float32), np.zeros(4, np.int64)]
    vector = np.arange(10, dtype=np.float64)
    back = unflatten(vector, like)
    assert [b.dtype for b in back] == [np.float32, np.int64]
    np.testing.assert_array_equal(flatten(back), vector)
    with pytest.raises(ValueError, match="has 9 values but the model's weights have 10"):
        unflatten(vector[:9], like)
    with pytest.raises(ValueError, match="one row count per trainer"):
        weighted_average([like], [1, 2])
    with pytest.raises(ValueError, match="no rows"):
        weighted_average([like], [0])


def test_config_key_is_automatic_by_default_and_checked() -> None:
    import dask

    from dvml import config

    assert config.get("train.sync") is None  # null = automatic
    with (
        dask.config.set({"dvml.train.sync": "fast"}),
        pytest.raises(ValueError, match=r"Received: sync='fast'"),
    ):
        dvml.fit("any", "model", 1, "loss='mse'", client=object())  # type: ignore[arg-type]
