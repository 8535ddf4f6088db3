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
