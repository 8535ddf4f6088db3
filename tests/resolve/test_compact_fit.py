"""Compact storage is the default: a fit on datasets packed with no ``compact=`` argument (uint8
x, class indices) normalizes and one-hot encodes on the fly in the trainers' input pipeline, and
learns as the same fit on the float32 layout (``compact=False``) does."""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import pytest

import dvml
from dvml.examples import COMPILE_PARAMS, digits_cnn_json

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


def test_compact_is_the_default_and_trains_as_float32(
    cluster2: dvml.LocalCluster, tmp_path: Any
) -> None:
    from sklearn.datasets import load_digits

    client = cluster2.client
    digits = load_digits()
    x = digits.images.reshape(-1, 8, 8, 1).astype(np.uint8)  # the 0-16 values, as uint8
    y = digits.target
    order = np.random.default_rng(0).permutation(len(y))
    train, val = order[:1400], order[1400:]
    names = ("cf_train", "cf_val", "cf_train_f32", "cf_val_f32")
    summaries: dict[str, dict[str, Any]] = {}
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            # Both fits start from the same weights: the architecture's stored ones.
            from dvml import tf_runtime

            keras = tf_runtime.keras()
            keras.utils.set_random_seed(0)
            cnn = keras.models.model_from_json(digits_cnn_json())
            arch = dvml.load_keras_model(cnn, name="cnn", registry=registry)
            for suffix, layout in (("", {}), ("_f32", {"compact": False})):
                ds = dvml.training_preprocessor(
                    {"image": x[train], "label": y[train]}, y="label", x="image",
                    normalizing_const=16.0, name=f"cf_train{suffix}", client=client, **layout,
                )  # fmt: skip
                val_ds = dvml.validation_preprocessor(
                    {"image": x[val], "label": y[val]}, y="label", x="image", training=ds,
                    name=f"cf_val{suffix}", client=client,
                )  # fmt: skip
                assert val_ds.summary["storage"] == ds.summary["storage"]
                model = dvml.fit(
                    f"cf_train{suffix}", f"cf_model{suffix}", arch, compile_params=COMPILE_PARAMS,
                    fit_params="batch_size=32, epochs=2", num_iterations=2,
                    validation_set=f"cf_val{suffix}", metrics_compute_frequency=1,
                    registry=registry, client=client,
                )  # fmt: skip
                summaries[suffix] = {"storage": ds.summary["storage"], **model.summary}
        finally:
            registry.close()
            for name in names:
                if dvml.datasets.exists(name, client=client):
                    dvml.datasets.drop(name, client=client)
    default, f32 = summaries[""], summaries["_f32"]
    # No compact= argument: uint8 pixels and uint8 class indices.
    assert default["storage"] == {"compact": True, "x_dtypes": ["uint8"], "y": "index",
                                  "y_dtype": "uint8"}  # fmt: skip
    assert f32["storage"] == {"compact": False, "y": "one_hot"}
    for s in (default, f32):
        assert s["training_loss"][-1] < s["training_loss"][0]
        assert s["validation_metrics_final"] > 0.85
    # The same accuracy and losses. Both start from the architecture's weights and read the
    # same rows in the same order, and the trainers turn the compact rows into the float32
    # batches the float32 layout stores: they differ by float rounding at most (measured:
    # identical). One of the 397 validation rows is 0.0025.
    assert default["validation_metrics_final"] == pytest.approx(
        f32["validation_metrics_final"], abs=1 / 397
    )
    assert default["training_loss"] == pytest.approx(f32["training_loss"], rel=1e-4)
    assert default["validation_loss"] == pytest.approx(f32["validation_loss"], rel=1e-4)
