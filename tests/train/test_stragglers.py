"""The straggler rule (dvml.train.stragglers), on plain figures: no cluster."""

from __future__ import annotations

import pytest

from dvml.train.stragglers import (
    TrainerTiming,
    by_iteration,
    cumulative,
    describe,
    hop_timings,
    run_summary,
    stragglers,
    timings_of,
)

T = TrainerTiming

CASES = [
    # (timings, workers named, slowest ratio)
    pytest.param([T("w0", 10, 2.0), T("w1", 10, 2.0)], [], None, id="equal"),
    pytest.param([T("w0", 10, 2.0)], [], None, id="one-trainer"),
    pytest.param([], [], None, id="none"),
    pytest.param([T("w0", 10, 2.0), T("w1", 10, 2.9)], [], None, id="within-1.5x"),
    pytest.param([T("w0", 10, 2.0), T("w1", 10, 3.0)], [], None, id="exactly-1.5x-is-not-over"),
    # sync="iteration": w0 waited 2 s of its 4 for w1 in the averaging; w1 is named, not w0
    pytest.param([T("w0", 10, 4.0, 2.0), T("w1", 10, 4.0, 0.1)], ["w1"], 1.95, id="the-waiter"),
    # per step: w1 trained half the steps in the same seconds
    pytest.param([T("w0", 20, 2.0), T("w1", 10, 2.0)], ["w1"], 2.0, id="per-step"),
    # four trainers: the median of the others is not moved by the slow one
    pytest.param(
        [T("a", 10, 1.0), T("b", 10, 1.1), T("c", 10, 0.9), T("d", 10, 3.0)],
        ["d"],
        3.0,
        id="median-of-others",
    ),
    pytest.param(
        [T("a", 10, 1.0), T("b", 10, 1.0), T("c", 10, 3.0), T("d", 10, 2.0)],
        ["c", "d"],
        3.0,
        id="two-slow-slowest-first",
    ),
    pytest.param([T("w0", 10, 0.0), T("w1", 10, 1.0)], [], None, id="others-took-no-time"),
    # 1.5x, but only 0.05 s behind in all: scheduling jitter, not a straggler
    pytest.param([T("w0", 10, 0.10), T("w1", 10, 0.15)], [], None, id="under-0.2-s-behind"),
    pytest.param([T("w0", 10, 0.10), T("w1", 10, 0.35)], ["w1"], 3.5, id="0.25-s-behind"),
]


@pytest.mark.parametrize(("timings", "named", "ratio"), CASES)
def test_stragglers_are_the_trainers_over_1_5x_the_others_median(
    timings: list[TrainerTiming], named: list[str], ratio: float | None
) -> None:
    found = stragglers(timings)
    assert [s.worker for s in found] == named
    if ratio is not None:
        assert found[0].ratio == pytest.approx(ratio, rel=1e-6)


def test_a_straggler_carries_its_figures_and_its_phrase() -> None:
    (slow,) = stragglers([T("worker-0", 10, 4.0, 2.0), T("worker-1", 10, 4.2, 0.0)])
    assert slow.worker == "worker-1"
    assert (slow.step_seconds, slow.others_step_seconds) == pytest.approx((0.42, 0.2))
    assert slow.ratio == pytest.approx(2.1) and slow.waiting_step_seconds == 0.0
    text = describe(slow)
    assert text.startswith("worker-1 is 2.1x slower than the others (0.420 s/step"), text
    assert "vs 0.200" in text and "waited 0.000 s/step in the averaging" in text


