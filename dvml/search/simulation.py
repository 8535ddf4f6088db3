"""Workers of given speeds driving a scheduler, without a cluster: busy fraction and wall time.

The model of a cluster is the one the schedulers see: a worker trains one model at a time, an
iteration takes the worker's ``seconds_per_iteration``, and moving a model between workers
costs nothing (in dvml only weights move; the data stays pinned). Losses come from a fixed
synthetic learning curve of each configuration (:func:`synthetic_loss`), so runs are exactly
repeatable.

- :func:`simulate_hyperband`: MADlib's diagonal Hyperband. Each diagonal is one
  ``fit_multiple`` call: its jobs go to the worker free first, and the next diagonal starts
  when the last job of this one ends (a barrier), so workers idle as the brackets shrink.
- :func:`simulate_asha`: ASHA, each idle worker asking for a job at once; it ends when
  ``finished`` models have reached the top rung (as many as Hyperband trains to its last
  round), and jobs still running then count as busy up to that moment.

Used by benchmark B16 and its tests. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dvml.configs.search_space import RandomDraw, SearchSpace
from dvml.search import journal as j
from dvml.search.asha import Asha
from dvml.search.automl_params import AshaParams
from dvml.search.hyperband import HyperbandRun

__all__ = ["Simulated", "simulate_asha", "simulate_hyperband", "synthetic_loss", "synthetic_space"]


@dataclasses.dataclass(frozen=True)
class Simulated:
    """What a simulated search did."""

    wall_time: float
    busy_fraction: float
    model_iterations: int
    configurations: int
    finished: int
    """Models that reached the top (R / max_t iterations in their last round)."""
    best_loss: float | None


def synthetic_space() -> SearchSpace:
    """A learning rate and a batch size, in MADlib's grammar."""
    return SearchSpace(
        [1],
        {
            "loss": ["categorical_crossentropy"],
            "optimizer_params_list": [{"optimizer": ["SGD"], "lr": [1e-4, 1.0, "log"]}],
        },
        {"batch_size": [8, 256, "log"]},
    )


def synthetic_loss(values: Mapping[str, Any], iterations: int) -> float:
    """A configuration's loss after ``iterations``: a floor set by its parameters, plus a
    term that shrinks with training (best near lr=0.01, batch 32)."""
    lr = float(values["optimizer.0.lr"])
    batch = float(values["fit.batch_size"])
    floor = (math.log10(lr) + 2.0) ** 2 / 4.0 + (math.log2(batch) - 5.0) ** 2 / 50.0
    return floor + 1.0 / math.sqrt(1.0 + iterations)


def _busy(intervals: Sequence[tuple[float, float]], end: float) -> float:
    return sum(max(0.0, min(b, end) - a) for a, b in intervals if a < end)


def simulate_hyperband(
    speeds: Sequence[float], R: int = 81, eta: int = 3, skip_last: int = 0, seed: int = 0
) -> Simulated:
    """MADlib's diagonal Hyperband on workers with ``speeds`` seconds per iteration."""
    import random

    run = HyperbandRun(R, eta, skip_last)
    draw = RandomDraw(random.Random(seed))
    space = synthetic_space()
    points = {k: space.sample(draw) for k in range(1, run.num_configs + 1)}
    trained = dict.fromkeys(points, 0)
    intervals: list[tuple[float, float]] = []
    clock = 0.0
    iterations = 0
    finished = 0
    while (diagonal := run.next_diagonal()) is not None:
        free = [(clock, w) for w in range(len(speeds))]
        heapq.heapify(free)
        end = clock
        losses = {}
        for key in diagonal.keys:
            start, w = heapq.heappop(free)
            stop = start + diagonal.num_iterations * speeds[w]
            intervals.append((start, stop))
            heapq.heappush(free, (stop, w))
            end = max(end, stop)
            trained[key] += diagonal.num_iterations
            iterations += diagonal.num_iterations
            losses[key] = synthetic_loss(points[key], trained[key])
        run.report(losses)
        if diagonal.i == run.num_diagonals - 1:
            finished = len(diagonal.keys)
        clock = end
    best = run.best()
    return Simulated(
        wall_time=clock,
        busy_fraction=_busy(intervals, clock) / (len(speeds) * clock),
        model_iterations=iterations,
        configurations=run.num_configs,
        finished=finished,
        best_loss=None if best is None else run.losses[best],
    )


def simulate_asha(
    speeds: Sequence[float],
    finished: int = 10,
    max_t: int = 81,
    eta: int = 3,
    grace_period: int = 1,
    max_configs: int = 100_000,
    seed: int = 0,
) -> tuple[Simulated, Asha]:
    """ASHA on workers with ``speeds`` seconds per iteration, until ``finished`` models reach
    ``max_t`` (or ASHA stops). Returns the figures and the scheduler (its journal included)."""
    params = AshaParams(max_t=max_t, eta=eta, grace_period=grace_period, max_configs=max_configs)
    asha = Asha(synthetic_space(), params, seed=seed)
    names = [f"w{i}" for i in range(len(speeds))]
    running: list[tuple[float, int, int, float]] = []  # (end, worker, trial, start)
    intervals: list[tuple[float, float]] = []
    idle: list[int] = []
    values: dict[int, dict[str, Any]] = {}
    done = 0
    iterations = 0
    clock = 0.0

    def give(w: int, now: float) -> bool:
        nonlocal iterations
        decision = asha.apply(j.Ask(names[w], now))
        if isinstance(decision, j.Start | j.Promote):
            if isinstance(decision, j.Start):
                values[decision.trial_id] = decision.values
            iterations += decision.iterations
            heapq.heappush(
                running, (now + decision.iterations * speeds[w], w, decision.trial_id, now)
            )
            return True
        if isinstance(decision, j.Wait):
            idle.append(w)
        return False

    for w in range(len(speeds)):
        give(w, 0.0)
    while running and done < finished:
        end, w, trial_id, start = heapq.heappop(running)
        clock = end
        intervals.append((start, end))
        trial = asha.trials[trial_id]
        total = asha.levels[trial.target]
        loss = synthetic_loss(values[trial_id], total)
        decision = asha.apply(
            j.Result(trial_id, total, loss, names[w], end, end - start, f"ckpt-{trial_id}-{total}")
        )
        if isinstance(decision, j.Finish):
            done += 1
        give(w, end)
        waiting, idle[:] = list(idle), []
        for other in waiting:
            give(other, end)
    # jobs still running count as busy up to the end
    intervals.extend((start, clock) for _, _, _, start in running)
    best = asha.best()
    return (
        Simulated(
            wall_time=clock,
            busy_fraction=_busy(intervals, clock) / (len(speeds) * clock) if clock else 0.0,
            model_iterations=iterations,
            configurations=len(asha.trials),
            finished=done,
            best_loss=None if best is None else asha.trials[best].losses[asha.trials[best].rung],
        ),
        asha,
    )
