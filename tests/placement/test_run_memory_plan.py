"""The memory plan of ``dvml.run`` (pure): runtime, zygote, batches and the caller's estimate."""

from __future__ import annotations

import pytest

from dvml.exceptions import ArgumentError, MemoryPlanError
from dvml.placement.fit_memory import BATCHES_HELD, HostRoom
from dvml.placement.run_memory import plan_run
from dvml.train.run_memory import memory_estimate
from dvml.train.trainer_memory import check_fit_fits

MiB = 2**20
TRAINERS = [("w0", "a", 32), ("w1", "a", 32), ("w2", "b", 16)]
ROOMS = [HostRoom("a", 4096 * MiB), HostRoom("b", 4096 * MiB)]


def test_each_trainer_counts_its_runtime_its_batches_and_the_estimate() -> None:
    plan = plan_run(TRAINERS, 65, ROOMS, runtime=128 * MiB, zygote=650 * MiB, built=40 * MiB)
    w0, w1, w2 = plan.trainers
    assert w0.runtime == 128 * MiB and w0.weights == 40 * MiB and w0.evaluation == 0
    assert w0.batches == 32 * BATCHES_HELD * 65 * 4 and w2.batches == w0.batches // 2
    a, b = plan.hosts
    # the zygote once per host, beside its trainers
    assert a.process_bytes == 650 * MiB + w0.total + w1.total
    assert b.process_bytes == 650 * MiB + w2.total
    assert plan.fits and not plan.fixes
    assert plan.notes == ("weights: the memory= estimate of what train_fn builds, 40.0 MiB per "
                          "trainer",)  # fmt: skip


def test_without_an_estimate_the_plan_says_it_is_a_lower_bound() -> None:
    plan = plan_run(TRAINERS, 65, ROOMS, runtime=128 * MiB)
    assert all(t.weights == 0 for t in plan.trainers)
    (note,) = plan.notes
    assert "not counted" in note and "memory=" in note and "lower bound" in note


def test_a_run_that_does_not_fit_is_refused_with_its_fixes() -> None:
    rooms = [HostRoom("a", 1400 * MiB), HostRoom("b", 4096 * MiB)]
    plan = plan_run(TRAINERS, 65, rooms, runtime=128 * MiB, zygote=650 * MiB, built=300 * MiB)
    assert not plan.fits and [h.host for h in plan.short] == ["a"]
    assert any("fewer trainers per host: 1 of 2" in f for f in plan.fixes), plan.fixes
    with pytest.raises(MemoryPlanError, match=r"The dvml.run 'loop' does not fit") as refused:
        check_fit_fits(plan, "loop", 64, job="dvml.run 'loop'")
    assert refused.value.plan is plan and "300.0 MiB per trainer" in str(refused.value)


def test_a_host_without_room_is_an_argument_error() -> None:
    with pytest.raises(ArgumentError, match=r"No room given for the hosts \['b'\]"):
        plan_run(TRAINERS, 65, ROOMS[:1], runtime=128 * MiB)


@pytest.mark.parametrize(
    ("given", "expected"), [(None, None), (0, 0), (5 * MiB, 5 * MiB), ("300MiB", 300 * MiB)]
)
def test_memory_estimates_are_bytes_or_sizes(given: object, expected: int | None) -> None:
    assert memory_estimate(given) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("given", [-1, "-1 MiB", "lots", True, 1.5, [1]])
def test_a_memory_estimate_that_is_no_size_is_refused(given: object) -> None:
    with pytest.raises(ArgumentError, match="memory must be the bytes") as refused:
        memory_estimate(given)  # type: ignore[arg-type]
    assert repr(given) in str(refused.value)