def test_timings_come_from_iteration_messages_grouped_by_iteration() -> None:
    messages = [
        {"worker": "w1", "iteration": 2, "fit_seconds": 3.0, "averaging_seconds": 0.1, "steps": 6},
        {"worker": "w0", "iteration": 1, "fit_seconds": 2.0, "steps": 6},
        {"worker": "w0", "iteration": 2, "fit_seconds": 3.0, "averaging_seconds": 1.5, "steps": 6},
    ]
    assert by_iteration(messages) == [
        [T("w0", 6, 2.0, 0.0)],
        [T("w1", 6, 3.0, 0.1), T("w0", 6, 3.0, 1.5)],
    ]
    # a trainer older than the `steps` field counts one step per iteration
    assert timings_of([{"worker": "w", "fit_seconds": 1.0}]) == [T("w", 1, 1.0, 0.0)]


def test_hop_records_sum_each_workers_hops_per_iteration() -> None:
    # fit_multiple: two models, two workers; worker-1 takes twice as long for the same steps
    records = [
        {"iteration": it, "worker": w, "mst_key": k, "train_s": secs, "steps": 5}
        for it in (1, 2)
        for k in (1, 2)
        for w, secs in (("worker-0", 0.5), ("worker-1", 1.0))
    ] + [{"iteration": 3, "worker": "worker-0", "train_s": 0.2}]  # an old record: no steps
    per_iteration = hop_timings(records)
    assert per_iteration[0] == [T("worker-0", 10, 1.0), T("worker-1", 10, 2.0)]
    assert per_iteration[2] == [T("worker-0", 1, 0.2)]
    (slow,) = stragglers(cumulative(per_iteration[:2]))
    assert slow.worker == "worker-1" and slow.ratio == pytest.approx(2.0)
    text = describe(slow, averaging=False)
    assert text.startswith("worker-1 is 2.0x slower") and "averaging" not in text
    assert run_summary(per_iteration[:2])["straggler_iterations"] == 2


def test_run_summary_names_the_slow_trainer_of_the_run() -> None:
    iterations = [
        [T("w0", 10, 4.0, 2.0), T("w1", 10, 4.0, 0.0)],  # w1 named (2x)
        [T("w0", 10, 2.0, 0.0), T("w1", 10, 2.1, 0.0)],  # so far 6.1 s against 4: named
        [T("w0", 10, 4.0, 1.9), T("w1", 10, 4.1, 0.0)],  # named
    ]
    fields = run_summary(iterations)
    assert fields["straggler_worker"] == "w1"
    assert fields["straggler_iterations"] == 3
    # means over the run: w0 (2 + 2 + 2.1) / 30, w1 (4 + 2.1 + 4.1) / 30
    assert fields["straggler_ratio"] == pytest.approx(10.2 / 6.1, abs=1e-3)
    assert fields["trainer_step_seconds"] == pytest.approx(
        {"w0": 6.1 / 30, "w1": 10.2 / 30}, abs=1e-6
    )


def test_one_slow_iteration_among_even_ones_names_no_one_for_the_run() -> None:
    even = [T("w0", 10, 2.0, 0.0), T("w1", 10, 2.0, 0.0)]
    fields = run_summary([even, even, [T("w0", 10, 2.0, 0.0), T("w1", 10, 3.0, 0.0)]])
    assert fields["straggler_worker"] is None and fields["straggler_iterations"] is None
    # the run so far is judged: named after iteration 1 alone, not once even ones follow
    assert cumulative([[T("w0", 10, 2.0, 0.5)], [T("w0", 5, 1.0, 0.0)]]) == [T("w0", 15, 3.0, 0.5)]
    assert [s.worker for s in stragglers(cumulative([[T("a", 10, 1), T("b", 10, 2)]]))] == ["b"]
    many = [[T("a", 10, 1), T("b", 10, 2)]] + [[T("a", 10, 1), T("b", 10, 1)]] * 9
    assert stragglers(cumulative(many)) == []


def test_run_summary_of_an_even_run_is_null() -> None:
    fields = run_summary([[T("w0", 10, 2.0, 0.1), T("w1", 10, 2.0, 0.0)]])
    assert fields["straggler_worker"] is None
    assert fields["straggler_ratio"] is None and fields["straggler_iterations"] is None
    assert fields["trainer_step_seconds"] == pytest.approx({"w0": 0.19, "w1": 0.2})
    assert run_summary([])["trainer_step_seconds"] == {}


