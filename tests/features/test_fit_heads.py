"""Fine-tuning: several heads trained one after another on one feature cache with dvml.fit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dask
import pytest

import dvml
from dvml.exceptions import ModelMismatchError
from tests.helpers import (
    CLASSES,
    batches,
    dataset_names,
    keras,
    tiny_backbone,
    write_image_folder,
)

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.05)', metrics=['accuracy']"
)


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """Training and validation image folders cached under one backbone; a tmp registry."""
    client = cluster2.client
    tmp = tmp_path_factory.mktemp("heads")
    before = dataset_names(client)
    registry = dvml.Registry(f"sqlite:///{tmp}/r.db")
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        bb = tiny_backbone()
        common = {"image_size": (32, 32), "normalizing_const": 255.0, "client": client}
        folders = {
            "train": str(write_image_folder(tmp / "train", 30, seed=0)),
            "valid": str(write_image_folder(tmp / "valid", 10, seed=1)),
        }
        train = dvml.features.cache(folders["train"], bb, pooling="avg", name="fh_train", **common)
        valid = dvml.features.cache(
            folders["valid"], bb, pooling="avg", name="fh_valid", training="fh_train", **common
        )
        yield {
            "client": client,
            "registry": registry,
            "train": train,
            "valid": valid,
            "bb": bb,
            "folders": folders,
            "common": common,
        }
    registry.close()
    for name in dataset_names(client) - before:
        dvml.datasets.drop(name, client=client)


def head(hidden: int | None) -> Any:
    k = keras()
    layers = [k.layers.InputLayer(input_shape=(16,))]
    if hidden:
        layers += [k.layers.Dense(hidden, activation="relu"), k.layers.Dropout(0.1)]
    layers.append(k.layers.Dense(len(CLASSES), activation="softmax"))
    return k.Sequential(layers)


def test_validation_cache_goes_with_its_training_cache(env: dict[str, Any]) -> None:
    train, valid = env["train"], env["valid"]
    assert valid.summary["training_dataset"] == {
        "name": "fh_train",
        "dataset_id": train.summary["dataset_id"],
    }
    assert valid.summary["class_values"] == train.summary["class_values"] == list(CLASSES)
    # Its features are placed like the training cache's: every trainer has validation rows.
    assert {b["worker_name"] for b in valid.layout["buffers"]} == {
        b["worker_name"] for b in train.layout["buffers"]
    }
    with pytest.raises(ModelMismatchError, match="same backbone"):
        dvml.features.cache(
            env["folders"]["valid"],
            tiny_backbone(seed=9),
            pooling="avg",
            training="fh_train",
            **env["common"],
        )
    with pytest.raises(ModelMismatchError, match="preprocessed differently"):
        dvml.features.cache(
            env["folders"]["valid"],
            env["bb"],
            pooling="avg",
            training="fh_train",
            **{**env["common"], "normalizing_const": 1.0},
        )


def test_two_heads_fine_tuned_on_one_cache(env: dict[str, Any], tmp_path: Any) -> None:
    client, registry = env["client"], env["registry"]
    before = batches(client)
    results = {}
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        for model, hidden, fit_params in (
            ("head_linear", None, "batch_size=16, epochs=15"),
            ("head_mlp", 32, "batch_size=16, epochs=10"),
        ):
            arch = dvml.load_keras_model(head(hidden).to_json(), name=model, registry=registry)
            fitted = dvml.fit(
                "fh_train",
                model,
                arch,
                COMPILE,
                fit_params,
                num_iterations=2,
                validation_set="fh_valid",
                progress=False,
                registry=registry,
                client=client,
            )
            results[model] = fitted.summary
            evaluated = dvml.evaluate(model, "fh_valid", registry=registry, client=client)
            assert evaluated["rows"] == 30
            assert evaluated["metric"] == pytest.approx(fitted.summary["validation_metrics_final"])
    assert batches(client) == before  # the heads never ran the backbone
    for model, summary in results.items():
        assert summary["source_table"] == "fh_train"
        assert summary["validation_table"] == "fh_valid"
        assert summary["x_shapes"] == [[16]]
        assert summary["class_values"] == list(CLASSES)
        assert summary["validation_loss_final"] is not None
        # Colour classes are easy on these features: far better than chance (1/3).
        assert summary["validation_metrics_final"] > 0.6, (model, summary)
    assert set(dvml.list_models(registry=registry)["name"]) >= set(results)


def test_a_registry_architecture_is_the_same_backbone(env: dict[str, Any]) -> None:
    """The backbone stored in the registry has the same JSON and weights: the same key, a hit."""
    client, registry = env["client"], env["registry"]
    arch = dvml.load_keras_model(env["bb"], name="backbone", registry=registry)
    before = batches(client)
    again = dvml.features.cache(
        env["folders"]["train"],
        arch,
        pooling="avg",
        name="fh_train",
        registry=registry,
        **env["common"],
    )
    assert again.id == env["train"].id
    assert batches(client) == before
