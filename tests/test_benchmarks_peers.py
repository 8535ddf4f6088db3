"""B19 (own loop vs Ray Train): registration, the shared inputs, the missing-peer message.

The side-by-side run itself needs Ray in its own environment (``./scripts/peer-ray``), which is
not a dvml dependency: it is measured with ``python -m benchmarks --only B19`` and reported in
docs/benchmarks.md, not run here. Its dvml side is ``dvml.run`` of a custom loop, which
tests/train/test_run_cluster.py runs on real clusters.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import tempfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _peers, harness  # noqa: E402
from benchmarks import b19_own_loop as b19  # noqa: E402


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
        _peers.ray_python()


def test_both_sides_get_the_same_rows_and_job(tmp_path: pathlib.Path) -> None:
    rows = _peers.write_inputs(str(tmp_path), copies=1, epochs=2, batch=256, workers=2)
    data = np.load(tmp_path / "data.npz")
    job = json.loads((tmp_path / "job.json").read_text())
    assert data["x"].shape == (rows, 8, 8, 1) and data["y"].shape == (rows,)
    assert data["x"].dtype == np.float32 and data["x"].min() >= 0 and data["x"].max() <= 16
    assert job["batch"] * job["workers"] == 256 and job["epochs"] == 2
    assert json.loads(job["model_json"])["class_name"] in ("Sequential", "Functional")


def test_throughput_counts_every_epoch_of_the_chief() -> None:
    result = {"rows_per_epoch": 1024, "epoch_s": [1.0, 1.0], "training_s": 4.0}
    assert b19.throughput(result) == 512.0


def test_b20_rows_and_their_peers() -> None:
    from benchmarks import b20_short_job as b20

    rows = harness.select(harness.load(), ["B20"])
    assert [r.key for r in rows] == ["B20a", "B20b", "B20c", "B20d", "B20e"]
    assert len({r.prepare for r in rows}) == 1
    assert [r.target for r in rows] == [2.0, 0.5, 1.0, 1.0, 2.0]
    assert {k: peer for k, (peer, _) in b20.FIGURES.items()} == {
        "B20a": "plain", "B20b": "ray", "B20c": "plain", "B20d": "ray", "B20e": "plain",
    }  # fmt: skip


def test_take_gives_every_row_the_same_runs_in_order() -> None:
    made: list[int] = []

    def run() -> dict[str, int]:
        made.append(len(made))
        return {"n": made[-1]}

    context: dict[str, object] = {}
    first = [_peers.take(context, "Xa", "dvml", run)["n"] for _ in range(3)]
    second = [_peers.take(context, "Xb", "dvml", run)["n"] for _ in range(4)]
    assert first == [0, 1, 2] and second == [0, 1, 2, 3] and made == [0, 1, 2, 3]


@pytest.mark.tf
def test_the_plain_side_runs_as_a_fresh_process_with_its_phases_and_memory(
    tmp_path: pathlib.Path,
) -> None:
    from benchmarks import b20_short_job as b20

    _peers.write_inputs(str(tmp_path), copies=1, epochs=1, batch=256, workers=2)
    command = _peers.dvml_command(b20.__name__, "plain", str(tmp_path))
    result = _peers.run_side(command, str(tmp_path), "plain", timeout=300, memory=True)
    phases = result["phases"]
    assert 0 < phases["import tf_keras"] < phases["ingest"] < phases["fit"] < phases["model"]
    assert result["to_model_s"] == phases["model"] <= result["wall_s"]
    assert result["training_s"] > 0 and 0.1 < result["valid_accuracy"] <= 1.0
    assert result["peak_memory_bytes"] > 100 * (1 << 20)  # TensorFlow alone is more
    assert result["peak_memory_by_kind"]["side process"] == result["peak_memory_bytes"]


_HOLDER = """
import mmap, os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    file_pages = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
sum(file_pages[i] for i in range(0, size, 4096))  # resident: page cache, shared with the child
anon = bytearray(os.urandom(size))  # private pages, shared with the child below (COW)
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
"""


def _status_mib(pid: int, field: str) -> float:
    name = "smaps_rollup" if field == "Pss:" else "status"
    with open(f"/proc/{pid}/{name}") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def test_tree_memory_counts_each_page_once_whoever_else_maps_it(tmp_path: pathlib.Path) -> None:
    # A parent and its forked child share 64 MiB of anonymous pages and map a 64 MiB file: the
    # tree holds ~128 MiB (+ its interpreter). A process OUTSIDE the tree (this one) mapping
    # the same file lowers the tree's kernel PSS by half the file, not what the tree costs.
    import mmap
    import subprocess

    size = 64 << 20
    data = tmp_path / "pages.bin"
    data.write_bytes(np.random.default_rng(0).bytes(size))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(data), str(size)], stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        pids = (holder.pid, child)
        alone = _peers.tree_memory(holder.pid)
        total = sum(alone.values()) / (1 << 20)
        rss = sum(_status_mib(p, "VmRSS:") for p in pids)
        assert len(alone) == 2 and "side process" in alone  # the parent and the child, by kind
        assert 128 <= total < rss - 50  # the child's 64 MiB of copy-on-write pages count once
        pss_alone = sum(_status_mib(p, "Pss:") for p in pids)
        with open(data, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mine:
            sum(mine[i] for i in range(0, size, 4096))
            pss_shared = sum(_status_mib(p, "Pss:") for p in pids)
            still = sum(_peers.tree_memory(holder.pid).values()) / (1 << 20)
        assert pss_alone - pss_shared > 25  # the kernel's PSS gave half the file away
        assert abs(still - total) < 4  # the tree's own figure did not move
    finally:
        for pid in (holder.pid, child):
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        holder.wait()


def test_without_ray_the_ray_rows_are_skipped_and_the_run_exits_0(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 42 item 9: `python -m benchmarks --quick` exited 1 without ./scripts/peer-ray.
    # B19 needs Ray in every row; B20b and B20d compare with Ray (B20's other rows do not, and
    # they are not run here: they train). Skipped before dvml's side runs: this takes seconds.
    from benchmarks.__main__ import main

    monkeypatch.setenv("DVML_RAY_PYTHON", str(tmp_path / "no-python"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # B20's inputs: removed after
    out = tmp_path / "out"
    argv = ["--quick", "--repeats", "1", "--only", "B19,B20b,B20d", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["benchmark"] for r in rows] == ["B19a", "B19b", "B20b", "B20d"]
    for row in rows:
        assert row["error"] is None and "./scripts/peer-ray" in row["skipped"], row
        assert row["dvml_figures"] == [] and row["baseline_figures"] == []
    listed = (out / "results.md").read_text()
    assert all(f"{key} skipped: The Ray peer is not installed" in listed
               for key in ("B19a", "B19b", "B20b", "B20d"))  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # B20's inputs were removed


def test_a_peer_run_that_failed_leaves_the_other_rows_details_whole() -> None:
    # Issue 42 item 9: after a Ray run failed, B20c's and B20e's details() raised IndexError
    # (an empty list of Ray runs). A failed run is not counted, and the row may try again.
    from benchmarks import b20_short_job as b20

    def fail() -> dict[str, object]:
        raise RuntimeError("the ray side failed")

    plain = {"to_model_s": 3.0, "valid_accuracy": 0.9, "phases": {"model": 3.0}}
    context: dict[str, object] = {"rows": 10}
    with pytest.raises(RuntimeError, match="the ray side failed"):
        _peers.take(context, "B20b", "ray", fail)
    assert _peers.take(context, "B20c", "plain", lambda: plain)["to_model_s"] == 3.0
    assert set(b20.details(context)) == {
        "training rows", "dvml sync", "plain: to evaluated model s (median)",
        "plain: validation accuracy (last run)", "plain: phases (s since spawn, last run)",
    }  # fmt: skip
    assert _peers.take(context, "B20b", "ray", lambda: {"n": 1}) == {"n": 1}  # tries again
