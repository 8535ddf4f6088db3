"""``dvml demo``'s flow (dvml.demo.run_demo) on a fresh LocalCluster: it says which sync mode."""

from __future__ import annotations

import pathlib

import dask
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


def test_demo_trains_with_the_automatic_sync_mode_and_says_why(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Also #13 item 9: no TensorFlow start-up chatter (absl, oneDNN, cuInit) on fd 1 or 2 of
    the client or of the workers, which this demo's LocalCluster starts inside the test and
    which therefore write into the captured descriptors (trainers write to their own files)."""
    from dvml.demo import run_demo
    from dvml.tf_runtime import is_startup_chatter

    lines: list[str] = []
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        result = run_demo(
            num_iterations=1,
            epochs=1,
            registry=f"sqlite:///{tmp_path / 'registry.db'}",
            say=lines.append,
        )
    # the demo's LocalCluster has no GPUs: model averaging is the fastest correct mode there
    assert result["sync"] == "iteration"
    assert result["weights_identical"] is True
    said = "\n".join(lines)
    assert "sync='iteration' because the trainers run on CPU" in said, said
    captured = capfd.readouterr()
    output = captured.out + captured.err
    chatter = [line for line in output.splitlines() if is_startup_chatter(line)]
    named = [line for line in output.splitlines()
             if any(w in line for w in ("absl::", "oneDNN", "cuInit", "cuda drivers"))]  # fmt: skip
    assert chatter == [] and named == [], output


def test_the_demo_plot_is_ignored_by_git() -> None:
    """``./scripts/demo`` writes dvml-demo-history.png into the checkout (issue 28)."""
    import subprocess

    from tests.helpers import REPO

    script = (REPO / "scripts" / "demo").read_text()
    assert "dvml-demo-history.png" in script
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "dvml-demo-history.png"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0, "dvml-demo-history.png is not ignored by git"
