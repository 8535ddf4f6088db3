"""``dvml demo``'s flow (dvml.demo.run_demo) on a fresh LocalCluster: it says which sync mode."""

from __future__ import annotations

import pathlib

import dask
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


def test_demo_trains_with_the_automatic_sync_mode_and_says_why(tmp_path: pathlib.Path) -> None:
    from dvml.demo import run_demo

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


def test_demo_prints_no_tensorflow_startup_chatter(tmp_path: pathlib.Path) -> None:
    """#13 item 9: `dvml demo` as a user runs it (client, workers and trainers all writing to
    the terminal) shows no absl/oneDNN/cuInit lines, even with TF_CPP_MIN_LOG_LEVEL unset."""
    from dvml.tf_runtime import is_startup_chatter
    from tests.helpers import dvml_command, with_state_dir

    env = with_state_dir(tmp_path / "state")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    registry = f"sqlite:///{tmp_path / 'registry.db'}"
    result = dvml_command(
        "demo", "--iterations", "1", "--epochs", "1", "--registry", registry, env=env, timeout=560
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[dvml.fit" in output  # it did train
    chatter = [line for line in output.splitlines() if is_startup_chatter(line)]
    named = [line for line in output.splitlines()
             if any(w in line for w in ("absl::", "oneDNN", "cuInit", "cuda_drivers"))]  # fmt: skip
    assert chatter == [] and named == [], output
