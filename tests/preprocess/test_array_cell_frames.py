"""A pandas frame with a column of array cells: stacked on the client, prepared like arrays."""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest

from dvml.exceptions import DataError
from dvml.preprocess.sources import source_parts
from dvml.preprocess.tasks import prepare_table


def _frame(n: int = 103) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    cells = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(n)]
    if n > 5:
        cells[5][0, 0] = np.nan  # one invalid row, counted the same way by both paths
    return pd.DataFrame({"pixels": cells, "digit": rng.choice([7, 3, 5], size=n)})


def test_same_prepared_rows_as_the_table_path() -> None:
    frame = _frame()
    src = source_parts(frame, "digit", "pixels", 4, "drop", None, 3, 255.0)
    assert src.x_names == [["pixels"]] and src.y == "digit"
    assert len(src.parts) == 8  # 2 per target, as dd.from_pandas would split it
    batches = dask.compute(*src.parts, scheduler="sync")
    assert all(len(batch) == 1 for batch in batches)  # one part per task here
    parts = [batch[0] for batch in batches]
    reference = prepare_table(frame, [["pixels"]], "digit", "drop", 255.0)
    x = np.concatenate([p["x"][0] for p in parts])
    assert x.dtype == reference["x"][0].dtype == np.float32
    np.testing.assert_array_equal(x, reference["x"][0])
    np.testing.assert_array_equal(np.concatenate([p["labels"] for p in parts]), reference["labels"])
    assert sum(p["dropped"] for p in parts) == reference["dropped"] == 1
    assert [p["invalid"] for p in parts if p["invalid"]] == [reference["invalid"]]


def test_ragged_cells_raise_on_the_client() -> None:
    frame = _frame(4)
    cells = frame["pixels"].tolist()
    cells[2] = np.zeros((3, 3), dtype=np.float32)
    frame["pixels"] = pd.Series(cells, dtype=object)
    with pytest.raises(DataError, match="different shapes"):
        source_parts(frame, "digit", "pixels", 2, "raise", None, 3)


def test_missing_column_names_it() -> None:
    with pytest.raises(DataError, match="missing from the source"):
        source_parts(_frame(4), "label", "pixels", 2, "raise", None, 3)
