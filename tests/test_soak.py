"""The soak of issue #16 (``python -m benchmarks.soak``), one cycle, and its leak accounting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import soak


def test_leaks_counts_only_what_appeared() -> None:
    before = soak.Footprint({1: "a"}, frozenset({"/tmp/x"}), 100, frozenset({"s"}), 0)
    same = soak.Footprint({1: "a"}, frozenset({"/tmp/x"}), 90, frozenset({"s"}), 5)
    assert not any(soak.leaks(before, same).values())
    more = soak.Footprint({1: "a", 2: "b"}, frozenset({"/tmp/x", "/tmp/y"}), 150,
                          frozenset({"s", "t"}), 0)  # fmt: skip
    assert soak.leaks(before, more) == {
        "processes": {2: "b"}, "files": ["/tmp/y"], "shm_bytes": 50, "shm_entries": ["t"],
    }  # fmt: skip


@pytest.mark.cluster
@pytest.mark.tf
@pytest.mark.slow
def test_one_soak_cycle_leaks_nothing() -> None:
    """Start, pack, fit, kill a worker, recover, stop: nothing is left behind."""
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--cycles", "1"],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith(("cycle", "soak"))]
    assert run.returncode == 0, "\n".join(lines) + run.stderr[-3000:]
    assert lines[-1] == "soak: no leak"
    assert "killed and restarted, fit ok" in lines[0]
