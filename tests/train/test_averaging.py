"""Model averaging's arithmetic (:mod:`dvml.train.runtime.averaging`), without TensorFlow.

The trainers are threads here and the all-reduce a sum over them (:class:`Ring`): what is
tested is what dvml puts into the collective and makes of its sum (row weights, float64,
identical bits on every trainer, the chief's weights on broadcast, every k batches). The
TensorFlow collective itself is exercised by the fit cluster tests (sync="iteration", k).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from dvml.train.runtime.averaging import Averager, averaging_callback


class Ring:
    """An in-process all-reduce over ``n`` threads: each gets the sum of all vectors."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=10)
        self.parts: list[np.ndarray | None] = [None] * n

    def sum(self, rank: int, vector: np.ndarray) -> np.ndarray:
        self.parts[rank] = np.array(vector, copy=True)
        self.barrier.wait()
        total = np.sum(np.stack([p for p in self.parts if p is not None]), axis=0)
        self.barrier.wait()  # every trainer has its sum before the next round writes
        return total


class RingAverager(Averager):
    """dvml's averager, with the ring in place of the strategy's collective."""

    def __init__(self, ring: Ring, rank: int, rows: int) -> None:
        super().__init__(strategy=None, rows=rows)
        self.ring, self.rank = ring, rank

    def all_reduce(self, vector: np.ndarray) -> np.ndarray:
        return self.ring.sum(self.rank, vector)


class Model:
    """What the averager reads and writes of a Keras model: its list of weights."""

    def __init__(self, weights: list[np.ndarray]) -> None:
        self.weights = [np.array(w, copy=True) for w in weights]

    def get_weights(self) -> list[np.ndarray]:
        return [np.array(w, copy=True) for w in self.weights]

    def set_weights(self, weights: list[np.ndarray]) -> None:
        assert [w.shape for w in weights] == [w.shape for w in self.weights]
        self.weights = [np.array(w, copy=True) for w in weights]


def on_every_trainer(averagers: list[RingAverager], act: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=act, args=(rank,)) for rank in range(len(averagers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)


def trainers(rows: list[int], weights: list[list[np.ndarray]]) -> tuple[list[Any], list[Any]]:
    ring = Ring(len(rows))
    averagers = [RingAverager(ring, rank, r) for rank, r in enumerate(rows)]
    return averagers, [Model(w) for w in weights]


def test_every_trainer_ends_on_the_row_weighted_mean_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    rows = [1, 2, 5]
    weights = [
        [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)]
        for _ in rows
    ]
    averagers, models = trainers(rows, weights)
    on_every_trainer(averagers, lambda rank: averagers[rank].average(models[rank]))
    for layer in range(2):
        expected = (
            sum(r * w[layer].astype(np.float64) for r, w in zip(rows, weights, strict=True)) / 8
        )
        first = models[0].weights[layer]
        assert first.dtype == np.float32  # the model's own dtype, not the float64 of the sum
        np.testing.assert_allclose(first, expected, rtol=1e-6)
        for model in models[1:]:
            assert model.weights[layer].tobytes() == first.tobytes()
    assert [a.count for a in averagers] == [1, 1, 1]
    assert all(a.seconds >= 0 for a in averagers)


def test_weights_equal_on_every_trainer_come_back_unchanged() -> None:
    """A frozen layer: averaged with any row counts, its bits stay as they were."""
    frozen = np.random.default_rng(5).normal(size=(64,)).astype(np.float32)
    rows = [3, 7, 1_000_003]
    averagers, models = trainers(rows, [[frozen] for _ in rows])
    on_every_trainer(averagers, lambda rank: averagers[rank].average(models[rank]))
    for model in models:
        assert model.weights[0].tobytes() == frozen.tobytes()


def test_broadcast_gives_every_trainer_the_chiefs_weights_exactly() -> None:
    rng = np.random.default_rng(7)
    weights = [[rng.normal(size=(5, 2)).astype(np.float32)] for _ in range(3)]
    averagers, models = trainers([10, 10, 10], weights)
    on_every_trainer(averagers, lambda rank: averagers[rank].broadcast(models[rank], rank == 0))
    for model in models:
        assert model.weights[0].tobytes() == weights[0][0].tobytes()
    assert [a.count for a in averagers] == [0, 0, 0]  # a broadcast is not an average


class _Callback:
    """The part of keras.callbacks.Callback the callback relies on (Keras sets ``model``)."""

    model: Any = None


def test_local_sgd_averages_every_k_batches_and_flushes_the_rest() -> None:
    keras = types.SimpleNamespace(callbacks=types.SimpleNamespace(Callback=_Callback))
    rows = [2, 6]
    weights = [[np.full(3, 1.0, np.float32)], [np.full(3, 5.0, np.float32)]]
    averagers, models = trainers(rows, weights)
    callbacks = [averaging_callback(keras, a, every=3) for a in averagers]
    for callback, model in zip(callbacks, models, strict=True):
        callback.model = model

    def epoch(rank: int) -> None:
        for batch in range(7):  # averages after batches 3 and 6; one batch is left over
            callbacks[rank].on_train_batch_end(batch)

    on_every_trainer(averagers, epoch)
    assert [a.count for a in averagers] == [2, 2]
    np.testing.assert_array_equal(models[0].weights[0], np.full(3, 4.0, np.float32))
    on_every_trainer(averagers, lambda rank: callbacks[rank].flush(models[rank]))
    assert [a.count for a in averagers] == [3, 3]
    on_every_trainer(averagers, lambda rank: callbacks[rank].flush(models[rank]))
    assert [a.count for a in averagers] == [3, 3]  # nothing left since the last average
