"""predict and predict_byom read every source the preprocessors read (image folders, WebDataset
shards, Parquet, in an S3-compatible store too), and pred_type="prob" returns probabilities
for a model that ends in logits."""

from __future__ import annotations

import io
import os
import pathlib
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.configs import parse_compile_params
from dvml.exceptions import ArgumentError
from dvml.train.inference import output_probabilities
from dvml.train.predict import output_activation

LOGITS = "loss=CategoricalCrossentropy(from_logits=True), optimizer='adam', metrics=['accuracy']"


@pytest.mark.parametrize(
    ("compile_params", "expected"),
    [
        (LOGITS, "softmax"),
        ("loss=BinaryCrossentropy(from_logits=True), optimizer='adam'", "sigmoid"),
        ("loss=CategoricalCrossentropy(from_logits=False), optimizer='adam'", None),
        ("loss='categorical_crossentropy', optimizer='adam'", None),
        ("loss=CategoricalCrossentropy(label_smoothing=0.1), optimizer='adam'", None),
    ],
)
def test_output_activation_from_the_recorded_loss(compile_params: str, expected: Any) -> None:
    assert output_activation(parse_compile_params(compile_params)) == expected


def test_output_probabilities() -> None:
    logits = np.array([[-6.9, 12.7, 0.0], [1000.0, 0.0, -1000.0]])
    probs = output_probabilities(logits, "softmax")
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert np.all((probs >= 0) & (probs <= 1)) and probs[1, 0] == 1.0
    np.testing.assert_allclose(probs[0], np.exp(logits[0]) / np.exp(logits[0]).sum())
    np.testing.assert_allclose(output_probabilities(np.array([[0.0]]), "sigmoid"), [[0.5]])
    np.testing.assert_array_equal(output_probabilities(logits, None), logits)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _mean_color_model() -> tuple[str, list[np.ndarray]]:
    """Images (4, 3, 3) -> logits 10 x the mean of each channel: no activation, no training."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    layers = keras.layers
    model = keras.Sequential(
        [layers.InputLayer(input_shape=(4, 3, 3)), layers.GlobalAveragePooling2D(), layers.Dense(3)]
    )
    return model.to_json(), [np.eye(3, dtype=np.float32) * 10, np.zeros(3, np.float32)]


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _sources(root: pathlib.Path) -> dict[str, Any]:
    """The same 12 images as a class folder and as webdataset shards (without labels for
    some samples: prediction needs none)."""
    import webdataset as wds

    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, size=(12, 4, 3, 3), dtype=np.uint8)
    (root / "shards").mkdir(parents=True)
    with wds.ShardWriter(str(root / "shards" / "part-%04d.tar"), maxcount=5, verbose=0) as sink:
        for i, p in enumerate(pixels):
            sample = {"__key__": f"s{i:03d}", "png": _png(p)}
            if i % 2:
                sample["cls"] = i % 3
            sink.write(sample)
            folder = root / "folder" / ("abc"[i % 3])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"s{i:03d}.png").write_bytes(_png(p))
    logits = 10 * pixels.reshape(12, -1, 3).mean(axis=1) / 255.0
    return {"probs": _softmax(logits), "keys": [f"s{i:03d}" for i in range(12)]}


def _prob_table(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    out = {}
    for key, rows in frame.groupby("id"):
        rows = rows.sort_values("class_value")
        out[os.path.basename(str(key)).removesuffix(".png")] = rows["prob"].to_numpy()
    return out


@pytest.mark.cluster
@pytest.mark.tf
def test_predict_files_and_logits(
    cluster2: dvml.LocalCluster, tmp_path: pathlib.Path, s3_server: Any
) -> None:
    expected = _sources(tmp_path)
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        model_json, weights = _mean_color_model()
        arch = dvml.load_keras_model(model_json, weights=weights, registry=registry)
        summary = {"compile_params": LOGITS, "class_values": [0, 1, 2], "num_classes": 3,
                   "normalizing_const": 255.0, "dependent_varname": "label",
                   "image_size": [4, 3], "channels": 3, "x_shapes": [[4, 3, 3]]}  # fmt: skip
        registry.save_model("logits", arch, weights, summary)
        bucket = s3_server.bucket("predict")
        s3_server.upload(tmp_path / "shards", f"{bucket}/shards")
        sources = [
            str(tmp_path / "folder"),
            str(tmp_path / "shards" / "part-%04d.tar"),
            f"{bucket}/shards/part-{{0000..0002}}.tar",
        ]
        for source in sources:
            out = dvml.predict(
                "logits", source, pred_type="prob", registry=registry, client=cluster2.client,
                storage_options=s3_server.storage_options,
            ).compute(scheduler=cluster2.client)  # fmt: skip
            got = _prob_table(out)
            assert sorted(got) == expected["keys"], source
            for i, key in enumerate(expected["keys"]):
                # probabilities (the softmax of the logits), not the logits themselves
                np.testing.assert_allclose(got[key], expected["probs"][i], rtol=1e-5)
        # BYOM: image size from the architecture's input, from_logits given by the caller
        out = dvml.predict_byom(
            arch, str(tmp_path / "shards" / "part-%04d.tar"), from_logits=True,
            normalizing_const=255.0, registry=registry, client=cluster2.client,
        ).compute(scheduler=cluster2.client)  # fmt: skip
        ids = [f"part-{i // 5:04d}.tar/{key}" for i, key in enumerate(expected["keys"])]
        top = out.set_index("id").loc[ids]  # ShardWriter's maxcount=5: 3 shards
        np.testing.assert_allclose(top["prob"], expected["probs"].max(axis=1), rtol=1e-5)
        assert top["class_value"].tolist() == expected["probs"].argmax(axis=1).tolist()
    finally:
        registry.close()


@pytest.mark.cluster
@pytest.mark.tf
def test_predict_tables_from_files_and_urls(
    cluster2: dvml.LocalCluster, tmp_path: pathlib.Path, s3_server: Any
) -> None:
    """A table model predicts on every table source training_preprocessor reads: a Parquet
    file, a hive-partitioned Parquet folder, a folder of CSV files, and a Parquet URL on the
    object store (read by the workers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.helpers import keras

    layers = keras().layers
    model = keras().Sequential([layers.InputLayer(input_shape=(4,)), layers.Dense(3)])
    weights = [np.vstack([np.eye(3, dtype=np.float32), np.zeros((1, 3), np.float32)]),
               np.zeros(3, np.float32)]  # fmt: skip
    rng = np.random.default_rng(7)
    table = pd.DataFrame(rng.normal(size=(60, 4)).astype("float32"), columns=list("abcd"))
    table.insert(0, "id", np.arange(60))
    table["part"] = np.arange(60) % 3
    expected = _softmax(table[["a", "b", "c"]].to_numpy(np.float64))
    (tmp_path / "csv").mkdir()
    for k in range(3):
        table.iloc[k * 20 : (k + 1) * 20].to_csv(tmp_path / "csv" / f"rows-{k}.csv", index=False)
    table.to_parquet(tmp_path / "table.parquet")
    pq.write_to_dataset(
        pa.Table.from_pandas(table), str(tmp_path / "hive"), partition_cols=["part"]
    )
    bucket = s3_server.bucket("tables")
    s3_server.upload(tmp_path / "table.parquet", f"{bucket}/table.parquet")
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        arch = dvml.load_keras_model(model.to_json(), weights=weights, registry=registry)
        summary = {"compile_params": LOGITS, "class_values": [0, 1, 2], "num_classes": 3,
                   "normalizing_const": 1.0, "dependent_varname": "label",
                   "x_shapes": [[4]]}  # fmt: skip
        registry.save_model("table_logits", arch, weights, summary)
        sources = [str(tmp_path / "table.parquet"), str(tmp_path / "hive"),
                   str(tmp_path / "csv"), f"{bucket}/table.parquet"]  # fmt: skip
        for source in sources:
            out = dvml.predict(
                "table_logits", source, "id", [["a", "b", "c", "d"]], pred_type="prob",
                registry=registry, client=cluster2.client,
                storage_options=s3_server.storage_options,
            ).compute(scheduler=cluster2.client)  # fmt: skip
            got = out.pivot(index="id", columns="class_value", values="prob").sort_index()
            assert got.index.tolist() == list(range(60)), source
            np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-5, err_msg=source)
    finally:
        registry.close()


