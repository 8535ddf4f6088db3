"""BYOM prediction: MADlib's class_values forms, and a count that does not match refused."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import DataError
from dvml.train.predict import byom_class_values

IRIS = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, [0, 1, 2]), (IRIS, IRIS), ([IRIS], IRIS), ((tuple(IRIS),), IRIS),
     ([0, 1, 2], [0, 1, 2])],
)  # fmt: skip
def test_class_values_forms(given: Any, expected: list[Any]) -> None:
    assert byom_class_values(given, 3, 7) == expected


@pytest.mark.parametrize(
    ("given", "match"),
    [
        (IRIS[:2], r"names 2 classes but architecture 7 has 3 outputs"),
        ([IRIS[:2]], r"names 2 classes but architecture 7 has 3 outputs"),
        ([*IRIS, "x"], r"names 4 classes .* 3 outputs"),
        ([IRIS, IRIS], r"one list per model output.*Received 2 entries"),
        ([IRIS, "a"], r"one list per model output"),
        ("abc", r"must be a list of class names"),
    ],
)
def test_class_values_refused(given: Any, match: str) -> None:
    with pytest.raises(DataError, match=match):
        byom_class_values(given, 3, 7)


def test_byom_outputs_reads_madlibs_multi_output_form() -> None:
    from dvml.train.predict import byom_outputs

    assert byom_outputs([["a", "b"], [0, 1, 2]], 2) == [["a", "b"], [0, 1, 2]]
    assert byom_outputs([["a", "b"], [0, 1, 2]], None) == [["a", "b"], [0, 1, 2]]
    assert byom_outputs(["a", "b"], None) is None and byom_outputs([["a", "b"]], 1) is None
    with pytest.raises(DataError, match="one list per output"):
        byom_outputs(None, 2)
    with pytest.raises(ValueError, match="positive int"):
        byom_outputs(None, 0)


def _argmax_model() -> tuple[str, list[np.ndarray]]:
    """A 3-feature, 3-class model whose prediction is the argmax of x (no training needed)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    model = keras.Sequential(
        [keras.layers.InputLayer(input_shape=(3,)), keras.layers.Dense(3, activation="softmax")]
    )
    return model.to_json(), [np.eye(3, dtype=np.float32) * 10, np.zeros(3, np.float32)]


@pytest.mark.cluster
@pytest.mark.tf
def test_predict_byom_with_madlib_class_values(cluster2: dvml.LocalCluster, tmp_path: Any) -> None:
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        model_json, weights = _argmax_model()
        arch = dvml.load_keras_model(model_json, weights=weights, registry=registry)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(30, 3))
        frame = pd.DataFrame({"id": np.arange(30), "a": x[:, 0], "b": x[:, 1], "c": x[:, 2]})
        expected = [IRIS[i] for i in x.argmax(axis=1)]
        for form in (IRIS, [IRIS]):
            out = dvml.predict_byom(
                arch, frame, "id", [["a", "b", "c"]], class_values=form,
                registry=registry, client=cluster2.client,
            ).compute(scheduler=cluster2.client)  # fmt: skip
            assert out.sort_values("id")["class_value"].tolist() == expected
        with pytest.raises(DataError, match=r"names 2 classes but architecture \d+ has 3 outputs"):
            dvml.predict_byom(
                arch, frame, "id", [["a", "b", "c"]], class_values=[IRIS[:2]],
                registry=registry, client=cluster2.client,
            )  # fmt: skip
    finally:
        registry.close()
