"""Every notebook runs top to bottom (real cluster, real TensorFlow), so none can rot."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.parametrize("name", ["01_distribution_rules.ipynb", "02_digits_training.ipynb"])
def test_notebook_runs(name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{name} is stored with outputs; strip them before committing"
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
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    images = [
        o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert images, f"{name} drew no picture"