@pytest.mark.cluster
@pytest.mark.tf
def test_predicted_shard_ids_are_unique_when_keys_repeat_across_shards(
    cluster2: dvml.LocalCluster, tmp_path: pathlib.Path
) -> None:
    """Issue 42 item 3: webdataset's keys are per shard (two shards with keys s000..s002 give
    6 samples and 3 distinct keys); the ids are "<shard file name>/<key>", each paired with
    its own sample's prediction. Two shards with one file name are refused."""
    import webdataset as wds

    rng = np.random.default_rng(11)
    pixels = rng.integers(0, 256, size=(2, 3, 4, 3, 3), dtype=np.uint8)
    expected = {}
    for s in range(2):
        with wds.TarWriter(str(tmp_path / f"part-{s}.tar")) as sink:
            for k in range(3):
                sink.write({"__key__": f"s{k:03d}", "png": _png(pixels[s, k])})
                logits = 10 * pixels[s, k].reshape(-1, 3).mean(axis=0) / 255.0
                expected[f"part-{s}.tar/s{k:03d}"] = int(np.argmax(logits))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "part-0.tar").write_bytes((tmp_path / "part-0.tar").read_bytes())
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        model_json, weights = _mean_color_model()
        arch = dvml.load_keras_model(model_json, weights=weights, registry=registry)
        out = dvml.predict_byom(
            arch, str(tmp_path / "part-{0..1}.tar"), normalizing_const=255.0,
            registry=registry, client=cluster2.client,
        ).compute(scheduler=cluster2.client)  # fmt: skip
        assert len(out) == 6 and out["id"].is_unique, out["id"].tolist()
        assert dict(zip(out["id"], out["class_value"], strict=True)) == expected
        with pytest.raises(ArgumentError, match=r"Two shards share a file name.*other"):
            dvml.predict_byom(
                arch, [str(tmp_path / "part-0.tar"), str(tmp_path / "other" / "part-0.tar")],
                normalizing_const=255.0, registry=registry, client=cluster2.client,
            )  # fmt: skip
    finally:
        registry.close()
