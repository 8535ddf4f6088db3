"""B19 (own loop vs Ray Train): registration, the shared inputs, the missing-peer message.

The side-by-side run itself needs Ray in its own environment (``./scripts/peer-ray``), which is
not a dvml dependency: it is measured with ``python -m benchmarks --only B19`` and reported in
docs/benchmarks.md, not run here. Its dvml side is ``dvml.run`` of a custom loop, which
tests/train/test_run_cluster.py runs on real clusters.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import b19_own_loop as b19  # noqa: E402
from benchmarks import harness  # noqa: E402


def test_b19_rows_share_one_context_and_have_the_issue_targets() -> None:
    rows = harness.select(harness.load(), ["B19"])
    assert [r.key for r in rows] == ["B19a", "B19b"]
    assert rows[0].prepare is rows[1].prepare
    assert (rows[0].target, rows[0].target_op) == (0.5, "<=")
    assert (rows[1].target, rows[1].target_op) == (1.0, ">=")


def test_without_the_ray_environment_the_error_says_how_to_install_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DVML_RAY_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(RuntimeError, match=r"scripts/peer-ray"):
        b19.ray_python()


def test_both_sides_get_the_same_rows_and_job(tmp_path: pathlib.Path) -> None:
    rows = b19.write_inputs(str(tmp_path), copies=1, epochs=2, mode="loop")
    data = np.load(tmp_path / "data.npz")
    job = json.loads((tmp_path / "job.json").read_text())
    assert data["x"].shape == (rows, 8, 8, 1) and data["y"].shape == (rows,)
    assert data["x"].dtype == np.float32 and data["x"].min() >= 0 and data["x"].max() <= 16
    assert job["batch"] * job["workers"] == b19.BATCH and job["epochs"] == 2
    assert json.loads(job["model_json"])["class_name"] in ("Sequential", "Functional")


def test_throughput_counts_every_epoch_of_the_chief() -> None:
    result = {"rows_per_epoch": 1024, "epoch_s": [1.0, 1.0], "training_s": 4.0}
    assert b19.throughput(result) == 512.0
