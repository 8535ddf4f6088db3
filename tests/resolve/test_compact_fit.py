"""A fit on datasets in the compact format (uint8 x, class indices): the trainers' input
pipeline normalizes and one-hot encodes on the fly, and the model learns as from float32."""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import pytest

import dvml
from dvml.examples import COMPILE_PARAMS, digits_cnn_json

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


def test_fit_on_compact_datasets(cluster2: dvml.LocalCluster, tmp_path: Any) -> None:
    from sklearn.datasets import load_digits

    client = cluster2.client
    digits = load_digits()
    x = digits.images.reshape(-1, 8, 8, 1).astype(np.uint8)  # the 0-16 values, as uint8
    y = digits.target
    order = np.random.default_rng(0).permutation(len(y))
    train, val = order[:1400], order[1400:]
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            ds = dvml.training_preprocessor(
                {"image": x[train], "label": y[train]}, y="label", x="image",
                normalizing_const=16.0, compact=True, name="cf_train", client=client,
            )  # fmt: skip
            dvml.validation_preprocessor(
                {"image": x[val], "label": y[val]}, y="label", x="image", training=ds,
                name="cf_val", client=client,
            )  # fmt: skip
            assert ds.summary["storage"]["compact"] and ds.summary["storage"]["y_dtype"] == "uint8"
            arch = dvml.load_keras_model(digits_cnn_json(), name="cnn", registry=registry)
            model = dvml.fit(
                "cf_train", "cf_model", arch, compile_params=COMPILE_PARAMS,
                fit_params="batch_size=32, epochs=2", num_iterations=2,
                validation_set="cf_val", metrics_compute_frequency=1, registry=registry,
                client=client,
            )  # fmt: skip
            s = model.summary
            assert s["training_loss"][-1] < s["training_loss"][0]
            assert s["validation_metrics_final"] > 0.85  # as the float32 packing learns
        finally:
            registry.close()
            for name in ("cf_train", "cf_val"):
                if dvml.datasets.exists(name, client=client):
                    dvml.datasets.drop(name, client=client)
