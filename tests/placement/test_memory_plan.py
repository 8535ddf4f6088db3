"""The memory plan of a pack (pure): bytes per vineyardd against its room, and the fixes."""

from __future__ import annotations

import pickle

import pytest

from dvml.exceptions import ArgumentError, MemoryPlanError, VineyardMemoryError
from dvml.placement.memory import MemoryPlan, VineyarddRoom, format_size, plan_pack

MiB = 2**20
TWO = {"worker-0": 1, "worker-1": 2}  # one vineyardd per worker (dvml's LocalCluster)


def room(iid: int, limit_mib: float, usage_mib: float) -> VineyarddRoom:
    return VineyarddRoom(iid, int(limit_mib * MiB), int(usage_mib * MiB))


@pytest.mark.parametrize(
    ("needed_mib", "instance_of", "rooms", "fits_per_row"),
    [
        # both fit, one vineyardd each
        ({"worker-0": 10, "worker-1": 10}, TWO, [room(1, 32, 0), room(2, 32, 0)], [True, True]),
        # usage counts: 25 MiB in use leaves 7
        ({"worker-0": 10, "worker-1": 10}, TWO, [room(1, 32, 25), room(2, 32, 0)], [False, True]),
        # exactly full fits
        ({"worker-0": 32}, {"worker-0": 1}, [room(1, 32, 0)], [True]),
        # two workers sharing one vineyardd: their bytes add up
        ({"worker-0": 20, "worker-1": 20}, {"worker-0": 1, "worker-1": 1}, [room(1, 32, 0)],
         [False]),
        ({"worker-0": 10, "worker-1": 10}, {"worker-0": 1, "worker-1": 1}, [room(1, 32, 0)],
         [True]),
        # a daemon fuller than its limit reports no room at all
        ({"worker-0": 1}, {"worker-0": 1}, [room(1, 32, 40)], [False]),
    ],
)  # fmt: skip
def test_rows_per_vineyardd(needed_mib, instance_of, rooms, fits_per_row) -> None:
    needed = {w: int(n * MiB) for w, n in needed_mib.items()}
    plan = plan_pack(needed, instance_of, rooms)
    assert [r.fits for r in plan.rows] == fits_per_row
    assert plan.fits is all(fits_per_row)
    assert plan.needed == sum(needed.values())
    by_id = {r.instance_id: r for r in rooms}
    for row in plan.rows:
        assert row.needed == sum(needed[w] for w in row.workers)
        assert row.free == max(0, by_id[row.instance_id].limit - by_id[row.instance_id].usage)
        assert row.short == max(0, row.needed - row.free)
    assert (plan.fixes == ()) is plan.fits


def test_table_has_a_row_per_vineyardd() -> None:
    plan = plan_pack({"worker-0": 5 * MiB, "worker-1": 40 * MiB}, TWO,
                     [room(1, 32, 1), room(2, 32, 0)])  # fmt: skip
    table = plan.table()
    assert list(table["workers"]) == ["worker-0", "worker-1"]
    assert list(table["needed"]) == [5 * MiB, 40 * MiB]
    assert list(table["free"]) == [31 * MiB, 32 * MiB]
    assert list(table["limit"]) == [32 * MiB, 32 * MiB]
    assert list(table["fits"]) == [True, False]


def test_fix_bigger_vineyard_memory_covers_the_fullest() -> None:
    # worker-0: 12 MiB in use + 48 MiB = 60 MiB; worker-1: 0 + 40 MiB
    plan = plan_pack({"worker-0": 48 * MiB, "worker-1": 40 * MiB}, TWO,
                     [room(1, 32, 12), room(2, 32, 0)])  # fmt: skip
    assert not plan.fits
    assert any("vineyard_memory: at least 60.0 MiB" in f for f in plan.fixes), plan.fixes


def test_fix_more_workers_counts_them() -> None:
    # 80 MiB over 2 workers with 32 MiB free each: 3 workers hold 26.7 MiB each
    plan = plan_pack({"worker-0": 40 * MiB, "worker-1": 40 * MiB}, TWO,
                     [room(1, 32, 0), room(2, 32, 0)])  # fmt: skip
    assert any("at least 3 in all (1 more)" in f for f in plan.fixes), plan.fixes


def test_no_more_workers_fix_when_a_vineyardd_is_full() -> None:
    plan = plan_pack({"worker-0": 1 * MiB}, {"worker-0": 1}, [room(1, 32, 32)])
    assert not any("more target workers" in f for f in plan.fixes)
    assert any("drop datasets these vineyardds hold (32.0 MiB in use" in f for f in plan.fixes)


@pytest.mark.parametrize(
    ("compact_mib", "expected"),
    [(10, "0.25x the bytes of this float32 layout"), (38, "not enough alone")],
)
def test_fix_compact_with_its_ratio(compact_mib: int, expected: str) -> None:
    plan = plan_pack({"worker-0": 40 * MiB}, {"worker-0": 1}, [room(1, 32, 0)],
                     compact_needed={"worker-0": compact_mib * MiB})  # fmt: skip
    assert any("compact=True" in f and expected in f for f in plan.fixes), plan.fixes


def test_no_compact_fix_when_not_offered() -> None:
    plan = plan_pack({"worker-0": 40 * MiB}, {"worker-0": 1}, [room(1, 32, 0)])
    assert not any("compact=True" in f for f in plan.fixes)


@pytest.mark.parametrize(
    ("replaced_mib", "offered"),
    [(20, True), (5, False), (0, False)],
)
def test_fix_drop_the_replaced_dataset_first(replaced_mib: int, offered: bool) -> None:
    # 20 MiB of the 25 in use are the dataset overwrite=True replaces; the new one needs 20.
    plan = plan_pack({"worker-0": 20 * MiB}, {"worker-0": 1}, [room(1, 32, 25)],
                     replaced={1: replaced_mib * MiB})  # fmt: skip
    assert not plan.fits
    found = [f for f in plan.fixes if "drop the dataset being replaced first" in f]
    assert bool(found) is offered, plan.fixes
    if offered:
        assert "frees 20.0 MiB" in found[0]
    assert plan.rows[0].replaced == replaced_mib * MiB


def test_describe_has_numbers_and_fixes() -> None:
    plan = plan_pack({"worker-0": 48 * MiB, "worker-1": 1 * MiB}, TWO,
                     [room(1, 32, 0), room(2, 32, 0)])  # fmt: skip
    text = plan.describe()
    assert "worker-0 (vineyardd 1): needs 48.0 MiB, 32.0 MiB free of 32.0 MiB" in text
    assert "short by 16.0 MiB" in text
    assert "worker-1 (vineyardd 2): needs 1.0 MiB" in text and ": fits" in text
    assert "What would make it fit:" in text
    assert "buffer_size does not help" in text


def test_missing_status_is_refused() -> None:
    with pytest.raises(ArgumentError, match=r"No status for the vineyardds \[2\]"):
        plan_pack({"worker-0": 1, "worker-1": 1}, TWO, [room(1, 32, 0)])


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (48 * MiB, "48.0 MiB"),
     (3 * 2**30 // 2, "1.50 GiB")],
)  # fmt: skip
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


def test_memory_plan_error_is_a_vineyard_memory_error_and_pickles_with_its_plan() -> None:
    plan = plan_pack({"worker-0": 40 * MiB}, {"worker-0": 1}, [room(1, 32, 0)])
    exc = MemoryPlanError("no room", plan)
    assert isinstance(exc, VineyardMemoryError)
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == "no room"
    assert isinstance(again.plan, MemoryPlan) and again.plan == plan
