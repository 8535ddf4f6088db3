"""MADlib's multi-io example on a real cluster (issue 36 item 9), call for call.

MADlib's test (madlib_keras_multi_io.sql_in) builds ``iris_mult``: ``attributes`` and
``attributes2`` (its square) as two inputs, ``class_text`` twice as two label columns;
``training_preprocessor_dl('iris_mult', 'iris_mult_packed', 'class_text, class_text2',
'attributes, attributes2')``, then fit with validation, evaluate, predict, warm start. dvml
goes on where MADlib stops (its fit_multiple refuses multi-io): fit_multiple and automl.
"""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
FIT = "batch_size=16, epochs=1"
DEPS = ["class_text", "class_text2"]
CLASSES = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]


def multi_io_json() -> str:
    """MADlib's iris_model_arch 3: two inputs, two softmax outputs (dense_4, dense_5)."""
    from tests.helpers.models import keras

    k = keras()
    in1 = k.Input(shape=(4,), name="input_1")
    in2 = k.Input(shape=(4,), name="input_2")
    d1 = k.layers.Dense(10, activation="relu", name="dense_1")(
        k.layers.Dense(10, activation="relu", name="dense")(in1)
    )
    d3 = k.layers.Dense(10, activation="relu", name="dense_3")(
        k.layers.Dense(10, activation="relu", name="dense_2")(in2)
    )
    out1 = k.layers.Dense(3, activation="softmax", name="dense_4")(
        k.layers.Concatenate(name="concatenate")([d1, d3])
    )
    out2 = k.layers.Dense(3, activation="softmax", name="dense_5")(d3)
    return str(k.Model([in1, in2], [out1, out2]).to_json())


def iris_mult() -> pd.DataFrame:
    from sklearn.datasets import load_iris

    iris = load_iris()
    attributes = iris.data.astype(np.float32)
    text = np.array(CLASSES)[iris.target]
    return pd.DataFrame(
        {
            "id": np.arange(len(text)),
            "attributes": list(attributes),
            "attributes2": list(attributes**2),
            "class_text": text,
            "class_text2": text,
        }
    )


def test_madlib_multi_io_pipeline(cluster2: dvml.LocalCluster, tmp_path: Any) -> None:
    client = cluster2.client
    frame = iris_mult()
    made = ["iris_mult_packed", "iris_mult_val", "iris_mult_packed_f"]
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            _pipeline(client, registry, frame)
        finally:
            registry.close()
            for name in made:
                if dvml.datasets.exists(name, client=client):
                    dvml.datasets.drop(name, client=client)


