"""The memory plan of a model-hopper job (pure): where each configuration's state is held."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dvml.exceptions import ArgumentError, MemoryPlanError
from dvml.placement.fit_memory import BATCHES_HELD, HostRoom, plan_fit
from dvml.placement.hop_memory import HopConfig, plan_hop
from dvml.train.hop_admission import check_hop_fits

MiB = 2**20
GiB = 2**30


def mlp(hidden: int) -> dict[str, Any]:
    """Dense(hidden) then Dense(3) over 4 features: (4+1)*hidden + (hidden+1)*3 parameters."""
    layers = [("InputLayer", {}), ("Dense", {"units": hidden}), ("Dense", {"units": 3})]
    return {
        "class_name": "Sequential",
        "config": {"layers": [{"class_name": k, "config": c} for k, c in layers]},
    }


def params(hidden: int) -> int:
    return 5 * hidden + (hidden + 1) * 3


SMALL, BIG = HopConfig(mlp(10), "adam", 8), HopConfig(mlp(100), "sgd", 32)
ROW = 4 * (4 + 3)  # x (4 floats) + one-hot y (3) as the model reads them
TRAINERS = [("w0", "h0", 100), ("w1", "h0", 100), ("w2", "h1", 20)]
ROOMS = [HostRoom("h0", 64 * GiB), HostRoom("h1", 64 * GiB)]


def test_each_trainer_holds_the_largest_in_the_step_and_every_other_compiled() -> None:
    plan = plan_hop(TRAINERS, [[4]], 3, [SMALL, BIG], ROOMS, runtime=100 * MiB, margin=0.2)
    assert plan.fits and [t.worker for t in plan.trainers] == ["w0", "w1", "w2"]
    small_state = 4 * params(10) * (1 + 2)  # Adam: weights + 2 slots
    big_state = 4 * params(100) * (1 + 0)  # SGD: weights alone
    big_step = 4 * params(100) * 2  # weights + gradients
    for t in plan.trainers:
        assert t.runtime == 100 * MiB
        assert t.weights == big_step  # the largest in the step (by its bytes there)
        assert t.models == small_state  # every other configuration kept compiled
        # the parked states: a third of both, rounded up, plus one arriving (the largest)
        assert t.parked == math.ceil((small_state + big_state) / 3) + max(small_state, big_state)
        assert t.total == t.trainer_bytes + t.parked
    # the largest batch, capped by the trainer's rows (w2 holds 20)
    w0, _, w2 = plan.trainers
    assert (w0.batch, w2.batch) == (32, 20)
    acts_big = 100 + 3
    assert w0.batches == 32 * (BATCHES_HELD * ROW + 2 * 4 * acts_big)
    assert w2.evaluation == 20 * (ROW + 4 * 3)
    # a host's needed bytes are its trainers' with the margin
    h0 = plan.hosts[0]
    assert h0.host == "h0" and h0.needed == w0.total * 2
    assert h0.with_margin == math.ceil(h0.needed * 1.2)
    table = plan.table()
    assert list(table["models"]) == [small_state] * 3 and list(table["parked"]) == [w0.parked] * 3


def test_one_configuration_is_a_fit_of_one_trainer_per_worker_plus_its_parked_state() -> None:
    """A hopper job of one configuration holds what a fit of that batch per trainer holds,
    and its parked state (share + arriving) besides."""
    rooms = [HostRoom("h0", 64 * GiB)]
    trainers = [("w0", "h0", 10_000), ("w1", "h0", 10_000)]  # rows cap no batch
    hop = plan_hop(trainers, [[4]], 3, [BIG], rooms, runtime=MiB)
    fit = plan_fit([("w0", "h0", 32), ("w1", "h0", 32)], [[4]], 3, mlp(100), "sgd", rooms,
                   runtime=MiB)  # fmt: skip
    for h, f in zip(hop.trainers, fit.trainers, strict=True):
        assert (h.weights, h.batches, h.evaluation, h.models) == (
            f.weights, f.batches, f.evaluation, 0,
        )  # fmt: skip
        assert h.parked == math.ceil(4 * params(100) / 2) + 4 * params(100)


def test_too_many_configurations_are_refused_with_how_many_fit() -> None:
    """A host whose room holds the trainers' runtime and a few configurations only: refused,
    the fixes name how many configurations fit, and the numbers are in the message."""
    big = HopConfig(mlp(20000), "adam", 8)  # ~0.4 MB of weights, 1.2 MB of state
    state = 4 * params(20000) * 3
    trainers = [("w0", "h0", 50), ("w1", "h0", 50)]
    one = plan_hop(trainers, [[4]], 3, [big], [HostRoom("h0", 64 * GiB)], runtime=10 * MiB)
    per_config = state * 1.5  # compiled in the trainer, and half a parked share (2 trainers)
    # room for the trainers with ~5 configurations each, margin included
    fixed = one.trainers[0].total - one.trainers[0].models - one.trainers[0].parked
    room = int(2 * (fixed + 5.5 * per_config) * 1.2)
    plan = plan_hop(trainers, [[4]], 3, [big] * 20, [HostRoom("h0", room)], runtime=10 * MiB)
    assert not plan.fits
    fewer = [f for f in plan.fixes if f.startswith("fewer configurations")]
    assert fewer and "at most 5 of these 20 fit" in fewer[0], plan.fixes
    assert any("more memory on the hosts" in f for f in plan.fixes)
    with pytest.raises(MemoryPlanError) as info:
        check_hop_fits(plan, "dvml.fit_multiple 'sel'", 20)
    message = str(info.value)
    assert "No trainer was started" in message and "20 configurations on 2 trainers" in message
    assert "fewer configurations" in message and info.value.plan is plan
    # the same five fit
    assert plan_hop(trainers, [[4]], 3, [big] * 5, [HostRoom("h0", room)], runtime=10 * MiB).fits


def test_the_plan_refuses_missing_rooms_and_empty_jobs() -> None:
    with pytest.raises(ArgumentError, match="missing \\['h1'\\]"):
        plan_hop(TRAINERS, [[4]], 3, [SMALL], [HostRoom("h0", GiB)])
    with pytest.raises(ArgumentError, match="0 configurations"):
        plan_hop(TRAINERS, [[4]], 3, [], ROOMS)


def test_a_batch_too_large_gets_the_largest_batch_that_fits_per_configuration() -> None:
    """Batches dominate: the fix names each configuration's batch (not a global one split
    over trainers), and every configuration at that batch fits."""
    wide = {
        "class_name": "Sequential",
        "config": {"layers": [{"class_name": "Dense", "config": {"units": 10}}]},
    }
    trainers = [("w0", "h0", 10_000), ("w1", "h0", 10_000)]

    def plan(batch: int, room: int) -> Any:
        configs = [HopConfig(wide, "adam", batch), HopConfig(wide, "sgd", batch // 2)]
        return plan_hop(trainers, [[1000]], 10, configs, [HostRoom("h0", room)], runtime=MiB)

    room = int(plan(1024, 64 * GiB).hosts[0].with_margin * 1.01)  # 1024 rows fit, 4096 not
    refused = plan(4096, room)
    assert not refused.fits
    fix = [f for f in refused.fixes if f.startswith("a smaller batch_size")]
    assert fix and "in every configuration" in fix[0] and "global" not in fix[0], refused.fixes
    rows = int(fix[0].split("at most ")[1].split()[0])
    assert 1024 <= rows < 4096
    assert plan(rows, room).fits and not plan(rows + 64, room).fits
