"""The row map's pure planners (dvml.placement.row_map): rows follow measured speed, whole
buffers only, only when it pays, never back and forth; joins take the rebalance's rule."""

from __future__ import annotations

import pytest

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.placement.move_plan import plan_rebalance
from dvml.placement.row_map import plan_join, plan_speed
from dvml.resolve.batches import batch_sizes_by_rows, steps_per_epoch


def _buffers(per_worker: dict[str, int], rows: int = 100, nbytes: int = 1000) -> list[dict]:
    out, index = [], 0
    for worker, n in per_worker.items():
        for _ in range(n):
            out.append({"index": index, "worker": worker, "rows": rows, "nbytes": nbytes})
            index += 1
    return out


def test_a_trainer_at_half_speed_gets_about_a_third_of_the_rows() -> None:
    plan = plan_speed(_buffers({"a": 6, "b": 6}), {"a": 1.0, "b": 2.0}, iterations_left=8,
                      restart_seconds=10.0)  # fmt: skip
    # ideal: a holds 2/3 (800 rows), b 1/3 (400 rows): its work is then 800 like a's
    assert plan.rows_per_worker == {"a": 800, "b": 400}
    assert all(m.source == "b" and m.target == "a" for m in plan.moves)
    assert plan.moved_rows == 200 and plan.bytes_moved == 2000
    assert plan.seconds_before == 1200.0 and plan.seconds_after == 800.0
    assert plan.saved_seconds == 400.0 * 8
    assert plan.reason.startswith("moves 200 rows")
    # rows are moved, never lost or doubled: every row once per epoch
    assert sum(plan.rows_per_worker.values()) == 1200


def test_even_trainers_move_nothing_and_a_small_gain_does_not_pay() -> None:
    even = plan_speed(_buffers({"a": 4, "b": 4}), {"a": 1.0, "b": 1.05}, iterations_left=50,
                      restart_seconds=0.0)  # fmt: skip
    assert even.moves == () and even.rows_per_worker == {"a": 400, "b": 400}
    # 6 vs 5 buffers at 1.1x: one buffer shortens the iteration by under 10 %
    small = plan_speed(_buffers({"a": 5, "b": 6}), {"a": 1.0, "b": 1.1}, iterations_left=50,
                       restart_seconds=0.0)  # fmt: skip
    assert small.moves == () and "under 10%" in small.reason


def test_the_restart_cost_must_be_paid_by_the_iterations_left() -> None:
    buffers, speeds = _buffers({"a": 6, "b": 6}), {"a": 1.0, "b": 2.0}
    assert plan_speed(buffers, speeds, iterations_left=1, restart_seconds=500.0).moves == ()
    assert plan_speed(buffers, speeds, iterations_left=2, restart_seconds=500.0).moves != ()
    last = plan_speed(buffers, speeds, iterations_left=0, restart_seconds=0.0)
    assert last.moves == () and "do not pay" in last.reason


def test_hysteresis_rows_never_move_back() -> None:
    # b gave rows for speed earlier and is now the fast one: it receives none back
    buffers = _buffers({"a": 8, "b": 4})
    back = plan_speed(buffers, {"a": 2.0, "b": 1.0}, iterations_left=9, restart_seconds=0.0,
                      gave={"b"}, took={"a"})  # fmt: skip
    assert back.moves == ()
    # without the history the same figures would move rows from a to b
    assert plan_speed(buffers, {"a": 2.0, "b": 1.0}, iterations_left=9,
                      restart_seconds=0.0).moves != ()  # fmt: skip


def test_only_whole_buffers_of_the_slowest_move_and_three_trainers() -> None:
    buffers = _buffers({"a": 4, "b": 4, "c": 4})
    plan = plan_speed(buffers, {"a": 1.0, "b": 1.0, "c": 3.0}, iterations_left=5,
                      restart_seconds=0.0)  # fmt: skip
    assert {m.source for m in plan.moves} == {"c"}
    assert {m.target for m in plan.moves} <= {"a", "b"}
    assert plan.rows_per_worker["c"] < 400 and sum(plan.rows_per_worker.values()) == 1200
    moved = {m.buffer for m in plan.moves}
    assert moved <= {b["index"] for b in buffers if b["worker"] == "c"}


