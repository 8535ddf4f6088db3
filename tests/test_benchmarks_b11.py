"""B11 (fit_multiple vs dvml.fit per configuration): registration, its pure pieces, a quick run.

The quick run checks that the row has numbers and the details the README reports (moving
seconds, accuracy per configuration), not that the target is met: on a shared 2-core machine
the ratio is only meaningful at full size.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder run as `python -m benchmarks`
    sys.path.insert(0, str(ROOT))

from benchmarks import b11_fit_multiple as b11  # noqa: E402
from benchmarks import harness  # noqa: E402


def test_b11_is_registered_with_its_target() -> None:
    (bench,) = harness.select(harness.load(), ["B11"])
    assert bench.target == 0.67 and bench.target_op == "<="
    assert "fit_multiple" in bench.title


def test_four_configurations_two_learning_rates_by_two_batches() -> None:
    from dvml.configs import check_config_rows

    table = b11.configurations(7)
    checked = check_config_rows(table.to_dict(orient="records"))
    assert [c.mst_key for c in checked] == [1, 2, 3, 4]
    assert set(table["model_id"]) == {7}
    pairs = {(c, f) for c, f in zip(table["compile_params"], table["fit_params"], strict=True)}
    assert len(pairs) == 4
    assert len(set(table["compile_params"])) == 2 and len(set(table["fit_params"])) == 2


def test_details_report_moving_time_and_the_accuracy_gap() -> None:
    context = {
        "moving": [1.5], "moved_bytes": [2 * 1024 * 1024], "wall": {"dvml": [30.0]},
        "accuracy": {"dvml": {1: 0.95, 2: 0.90}, "baseline": {1: 0.94, 2: 0.93}},
    }  # fmt: skip
    found = b11.details(context)
    assert found["model moving s (median, all hops)"] == 1.5
    assert found["moved MiB per run"] == 2.0
    assert found["moving share of fit_multiple wall"] == 0.05
    assert found["max accuracy gap (points)"] == pytest.approx(3.0)
    assert found["val accuracy mst 1 (MOP / fit)"] == "0.950 / 0.940"


@pytest.mark.cluster
@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_quick_b11_writes_its_row(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "B11", "--repeats", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = json.loads((out / "results.json").read_text())["results"]
    assert row["error"] is None, row["error"]
    assert row["dvml"] > 0 and row["baseline"] > 0
    assert row["details"]["model moving s (median, all hops)"] > 0
    assert row["details"]["max accuracy gap (points)"] >= 0
