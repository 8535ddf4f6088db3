"""notebooks/03_feature_cache.ipynb runs top to bottom (real cluster, real TensorFlow)."""

from __future__ import annotations

import pathlib

import pytest

from tests.helpers import execute_notebook

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "03_feature_cache.ipynb"

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]


def test_feature_cache_notebook_runs(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = execute_notebook(NOTEBOOK, tmp_path, monkeypatch)
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "hit: True | backbone batches run: 0" in text
    assert "backbone batches run while training the heads: 0" in text
    assert "same cache key: True" in text
    assert [o for o in outputs if "image/png" in o.get("data", {})], "the notebook drew nothing"
