"""The pure re-pin plan of an elastic job (dvml.placement.repin_plan): no cluster."""

from __future__ import annotations

import pytest

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.placement.repin_plan import plan_repin


def _buffers(per_worker: dict[str, list[int]], row_bytes: int = 8) -> list[dict]:
    out, index = [], 0
    for worker, rows in per_worker.items():
        for r in rows:
            out.append({"index": index, "worker": worker, "rows": r, "nbytes": r * row_bytes})
            index += 1
    return out


def test_every_departed_buffer_goes_to_a_survivor_and_no_row_is_lost():
    buffers = _buffers({"a": [10] * 3, "b": [10] * 3, "c": [10] * 3})
    plan = plan_repin(buffers, ["b"], ["a", "c"], readable=["b"])
    assert sorted(m.buffer for m in plan.moves) == [3, 4, 5]
    assert all(m.source == "b" and m.target in {"a", "c"} for m in plan.moves)
    assert plan.left_out == () and plan.rows_left_out == 0
    assert sum(plan.rows_per_worker.values()) == 90  # every row, on the survivors
    assert plan.repinned_rows == 30 and plan.bytes_moved == 30 * 8
    # as even as whole buffers allow: 40 and 50
    assert sorted(plan.rows_per_worker.values()) == [40, 50]


def test_largest_first_to_the_least_loaded_survivor():
    buffers = _buffers({"a": [30], "b": [5], "c": [20, 10, 10]})
    plan = plan_repin(buffers, ["c"], ["a", "b"], readable=["c"])
    assert [(m.buffer, m.target) for m in plan.moves] == [(2, "b"), (3, "b"), (4, "a")]
    assert plan.rows_per_worker == {"a": 40, "b": 35}


def test_ties_go_to_the_first_survivor_in_order():
    buffers = _buffers({"a": [10], "b": [10], "c": [10]})
    plan = plan_repin(buffers, ["c"], ["b", "a"], readable=["c"])
    assert [(m.buffer, m.target) for m in plan.moves] == [(2, "b")]


def test_a_departed_worker_whose_store_is_gone_is_left_out_and_counted():
    buffers = _buffers({"a": [10, 10], "b": [10, 7], "c": [10, 4]})
    plan = plan_repin(buffers, ["b", "c"], ["a"], readable=["b"])
    assert sorted(m.buffer for m in plan.moves) == [2, 3]
    assert plan.left_out == (4, 5) and plan.rows_left_out == 14
    assert plan.rows_per_worker == {"a": 37}
    assert plan.repinned_rows + plan.rows_left_out == 31  # the departed rows, all accounted


def test_nothing_departed_moves_nothing():
    buffers = _buffers({"a": [10], "b": [10]})
    plan = plan_repin(buffers, [], ["a", "b"], readable=[])
    assert plan.moves == () and plan.left_out == ()
    assert plan.rows_per_worker == {"a": 10, "b": 10}


def test_refuses_no_survivor_or_a_worker_on_both_sides():
    buffers = _buffers({"a": [10]})
    with pytest.raises(ArgumentError, match="at least one survivor"):
        plan_repin(buffers, ["a"], [], readable=["a"])
    with pytest.raises(ArgumentError, match="Received: departed=\\['a'\\]"):
        plan_repin(buffers, ["a"], ["a"], readable=["a"])
    with pytest.raises(ArgumentTypeError, match="survivors must be"):
        plan_repin(buffers, ["a"], "b", readable=["a"])  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="'index', 'worker', 'rows'"):
        plan_repin([{"worker": "a"}], ["a"], ["b"], readable=["a"])
    with pytest.raises(ArgumentError, match="must be >= 0"):
        plan_repin([{"index": 0, "worker": "a", "rows": -1}], ["a"], ["b"], readable=["a"])
