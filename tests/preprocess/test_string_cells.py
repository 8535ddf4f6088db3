"""Dask DataFrames of array-valued cells under dataframe.convert-string (#13 item 4).

Dask's default ``dataframe.convert-string`` turns object columns into text when a frame is
built with ``dd.from_pandas``, ``from_delayed`` or ``from_map`` (vineyard's "Dask on
Vineyard" guide builds them so). dvml undoes the conversion where the graph keeps the arrays,
and otherwise says what to do.
"""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask import delayed

import dvml
from dvml.exceptions import DataError
from dvml.preprocess.string_cells import restore_array_cells, without_string_conversion

IRIS = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]


def _frame(n: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "id": np.arange(n),
            "x": [rng.normal(size=3).astype(np.float32) for _ in range(n)],
            "label": [IRIS[i % 3] for i in range(n)],
        }
    )


def _part(frame: pd.DataFrame, i: int) -> pd.DataFrame:
    return frame.iloc[i * 6 : (i + 1) * 6]


def _builders(frame: pd.DataFrame) -> dict[str, Any]:
    return {
        "from_pandas": dd.from_pandas(frame, npartitions=2),
        "from_delayed": dd.from_delayed(
            [delayed(_part)(frame, i) for i in range(2)], meta=frame.iloc[:0]
        ),
        "from_map": dd.from_map(lambda i: _part(frame, i), [0, 1]),
    }


@pytest.mark.parametrize("how", ["from_pandas", "from_delayed", "from_map"])
def test_the_arrays_are_recovered(how: str) -> None:
    frame = _frame()
    with dask.config.set({"dataframe.convert-string": True}):  # Dask's default
        ddf = _builders(frame)[how][["id", "x", "label"]]
        assert str(ddf.dtypes["x"]).startswith("string")  # what dvml received before
        restored = restore_array_cells(ddf, ["x"])
        got = restored.compute(scheduler="sync")
    assert got["x"].dtype == object
    np.testing.assert_array_equal(np.stack(got["x"].tolist()), np.stack(frame["x"].tolist()))
    assert got["label"].tolist() == frame["label"].tolist()


def test_numeric_columns_are_left_alone() -> None:
    ddf = dd.from_pandas(pd.DataFrame({"a": [1.0, 2.0], "b": [0, 1]}), npartitions=1)
    assert restore_array_cells(ddf, ["a"]) is ddf


def test_text_that_cannot_be_recovered_is_refused_with_the_fix() -> None:
    frame = _frame()
    with dask.config.set({"dataframe.convert-string": True}):
        ddf = dd.from_pandas(frame, npartitions=2)
        ddf["x"] = ddf["x"].astype("string")  # a conversion of the user's own: it stays
        assert str(without_string_conversion(ddf).dtypes["x"]).startswith("string")
        with pytest.raises(DataError) as info:
            restore_array_cells(ddf, ["x"])
    message = str(info.value)
    assert "'x'" in message and "dtype string" in message
    assert "dask.config.set({'dataframe.convert-string': False})" in message


@pytest.mark.cluster
@pytest.mark.tf
def test_preprocess_and_predict_a_dask_frame_of_arrays(
    cluster2: dvml.LocalCluster, tmp_path: Any
) -> None:
    """The guide's flow: dd.from_delayed / from_map with the default config, no workaround."""
    from tests.helpers import keras

    client = cluster2.client
    frame = _frame(24)
    parts = [delayed(frame.iloc.__getitem__)(slice(i * 6, (i + 1) * 6)) for i in range(4)]
    ddf = dd.from_delayed(parts, meta=frame.iloc[:0])
    ds = dvml.training_preprocessor(ddf, y="label", x="x", name="sc_arrays", overwrite=True,
                                    client=client)  # fmt: skip
    try:
        assert ds.rows == 24 and ds.summary["x_shapes"] == [[3]]
        assert ds.summary["class_values"] == IRIS
    finally:
        ds.drop(client=client)

    k = keras()
    model = k.Sequential([k.layers.InputLayer(input_shape=(3,)),
                          k.layers.Dense(3, activation="softmax")])  # fmt: skip
    weights = [np.eye(3, dtype=np.float32) * 10, np.zeros(3, np.float32)]
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        arch = dvml.load_keras_model(model.to_json(), weights=weights, registry=registry)
        chunks = [frame.iloc[i * 6 : (i + 1) * 6] for i in range(4)]
        mapped = dd.from_map(lambda i: chunks[i], range(4))
        out = dvml.predict_byom(
            arch, mapped, "id", "x", class_values=IRIS, registry=registry, client=client
        ).compute(scheduler=client)
        expected = [IRIS[int(np.argmax(v))] for v in frame["x"]]
        assert out.sort_values("id")["class_value"].tolist() == expected
    finally:
        registry.close()
    assert os.path.exists(tmp_path / "registry.db")