def test_a_trainer_far_slower_than_the_others_keeps_its_last_buffer() -> None:
    # 15x slower (a host throttled to a fraction of a core, seen on namespace hosts): moving
    # its last buffer still shortens the iteration, but a trainer without rows cannot train
    plan = plan_speed(_buffers({"a": 6, "b": 6}), {"a": 1.0, "b": 15.0}, iterations_left=8,
                      restart_seconds=0.0)  # fmt: skip
    assert plan.rows_per_worker == {"a": 1100, "b": 100}
    assert plan.moved_rows == 500 and all(m.source == "b" for m in plan.moves)
    one = plan_speed(_buffers({"a": 1, "b": 1}), {"a": 1.0, "b": 15.0}, iterations_left=8,
                     restart_seconds=0.0)  # fmt: skip
    assert one.moves == () and one.rows_per_worker == {"a": 100, "b": 100}


def test_bad_figures_are_refused() -> None:
    with pytest.raises(ArgumentError, match="at least two trainers"):
        plan_speed(_buffers({"a": 2}), {"a": 1.0}, iterations_left=1, restart_seconds=0.0)
    with pytest.raises(ArgumentTypeError, match="seconds_per_row"):
        plan_speed(_buffers({"a": 2}), {"a": 1.0, "b": "fast"}, iterations_left=1,
                   restart_seconds=0.0)  # fmt: skip


def test_a_join_places_as_a_rebalance_does() -> None:
    buffers = _buffers({"a": 6, "b": 6})
    join = plan_join(buffers, ["a", "b", "c"], "all_workers")
    assert join == plan_rebalance(buffers, ["a", "b", "c"], "all_workers")
    assert join.rows_per_worker == {"a": 400, "b": 400, "c": 400}
    assert join.bytes_moved <= join.share_bytes
    # a gpu_workers dataset grows only onto the targets its rules resolve to
    assert plan_join(buffers, ["a", "b"], "gpu_workers").moves == ()
    assert plan_join(buffers, ["a", "b", "c"], "workers").moves == ()


def test_the_global_batch_split_by_rows_trains_every_row_once_per_epoch() -> None:
    assert batch_sizes_by_rows(32, [800, 800]) == [16, 16]
    sizes = batch_sizes_by_rows(32, [800, 400])
    assert sum(sizes) == 32 and sizes[0] > sizes[1]
    steps = steps_per_epoch([800, 400], sizes)
    # 2:1 is not a ratio of whole batches (21:11): the rows left out per epoch (a different
    # few each epoch, as every epoch reshuffles) stay within the rounding of the batch
    assert sizes == [21, 11] and steps == 36
    left_out = sum(r - steps * b for r, b in zip([800, 400], sizes, strict=True))
    assert left_out == 48 and left_out <= 0.05 * 1200
    assert batch_sizes_by_rows(3, [5, 1, 1]) == [1, 1, 1]
    # the split runs the most full steps any split can: 52 and 12 train all 1,600 rows in 25
    # steps (largest remainders gave 51 and 13: 23 steps, 128 rows left out per epoch)
    for rows in ([1300, 300], [1400, 200], [1100, 500]):
        sizes = batch_sizes_by_rows(64, rows)
        assert sum(sizes) == 64 and steps_per_epoch(rows, sizes) == 25, (rows, sizes)


def test_seconds_per_row_is_each_trainers_own_work_per_row_it_holds() -> None:
    from dvml.train.row_map_change import seconds_per_row
    from dvml.train.stragglers import TrainerTiming

    # 2 iterations; w0 waited 4 s of its 10 (in the averaging or the all-reduce) for w1
    plain = [TrainerTiming("w0", 100, 10.0, 4.0), TrainerTiming("w1", 100, 10.0, 0.0)]
    assert seconds_per_row(plain, {"w0": 800, "w1": 800}, 2) == pytest.approx(
        {"w0": 6.0 / 1600, "w1": 10.0 / 1600}
    )
    # sync="step" after a move: w1 holds 400 rows (smaller steps), w0 1200; a trainer that
    # holds no rows of the dataset is left out
    moved = [*plain, TrainerTiming("w2", 100, 10.0, 9.0)]
    assert seconds_per_row(moved, {"w0": 1200, "w1": 400}, 2) == pytest.approx(
        {"w0": 6.0 / 2400, "w1": 10.0 / 800}
    )