def _pipeline(client: Any, registry: dvml.Registry, frame: pd.DataFrame) -> None:
    # -- preprocess: MADlib's 'class_text, class_text2' and 'attributes, attributes2' ----
    packed = dvml.training_preprocessor(
        frame, "class_text, class_text2", ["attributes", "attributes2"],
        normalizing_const=255, name="iris_mult_packed", client=client,
    )  # fmt: skip
    s = packed.summary
    assert s["dependent_varname"] == DEPS
    assert s["dependent_vartype"] == ["str", "str"]
    assert s["class_values"] == [CLASSES, CLASSES]
    assert s["class_text_class_values"] == CLASSES and s["class_text2_class_values"] == CLASSES
    assert s["num_classes"] == [3, 3] and s["dependent_count"] == 2
    dvml.validation_preprocessor(
        frame, "class_text, class_text2", ["attributes", "attributes2"],
        training="iris_mult_packed", name="iris_mult_val", client=client,
    )  # fmt: skip
    # the default, compact storage keeps each output's class indices; compact=False stores
    # each output one-hot (fit_multiple trains on that one below, fit and automl on this one)
    assert s["storage"]["compact"] and s["storage"]["ys"] == ["index", "index"]
    plain = dvml.training_preprocessor(
        frame, DEPS, ["attributes", "attributes2"], normalizing_const=255, compact=False,
        name="iris_mult_packed_f", client=client,
    )  # fmt: skip
    assert plain.summary["storage"] == {"compact": False, "y": "one_hot"}

    # -- fit with validation: total loss, and per output ---------------------------------
    arch = dvml.load_keras_model(multi_io_json(), name="iris_multi", registry=registry)
    model = dvml.fit(
        "iris_mult_packed", "iris_model", arch, compile_params=COMPILE, fit_params=FIT,
        num_iterations=2, validation_set="iris_mult_val", metrics_compute_frequency=1,
        registry=registry, client=client,
    )  # fmt: skip
    m = model.summary
    assert m["dependent_varname"] == DEPS and m["class_values"] == [CLASSES, CLASSES]
    assert len(m["training_loss"]) == 2 and len(m["validation_loss"]) == 2
    for dep in DEPS:
        for part in ("training", "validation"):
            losses = m[f"{dep}_{part}_loss"]
            assert len(losses) == 2 and all(np.isfinite(losses))
            assert 0.0 <= m[f"{dep}_{part}_metrics_final"] <= 1.0
    # the total loss is the sum of the outputs' losses
    total = m["class_text_training_loss_final"] + m["class_text2_training_loss_final"]
    assert m["training_loss_final"] == pytest.approx(total, rel=1e-3)
    assert m["training_metrics_final"] == m["class_text_training_metrics_final"]

    # -- evaluate ------------------------------------------------------------------------
    scores = dvml.evaluate("iris_model", "iris_mult_val", registry=registry, client=client)
    assert scores["loss"] == pytest.approx(m["validation_loss_final"], rel=1e-3)
    for dep in DEPS:
        assert np.isfinite(scores[f"{dep}_loss"]) and 0 <= scores[f"{dep}_metric"] <= 1

    # -- predict: one row per input row and output, class_name the dependent variable -----
    predicted = dvml.predict(
        "iris_model", frame, "id", ["attributes", "attributes2"], registry=registry,
        client=client,
    ).compute(scheduler=client)  # fmt: skip
    assert len(predicted) == 2 * len(frame)
    assert sorted(predicted["class_name"].unique()) == DEPS
    for dep in DEPS:
        rows = predicted[predicted["class_name"] == dep]
        assert sorted(rows["id"]) == list(range(len(frame)))
        assert set(rows["class_value"]) <= set(CLASSES)
        assert (rows["rank"] == 1).all()
    probs = dvml.predict(
        "iris_model", frame.head(5), "id", ["attributes", "attributes2"], pred_type="prob",
        registry=registry, client=client,
    ).compute(scheduler=client)  # fmt: skip
    sums = probs.groupby(["id", "class_name"])["prob"].sum()
    assert len(sums) == 10 and np.allclose(sums, 1.0, atol=1e-5)

    # -- predict_byom: MADlib's dependent_count and one list of class values per output ---
    weights = registry.get_model("iris_model")["weights"]
    byom = dvml.load_keras_model(multi_io_json(), weights=weights, registry=registry)
    again = dvml.predict_byom(
        byom, frame, "id", ["attributes", "attributes2"], class_values=[CLASSES, CLASSES],
        normalizing_const=255, dependent_count=2, registry=registry, client=client,
    ).compute(scheduler=client)  # fmt: skip
    assert sorted(again["class_name"].unique()) == ["dependent_var_0", "dependent_var_1"]
    for k, dep in enumerate(DEPS):
        mine = again[again["class_name"] == f"dependent_var_{k}"].sort_values("id")
        theirs = predicted[predicted["class_name"] == dep].sort_values("id")
        assert list(mine["class_value"]) == list(theirs["class_value"])

    # -- warm start ----------------------------------------------------------------------
    warm = dvml.fit(
        "iris_mult_packed", "iris_model", arch, compile_params=COMPILE, fit_params=FIT,
        num_iterations=1, validation_set="iris_mult_val", warm_start=True, registry=registry,
        client=client,
    )  # fmt: skip
    assert warm.summary["warm_start"]
    assert np.isfinite(warm.summary["class_text2_training_loss_final"])

    # -- fit_multiple (MADlib refuses multi-io here) on the float32 set -------------------
    table = pd.DataFrame(
        {
            "mst_key": [1, 2],
            "model_id": [arch, arch],
            "compile_params": [COMPILE, COMPILE.replace("'adam'", "'sgd'")],
            "fit_params": [FIT, FIT],
        }
    )
    selection = dvml.fit_multiple(
        "iris_mult_packed_f", "iris_mop", table, num_iterations=1, progress=False,
        registry=registry, client=client,
    )  # fmt: skip
    assert len(selection.info) == 2
    assert all(np.isfinite(selection.info["training_loss_final"]))

    # -- automl -------------------------------------------------------------------------
    result = dvml.automl(
        "iris_mult_packed", "iris_automl", arch,
        {"loss": ["categorical_crossentropy"], "optimizer_params_list": [
            {"optimizer": ["Adam"], "lr": [0.001, 0.1, "log"]}], "metrics": ["accuracy"]},
        {"batch_size": [16], "epochs": [1]}, method="hyperopt",
        params="num_configs=2, num_iterations=1, algorithm=rand", seed=3,
        validation_set="iris_mult_val", progress=False, registry=registry, client=client,
    )  # fmt: skip
    assert len(result.info) == 2
    assert all(np.isfinite(result.info["validation_loss_final"]))
