"""Running a notebook of notebooks/ top to bottom, as the notebook tests do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

__all__ = ["EXECUTED_DIR", "execute_notebook"]

# Executed copies for the documentation site (docs/conf.py renders them; git-ignored).
EXECUTED_DIR = Path(__file__).resolve().parents[2] / "docs" / "_build" / "executed"


def execute_notebook(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Run a notebook top to bottom in a fresh kernel; return every cell output.

    Asserts that the notebook is stored without outputs and that no cell raised. The kernel
    inherits this environment: a private registry and state directory, a non-GUI plot backend.
    The executed notebook is written to ``docs/_build/executed/`` for the documentation site.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name} is stored with outputs; strip them before committing"
    )
    monkeypatch.setenv("DASK_DVML__CLUSTER__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DASK_DVML__REGISTRY__URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(
        notebook, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()  # fmt: skip
    outputs = [o for c in notebook.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    partial = EXECUTED_DIR / f".{path.name}.partial"
    nbformat.write(notebook, partial)
    partial.replace(EXECUTED_DIR / path.name)  # a docs build never reads half a file
    return outputs
