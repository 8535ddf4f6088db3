"""The preprocessor shows Dask's progress bar where the user is, when asked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import dvml

pytestmark = pytest.mark.cluster


def test_progress_bar_is_printed(cluster2: Any, capsys: pytest.CaptureFixture[str]) -> None:
    frame = pd.DataFrame({"a": np.arange(40.0), "b": np.ones(40), "label": np.arange(40) % 2})
    try:
        dvml.training_preprocessor(
            frame,
            y="label",
            x=[["a", "b"]],
            name="progress_demo",
            progress=True,
            client=cluster2.client,
        )
        out = capsys.readouterr().out
        assert "100% Completed" in out
    finally:
        if dvml.datasets.exists("progress_demo", client=cluster2.client):
            dvml.datasets.drop("progress_demo", client=cluster2.client)
