"""The training-side benchmarks (B1, B3, B4, B7, B10): one real quick run, and their pure pieces.

The run checks that every row has numbers, not that the targets are met: on a shared 2-core
machine the ratios are only meaningful at full sizes and with several repeats.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder run as `python -m benchmarks`
    sys.path.insert(0, str(ROOT))

from benchmarks import _training, harness  # noqa: E402

ROWS = ("B1a", "B1b", "B3a", "B3b", "B3c", "B3d", "B4a", "B4b", "B7")


def test_training_benchmarks_are_registered_and_grouped() -> None:
    registry = harness.load()
    chosen = harness.select(registry, ["B1", "B3", "B4", "B7"])
    assert [b.key for b in chosen] == list(ROWS)
    # The rows of one benchmark share their prepared context (one cluster, one runner).
    assert chosen[0].prepare is chosen[1].prepare
    assert chosen[2].prepare is chosen[3].prepare is chosen[4].prepare is chosen[5].prepare
    assert [b.key for b in harness.select(registry, ["b3b"])] == ["B3b"]
    # B4: one row per sync mode on one cluster; B10: iteration rows first, then step rows
    assert chosen[6].prepare is chosen[7].prepare
    b10 = harness.select(registry, ["B10"])
    assert len(b10) in (4, 6) and len({b.prepare for b in b10}) == 1
    assert [b.target for b in b10[: len(b10) // 2]] == [1.0] * (len(b10) // 2)
    assert all("'iteration'" in b.title for b in b10[: len(b10) // 2])
    assert all("'step'" in b.title for b in b10[len(b10) // 2 :])


def test_run_all_prepares_a_shared_context_once() -> None:
    calls: list[str] = []

    def prepare(quick: bool) -> dict[str, int]:
        calls.append("prepare")
        return {"n": 0}

    def cleanup(context: dict[str, int]) -> None:
        calls.append("cleanup")

    def side(context: dict[str, int]) -> float:
        context["n"] += 1
        return float(context["n"])

    rows = [
        harness.Benchmark(k, "t", "s", side, side, 1.0, prepare=prepare, cleanup=cleanup)
        for k in ("BXa", "BXb")
    ]
    between = harness.Benchmark("BY", "t", "s", lambda c: 1.0, lambda c: 1.0, 1.0)
    # BXc shares the prepare function but is not next to the others: it gets its own context.
    last = harness.Benchmark("BXc", "t", "s", side, side, 1.0, prepare=prepare, cleanup=cleanup)
    measurements = harness.run_all(
        [*rows, between, last], repeats=1, quick=True, log=lambda s: None
    )
    assert calls == ["prepare", "cleanup", "prepare", "cleanup"]
    figures = [m.dvml + m.baseline for m in measurements]
    assert figures == [[1.0, 2.0], [3.0, 4.0], [1.0, 1.0], [1.0, 2.0]]


def test_a_failing_cleanup_is_reported_and_the_run_goes_on() -> None:
    def cleanup(context: object) -> None:
        raise RuntimeError("daemon gone")

    bad = harness.Benchmark(
        "BX", "t", "s", lambda c: 2.0, lambda c: 1.0, 1.0, prepare=lambda q: {}, cleanup=cleanup
    )
    good = harness.Benchmark("BY", "t", "s", lambda c: 1.0, lambda c: 1.0, 1.0)
    first, second = harness.run_all([bad, good], repeats=1, quick=True, log=lambda s: None)
    assert first.error is None and first.dvml == [2.0]
    assert first.details == {"cleanup failed": "RuntimeError: daemon gone"}
    assert second.dvml == [1.0]
    row = harness.summarize(bad, first)
    assert "BX: cleanup failed RuntimeError: daemon gone" in harness.render_table([row])


def test_synthetic_arrays_are_one_kib_rows_and_reproducible() -> None:
    rows = _training.rows_for_bytes(1 << 20)
    a, b = _training.synthetic_arrays(rows), _training.synthetic_arrays(rows)
    assert rows == 1024 and sum(v.nbytes for v in a.values()) == 1 << 20
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert (a["y"].sum(axis=1) == 1).all() and a["x_0"].dtype == np.float32


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``python -m benchmarks --quick --only B1,B3,B4,B7,B10 --repeats 1`` for the module
    (the interpreter and the harness start once): its rows by key and its results.md."""
    out = tmp_path_factory.mktemp("quick") / "results"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "B1,B3,B4,B7,B10",
         "--repeats", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {r["benchmark"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    return {"rows": rows, "table": (out / "results.md").read_text()}


@pytest.mark.cluster
@pytest.mark.tf
def test_quick_training_benchmarks_write_a_row_each(quick: dict[str, Any]) -> None:
    rows = {k: r for k, r in quick["rows"].items() if not k.startswith("B10")}
    assert sorted(rows) == sorted(ROWS)
    for key, row in rows.items():
        assert row["error"] is None, (key, row["error"])
        for field in ("dvml", "baseline", "ratio_median"):
            assert isinstance(row[field], float) and row[field] > 0, (key, field, row[field])
        assert len(row["dvml_figures"]) == len(row["baseline_figures"]) == 1
    for key, sync in (("B4a", "iteration"), ("B4b", "step")):
        assert rows[key]["details"]["sync"] == sync
        assert "trainer start s (median)" in rows[key]["details"]
        assert rows[key]["details"]["fit s, training only (median)"] > 0
    assert all(f"| {key}: " in quick["table"] for key in ROWS)


@pytest.mark.cluster
@pytest.mark.tf
def test_quick_b10_reports_samples_per_second_and_the_collective_cost(
    quick: dict[str, Any],
) -> None:
    rows = {k: r for k, r in quick["rows"].items() if k.startswith("B10")}
    assert len(rows) in (4, 6)
    for key, row in rows.items():
        assert row["error"] is None, (key, row["error"])
        assert row["dvml"] > 0 and row["baseline"] > 0 and row["ratio_median"] > 0
        assert row["details"]["ms per step"] > 0
    assert rows["B10a"]["details"]["trainers"] == 1
    assert rows["B10b"]["details"]["sync"] == "iteration"
    assert rows["B10b"]["details"]["s per weight average"] > 0
    details = [r["details"] for r in rows.values()]
    (step_two,) = [d for d in details if d["sync"] == "step" and d["trainers"] == 2]
    assert "all-reduce ms per step" in step_two
