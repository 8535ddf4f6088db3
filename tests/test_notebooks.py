"""Every notebook runs top to bottom (real cluster, real TensorFlow), so none can rot.

Each executed notebook is kept in ``docs/_build/executed/``: the documentation site renders
those copies, outputs and plots included (``./scripts/docs``).
"""

from __future__ import annotations

import pathlib

import nbformat
import pytest

from tests.helpers import execute_notebook
from tests.helpers.notebooks import EXECUTED_DIR

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.parametrize(
    "name",
    [
        "01_distribution_rules.ipynb",
        "02_digits_training.ipynb",
        "04_fit_multiple.ipynb",
        "05_your_own_training_loop.ipynb",
        "06_model_search.ipynb",
    ],
)
def test_notebook_runs(name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = execute_notebook(NOTEBOOKS / name, tmp_path, monkeypatch)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no picture"
    kept = nbformat.read(EXECUTED_DIR / name, as_version=4)
    assert [c.source for c in kept.cells] == [
        c.source for c in nbformat.read(NOTEBOOKS / name, as_version=4).cells
    ]
    assert any("image/png" in o.get("data", {}) for c in kept.cells for o in c.get("outputs", []))
