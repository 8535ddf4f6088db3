"""The pure move plan of a rebalance (dvml.placement.move_plan): no cluster."""

from __future__ import annotations

import pytest

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.placement.move_plan import plan_rebalance


def _buffers(per_worker: dict[str, list[int]], row_bytes: int = 8) -> list[dict]:
    out, index = [], 0
    for worker, rows in per_worker.items():
        for r in rows:
            out.append({"index": index, "worker": worker, "rows": r, "nbytes": r * row_bytes})
            index += 1
    return out


def _check_invariants(buffers, plan):
    moved = {m.buffer for m in plan.moves}
    assert len(moved) == len(plan.moves)  # a buffer moves once at most
    by_index = {b["index"]: b for b in buffers}
    for m in plan.moves:
        assert by_index[m.buffer]["worker"] == m.source
        assert m.target in plan.new_workers
    assert sum(plan.rows_per_worker.values()) == sum(b["rows"] for b in buffers)
    assert plan.bytes_moved <= plan.share_bytes


def test_equal_buffers_two_workers_plus_one():
    buffers = _buffers({"a": [10] * 4, "b": [10] * 4})
    plan = plan_rebalance(buffers, ["a", "b", "c"], "all_workers")
    _check_invariants(buffers, plan)
    assert plan.new_workers == ("c",)
    rows = plan.rows_per_worker
    assert max(rows.values()) - min(rows.values()) <= 10  # within one buffer
    assert rows["c"] == 20  # 80 rows / 3 = 26.7: two buffers fit, a third would pass the share
    assert {m.source for m in plan.moves} == {"a", "b"}  # taken from both most-loaded workers


def test_uneven_sources_give_from_the_most_loaded_first():
    buffers = _buffers({"a": [10] * 6, "b": [10] * 2})
    plan = plan_rebalance(buffers, ["a", "b", "c"], "all_workers")
    _check_invariants(buffers, plan)
    assert all(m.source == "a" for m in plan.moves)
    assert plan.rows_per_worker == {"a": 40, "b": 20, "c": 20}


def test_two_new_workers_each_get_their_share():
    buffers = _buffers({"a": [5] * 8, "b": [5] * 8})
    plan = plan_rebalance(buffers, ["a", "b", "c", "d"], "all_workers")
    _check_invariants(buffers, plan)
    assert plan.rows_per_worker == {"a": 20, "b": 20, "c": 20, "d": 20}
    assert plan.bytes_moved == plan.share_bytes == 40 * 8


def test_gpu_rule_targets_only_the_resolved_workers():
    # The caller resolved gpu_workers to a, b and the GPU worker g; the CPU worker c joined
    # too but is not a target.
    buffers = _buffers({"a": [10] * 3, "b": [10] * 3})
    plan = plan_rebalance(buffers, ["a", "b", "g"], "gpu_workers")
    _check_invariants(buffers, plan)
    assert "c" not in plan.rows_per_worker
    assert plan.rows_per_worker["g"] == 20


@pytest.mark.parametrize("kind", ["workers", "hosts", "table"])
def test_explicit_rules_do_not_move(kind):
    buffers = _buffers({"a": [10] * 4})
    plan = plan_rebalance(buffers, ["a", "c"], kind)
    assert plan.moves == () and plan.bytes_moved == 0
    assert plan.rows_per_worker == {"a": 40}


def test_no_new_worker_no_move():
    buffers = _buffers({"a": [10] * 5, "b": [10] * 1})
    plan = plan_rebalance(buffers, ["a", "b"], "all_workers")
    assert plan.moves == ()  # an uneven old placement is not the rebalance's business


def test_one_big_buffer_does_not_overshoot_the_share():
    buffers = _buffers({"a": [40], "b": [40]})
    plan = plan_rebalance(buffers, ["a", "b", "c"], "all_workers")
    assert plan.moves == ()  # moving 40 rows would give c more than its 26.7
    assert plan.rows_per_worker["c"] == 0


def test_mixed_sizes_pick_the_largest_fitting_buffer():
    buffers = _buffers({"a": [30, 5, 5], "b": [20, 20]})
    plan = plan_rebalance(buffers, ["a", "b", "c"], "all_workers")
    _check_invariants(buffers, plan)
    rows = plan.rows_per_worker
    assert max(rows.values()) - min(rows.values()) <= 30
    assert rows["c"] <= sum(rows.values()) / 3


def test_bad_input():
    with pytest.raises(ArgumentTypeError, match="Received"):
        plan_rebalance([{"index": 0}], ["a"], "all_workers")
    with pytest.raises(ArgumentTypeError, match="targets"):
        plan_rebalance([], "abc", "all_workers")
    with pytest.raises(ArgumentError, match="rows=-1"):
        plan_rebalance([{"index": 0, "worker": "a", "rows": -1}], ["a"], "all_workers")
