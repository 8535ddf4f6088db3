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
@pytest.mark.serial  # counts every new entry under /tmp and /dev/shm
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


def test_footprint_counts_every_new_entry_under_tmp_and_dev_shm(tmp_path, monkeypatch) -> None:
    """Not only ``dvml-cluster-*`` and ``vineyard.*``: TensorFlow's autograph files, nested
    files, a semaphore in /dev/shm (issue 28: the soak did not see 340 autograph files)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(soak.tempfile, "tempdir", None)  # re-read TMPDIR
    scratch = tmp_path / "dvml-soak-scratch"
    scratch.mkdir()
    before = soak.footprint([str(scratch)])
    (tmp_path / "__autograph_generated_fileab12.py").write_text("x = 1\n")
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "nested.txt").write_text("left behind")
    (scratch / "registry.db-wal").write_text("the soak's own")
    shm = f"/dev/shm/dvml-soak-test-{os.getpid()}"
    with open(shm, "w") as f:
        f.write("x")
    try:
        found = soak.leaks(before, soak.footprint([str(scratch)]))
    finally:
        os.remove(shm)
    assert found["files"] == sorted(
        str(p)
        for p in (
            tmp_path / "__autograph_generated_fileab12.py",
            tmp_path / "older",
            tmp_path / "older" / "nested.txt",
        )
    )
    assert found["shm_entries"] == [shm]
