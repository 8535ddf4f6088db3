"""The benchmark harness: pure functions, and one quick real run of its cluster benchmarks.

The quick rows of B8, B2, B5, B12, B24, B17 and B22 come from ONE ``python -m benchmarks
--quick`` process (:func:`quick`): each benchmark still prepares its own cluster, but the
interpreter, its imports and the harness start once (a few seconds each time otherwise).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder run as `python -m benchmarks`
    sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402


def _bench(target_op: str = "<=") -> harness.Benchmark:
    return harness.Benchmark(
        key="BX", title="test", unit="s", dvml=lambda c: 2.0, baseline=lambda c: 1.0,
        target=1.5, target_op=target_op,
    )  # fmt: skip


def test_schedule_alternates_which_side_goes_first() -> None:
    assert harness.schedule(3) == [("dvml", "baseline"), ("baseline", "dvml"), ("dvml", "baseline")]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="repeats must be a positive int"):
            harness.schedule(bad)  # type: ignore[arg-type]


def test_summarize_ratios_and_verdict() -> None:
    m = harness.Measurement(dvml=[2.0, 3.0, 1.0], baseline=[1.0, 1.0, 1.0])
    row = harness.summarize(_bench(), m)
    assert row["dvml"] == 2.0 and row["baseline"] == 1.0
    assert row["ratios"] == [2.0, 3.0, 1.0]
    assert (row["ratio_median"], row["ratio_min"], row["ratio_max"]) == (2.0, 1.0, 3.0)
    assert row["met"] is False and row["target"] == "ratio <= 1.5"
    assert harness.summarize(_bench(">="), m)["met"] is True
    # "within": a plan against what was used, off by at most the target either way
    within = harness.summarize(_bench("within"), m)
    assert within["met"] is False and within["target"] == "0.667 <= ratio <= 1.5"
    close = harness.Measurement(dvml=[0.7, 1.4], baseline=[1.0, 1.0])
    assert harness.summarize(_bench("within"), close)["met"] is True
    low = harness.Measurement(dvml=[0.6], baseline=[1.0])
    assert harness.summarize(_bench("within"), low)["met"] is False

    failed = harness.summarize(_bench(), harness.Measurement(error="RuntimeError: boom"))
    assert failed["met"] is False and failed["ratio_median"] is None
    table = harness.render_table([row, failed])
    assert "| BX: test | 2 s | 1 s | 2.00 (1.00-3.00) | ratio <= 1.5 | no |" in table
    assert table.splitlines()[-1].endswith("| error |")


def test_run_benchmark_alternates_and_records_errors() -> None:
    calls: list[str] = []

    def side(name: str, fail: bool = False):
        def run(context: object) -> float:
            calls.append(name)
            if fail:
                raise RuntimeError("boom")
            return 1.0

        return run

    ok = harness.Benchmark("BY", "t", "s", side("dvml"), side("baseline"), target=1.0)
    m = harness.run_benchmark(ok, repeats=2, quick=True, log=lambda s: None)
    assert calls == ["dvml", "baseline", "baseline", "dvml"]
    assert m.dvml == [1.0, 1.0] and m.error is None

    bad = harness.Benchmark("BZ", "t", "s", side("dvml", fail=True), side("baseline"), 1.0)
    assert harness.run_benchmark(bad, 1, True, log=lambda s: None).error == "RuntimeError: boom"


def test_select() -> None:
    registry = harness.load()
    assert [b.key for b in harness.select(registry, ["b8"])] == ["B8"]
    with pytest.raises(ValueError, match="Unknown benchmark"):
        harness.select(registry, ["B99"])
    with pytest.raises(ValueError, match="target_op"):
        _bench("<")


QUICK = "B8,B2,B5,B12a,B12g,B24,B17a,B17b,B22b,B22c"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``python -m benchmarks --quick --only QUICK --repeats 1``, run once for the module: its
    exit status, stdout, results.md and rows (by key). A row's test checks its own row."""
    out = tmp_path_factory.mktemp("quick") / "results"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", QUICK, "--repeats", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {r["benchmark"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    return {"stdout": result.stdout, "table": (out / "results.md").read_text(), "rows": rows}


def _quick_rows(quick: dict[str, Any], *keys: str) -> dict[str, dict[str, Any]]:
    """The quick run's rows of ``keys``, each checked to have run without error and to have a
    positive figure on both sides."""
    rows = {k: quick["rows"][k] for k in keys if k in quick["rows"]}
    assert set(rows) == set(keys), (sorted(quick["rows"]), keys)
    for key, row in rows.items():
        assert row["error"] is None, (key, row["error"])
        assert row["dvml"] > 0 and row["baseline"] > 0
    return rows


@pytest.mark.cluster
def test_quick_b8_run_writes_results(quick: dict[str, Any]) -> None:
    row = _quick_rows(quick, "B8")["B8"]
    for key in ("dvml", "baseline", "ratio_median"):
        assert isinstance(row[key], float) and row[key] > 0
    assert len(row["dvml_figures"]) == len(row["baseline_figures"]) == 1
    assert "| B8: " in quick["table"]
    assert "| B8: " in quick["stdout"]


@pytest.mark.cluster
def test_quick_pack_benchmarks_report_first_runs(quick: dict[str, Any]) -> None:
    """B2 and B5 (both sources) run end to end and report their untimed first runs."""
    rows = _quick_rows(quick, "B2", "B5a", "B5b")
    for row in rows.values():
        firsts = [v for k, v in row["details"].items() if k.startswith("first")]
        assert len(firsts) == 2 and all(v > 0 for v in firsts), row["details"]


