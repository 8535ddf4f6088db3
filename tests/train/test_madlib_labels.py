"""Labels MADlib accepts, end to end on a real cluster (issue 36 item 2).

MADlib's ``training_preprocessor_dl`` takes a dependent variable that is already one-hot
encoded (an ``INTEGER[]``/``REAL[]`` column: ``class_values`` NULL) and keeps NULL labels as
a class of their own, first in ``class_values`` (``{NULL,a,b}``), for text and boolean
labels alike. Iris, one iteration per fit.
"""

from __future__ import annotations

import json
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def dense_json(n_classes: int) -> str:
    from tests.helpers.models import keras

    k = keras()
    model = k.Sequential(
        [
            k.layers.InputLayer(input_shape=(4,)),
            k.layers.Dense(8, activation="relu"),
            k.layers.Dense(n_classes, activation="softmax"),
        ]
    )
    return str(model.to_json())


def iris_frame() -> pd.DataFrame:
    from sklearn.datasets import load_iris

    iris = load_iris()
    frame = pd.DataFrame(iris.data, columns=FEATURES)
    frame.insert(0, "id", np.arange(len(frame)))
    names = np.array(["Iris-setosa", "Iris-versicolor", "Iris-virginica"])
    frame["class_text"] = names[iris.target]
    # every fifth row has no label: MADlib makes NULL a class of its own
    text = frame["class_text"].astype(object)
    text[frame.index % 5 == 0] = None
    frame["class_text_null"] = text
    flag = pd.Series(iris.target == 0, dtype=object)
    flag[frame.index % 7 == 0] = None
    frame["is_setosa"] = flag
    # MADlib's dependent variable already one-hot encoded (an INTEGER[] column)
    frame["class_one_hot"] = list(np.eye(3, dtype=np.int32)[iris.target])
    return frame


def test_labels_madlib_accepts(cluster2: dvml.LocalCluster, tmp_path: Any) -> None:
    client = cluster2.client
    frame = iris_frame()
    made: list[str] = []
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            # -- NULL text labels: a class of their own, first in class_values ----------
            made.append("ml_null")
            ds = dvml.training_preprocessor(
                frame, y="class_text_null", x=[FEATURES], name="ml_null", client=client
            )
            expected = [None, "Iris-setosa", "Iris-versicolor", "Iris-virginica"]
            assert ds.summary["class_values"] == expected
            assert ds.summary["class_text_null_class_values"] == expected
            assert ds.summary["num_classes"] == 4
            assert ds.summary["dependent_vartype"] == "str"
            assert ds.summary["rows"] == len(frame)  # no row refused or dropped
            # validation with the training set's classes, NULL included
            made.append("ml_null_val")
            dvml.validation_preprocessor(
                frame, y="class_text_null", x=[FEATURES], training=ds, name="ml_null_val",
                client=client,
            )  # fmt: skip
            arch = dvml.load_keras_model(dense_json(4), name="dense4", registry=registry)
            model = dvml.fit(
                "ml_null", "ml_null_model", arch, compile_params=COMPILE,
                fit_params="batch_size=16, epochs=1", num_iterations=1,
                validation_set="ml_null_val", registry=registry, client=client,
            )  # fmt: skip
            assert model.summary["class_values"] == expected
            predicted = dvml.predict(
                "ml_null_model", frame, id_col="id", x=[FEATURES], pred_type="prob",
                registry=registry, client=client,
            ).compute(scheduler=client)  # fmt: skip
            assert len(predicted) == 4 * len(frame)
            nulls = predicted["class_value"].isna()
            assert int(nulls.sum()) == len(frame)  # the NULL class has its probability
            assert set(predicted["class_value"][~nulls]) == set(expected[1:])

            # -- boolean labels with NULL ----------------------------------------------
            made.append("ml_bool")
            ds = dvml.training_preprocessor(
                frame, y="is_setosa", x=[FEATURES], name="ml_bool", client=client
            )
            assert ds.summary["class_values"] == [None, False, True]
            assert ds.summary["dependent_vartype"] == "bool"

            # -- labels already one-hot encoded (INTEGER[]): class_values NULL ---------
            for compact in (False, True):
                name = f"ml_onehot_{int(compact)}"
                made.append(name)
                ds = dvml.training_preprocessor(
                    frame, y="class_one_hot", x=[FEATURES], name=name, compact=compact,
                    client=client,
                )  # fmt: skip
                assert ds.summary["class_values"] is None
                assert ds.summary["class_one_hot_class_values"] is None
                assert ds.summary["num_classes"] == 3
                assert ds.summary["dependent_vartype"] == "int[]"
                # the summary stays JSON (it is published with the dataset)
                json.dumps(ds.summary)
            arch3 = dvml.load_keras_model(dense_json(3), name="dense3", registry=registry)
            model = dvml.fit(
                "ml_onehot_1", "ml_onehot_model", arch3, compile_params=COMPILE,
                fit_params="batch_size=16, epochs=1", num_iterations=1, registry=registry,
                client=client,
            )  # fmt: skip
            assert np.isfinite(model.summary["training_loss"][-1])
            predicted = dvml.predict(
                "ml_onehot_model", frame, id_col="id", x=[FEATURES], registry=registry,
                client=client,
            ).compute(scheduler=client)  # fmt: skip
            # no class values: a class is its one-hot column's index
            assert len(predicted) == len(frame)
            assert set(predicted["class_value"]) <= {0, 1, 2}
        finally:
            registry.close()
            for name in made:
                if dvml.datasets.exists(name, client=client):
                    dvml.datasets.drop(name, client=client)
