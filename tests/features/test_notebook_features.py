"""notebooks/03_feature_cache.ipynb runs top to bottom (real cluster, real TensorFlow)."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "03_feature_cache.ipynb"

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]


def test_feature_cache_notebook_runs(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        "03_feature_cache.ipynb is stored with outputs; strip them before committing"
    )
    # The kernel inherits this environment: a private registry and state directory.
    monkeypatch.setenv("DASK_DVML__CLUSTER__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DASK_DVML__REGISTRY__URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    outputs = [o for c in notebook.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "hit: True | backbone batches run: 0" in text
    assert "backbone batches run while training the heads: 0" in text
    assert "same cache key: True" in text
    assert [o for o in outputs if "image/png" in o.get("data", {})], "the notebook drew nothing"