@pytest.mark.cluster
def test_quick_b12_runs_partition_and_buffer_rows(quick: dict[str, Any]) -> None:
    """B12 (issue 17) runs a partition row and a buffer row on one cluster, end to end."""
    rows = _quick_rows(quick, "B12a", "B12g")
    assert rows["B12a"]["details"]["partitions"] == 4
    assert rows["B12g"]["details"]["buffers"] == 4  # quick: 2, 4, 8, 16 buffers


@pytest.mark.cluster
@pytest.mark.tf
def test_quick_b24_appends_and_extends_the_feature_cache(quick: dict[str, Any]) -> None:
    """B24 (issue 39): an append against a repack, the extended feature cache against a full
    one, the retrain workflow after an append against one from scratch; the append adds to
    the vineyardds exactly the new rows' packed bytes."""
    rows = _quick_rows(quick, "B24a", "B24b", "B24c")
    written = rows["B24a"]["details"]["added / new rows' bytes (target <= 1.1)"]
    assert written is not None and 0.99 <= written <= 1.1
    extension = rows["B24b"]["details"]["extension"]
    assert extension["from_version"] == 1 and extension["buffers_computed"] >= 1
    retrain = rows["B24c"]["details"]  # both workflow runs trained and evaluated a model
    accuracies = [v for k, v in retrain.items() if k.startswith("final validation accuracy")]
    assert len(accuracies) == 2 and all(0.0 < a <= 1.0 for a in accuracies), retrain


def test_a_missing_optional_peer_skips_rows_and_the_others_still_run() -> None:
    # Issue 42 item 9: a peer that is not installed is a skipped row (with the command that
    # installs it), never an error; rows that do not need it still run.
    def missing(context: object) -> float:
        raise harness.Skipped("The peer is not installed. Run ./scripts/peer-x.")

    def no_peer(quick: bool) -> object:
        raise harness.Skipped("Run ./scripts/peer-y.")

    fine = harness.Benchmark("BA", "t", "s", lambda c: 2.0, lambda c: 1.0, target=3.0)
    row_skip = harness.Benchmark("BB", "t", "s", lambda c: 2.0, missing, target=1.0)
    group_skip = harness.Benchmark("BC", "t", "s", lambda c: 1.0, lambda c: 1.0, 1.0,
                                   prepare=no_peer)  # fmt: skip
    benches = [fine, row_skip, group_skip]
    measurements = harness.run_all(benches, repeats=2, quick=True, log=lambda s: None)
    rows = [harness.summarize(b, m) for b, m in zip(benches, measurements, strict=True)]
    assert [r["error"] for r in rows] == [None, None, None]
    missing_peer = "The peer is not installed. Run ./scripts/peer-x."
    assert [r["skipped"] for r in rows] == [None, missing_peer, "Run ./scripts/peer-y."]
    assert rows[0]["met"] is True and rows[0]["dvml_figures"] == [2.0, 2.0]
    assert rows[1]["dvml_figures"] == [] and rows[1]["ratio_median"] is None  # no half row
    table = harness.render_table(rows)
    assert "| BB: t | - | - | - | ratio <= 1 | skipped |" in table
    assert "BC skipped: Run ./scripts/peer-y." in table.splitlines()


@pytest.mark.cluster
def test_quick_b17_is_met_by_default(quick: dict[str, Any]) -> None:
    """B17 (issue 38 item 4): packed with no compact= argument, uint8 images take at most 1.05x
    their raw bytes a row; the float32 layout (compact=False), reported beside, about 4x."""
    rows = _quick_rows(quick, "B17a", "B17b")
    for row in rows.values():
        assert row["met"], row
        assert row["details"]["default storage"]["compact"] is True
        assert row["details"]["float32 format ratio"] > 3.9
    assert rows["B17a"]["dvml"] == 8 * 8 + 1  # uint8 pixels and a uint8 class index


@pytest.mark.cluster
@pytest.mark.tf
def test_quick_b22_loses_a_worker_and_trains_every_row_per_epoch(quick: dict[str, Any]) -> None:
    """B22 (issue 37): an elastic fit that loses a worker midway against the same fit
    undisturbed; the rows it trained per epoch after the loss are the dataset's, exactly."""
    rows = _quick_rows(quick, "B22b", "B22c")
    assert rows["B22c"]["ratio_median"] == 1.0, rows["B22c"]
    last = rows["B22b"]["details"]["disturbed: last run"]
    assert last["departed_at_iterations"]["worker-2"] >= 3 and last["rows_left_out"] == 0
    assert last["repinned_rows"] > 0, last


def test_b22a_is_registered_with_the_issues_target_and_its_own_clusters() -> None:
    # B22a (issue 37): a worker added during the fit. Its quick run (about 60 s: a cluster per
    # side and run, a worker started mid-fit) is left to `python -m benchmarks --quick`.
    (b22a,) = harness.select(harness.load(), ["B22a"])
    assert (b22a.target, b22a.target_op) == (1.2, "<=")
    b22b = harness.select(harness.load(), ["B22b"])[0]
    assert b22a.prepare is not b22b.prepare  # B22a starts 2- and 3-worker clusters per run


def test_b21_rows_are_registered_with_the_issues_targets() -> None:
    # B21 (issue 37): its quick run (about 100 s) is left to `python -m benchmarks --quick`
    chosen = harness.select(harness.load(), ["B21"])
    assert [(b.key, b.target, b.target_op) for b in chosen] == [
        ("B21a", 1.45, "<="), ("B21b", 1.6, "<="), ("B21c", 1.45, "<="), ("B21d", 1.0, "<="),
    ]  # fmt: skip
    assert len({b.prepare for b in chosen}) == 1  # one cluster for the four rows