def test_a_step_trainers_wait_in_the_all_reduce_is_left_out_of_its_step_time() -> None:
    # sync="step": both fits took 10 s (lock-step); w0 waited 6 s of them in the all-reduce
    # for w1, which waited 2 s (the transfer and its own input)
    messages = [
        {"worker": "w0", "sync": "step", "fit_seconds": 10.0, "steps": 100,
         "averaging_seconds": 6.0, "batch": 16},
        {"worker": "w1", "sync": "step", "fit_seconds": 10.0, "steps": 100,
         "averaging_seconds": 2.0, "batch": 16},
    ]  # fmt: skip
    timings = timings_of(messages)
    assert [t.step_seconds for t in timings] == pytest.approx([0.04, 0.08])
    (slow,) = stragglers(timings)
    assert slow.worker == "w1" and slow.ratio == pytest.approx(2.0)
    text = describe(slow, step=True)
    assert "0.080 s/step of input+compute vs 0.040" in text, text
    assert "waited 0.020 s/step in the all-reduce" in text, text
    # without the wait the lock-step hides it: equal step times, no one named
    assert stragglers(timings_of([{k: v for k, v in m.items() if k != "averaging_seconds"}
                                  for m in messages])) == []  # fmt: skip


def test_step_trainers_of_unequal_batches_are_compared_per_row() -> None:
    # after a move for speed: w1 runs batches of 8 rows, w0 of 24, the same 100 steps; w0's
    # own time per step is larger (3x the rows) but per row w1 is still 1.5x slower
    messages = [
        {"worker": "w0", "fit_seconds": 10.0, "steps": 100, "averaging_seconds": 4.0, "batch": 24},
        {"worker": "w1", "fit_seconds": 10.0, "steps": 100, "averaging_seconds": 7.0, "batch": 8},
    ]
    timings = timings_of(messages)
    assert [t.steps for t in timings] == [150, 50]  # steps of the mean batch (16)
    assert [t.step_seconds for t in timings] == pytest.approx([0.04, 0.06])
    assert [s.worker for s in stragglers(timings, threshold=1.4, min_excess=0.0)] == ["w1"]
    # compared per step, the faster trainer with the larger share would look 2x slower
    plain = timings_of([{k: v for k, v in m.items() if k != "batch"} for m in messages])
    assert [s.worker for s in stragglers(plain)] == ["w0"]


def test_a_step_fit_is_timed_over_its_steps_in_lock_step_only() -> None:
    # CI: the first call of the train function (25 steps: tracing, the collectives' set-up)
    # took 9 s on both trainers, and after the last step w0 stayed 9 s longer in ``fit`` on
    # its own; over the 75 steps in lock-step between them w1 took twice w0's own time
    messages = [
        {"worker": "w0", "fit_seconds": 21.0, "steps": 100, "averaging_seconds": 2.5,
         "batch": 16, "steady": {"seconds": 3.0, "averaging_seconds": 1.5, "steps": 75}},
        {"worker": "w1", "fit_seconds": 12.0, "steps": 100, "averaging_seconds": 0.5,
         "batch": 16, "steady": {"seconds": 3.0, "averaging_seconds": 0.0, "steps": 75}},
    ]  # fmt: skip
    timings = timings_of(messages)
    assert [t.steps for t in timings] == [75, 75]
    assert [t.step_seconds for t in timings] == pytest.approx([1.5 / 75, 3.0 / 75])
    assert [s.worker for s in stragglers(timings)] == ["w1"]
    # over the whole fit the undisturbed w0 would be named
    whole = timings_of([{k: v for k, v in m.items() if k != "steady"} for m in messages])
    assert [s.worker for s in stragglers(whole)] == ["w0"]
    # a fit of one call (no stretch) is timed whole
    (only,) = timings_of([{**messages[0], "steady": None}])
    assert only.steps == 100
