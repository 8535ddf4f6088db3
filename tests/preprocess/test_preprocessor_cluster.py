"""The preprocessors on a real LocalCluster: every source kind, every distribution rule kind.

Each dataset is checked object by object: the vineyard instance of every member (read through
a plain vineyard client on the owning worker), its stored type (the compact layout by default:
uint8 sources as uint8, labels as class indices), the numbers it holds (compared with arrays
the test computes itself from the source), the balance of rows over the workers, and the
global objects. Every test drops what it created, and checks that the vineyardds hold what they held
before.
"""

from __future__ import annotations

import io
import pathlib
import tarfile
from collections.abc import Sequence
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from PIL import Image

import dvml
from dvml.exceptions import DataError, DatasetNotFoundError
from tests.helpers import on_worker, snapshot

pytestmark = pytest.mark.cluster

TENSOR = "vineyard::Tensor<float>"


def tensor_type(dtype: str) -> str:
    """The vineyard typename of a tensor of numpy ``dtype``."""
    return TENSOR if dtype == "float32" else f"vineyard::Tensor<{dtype}>"


# -- worker-side probes (top-level, so they pickle by reference) ---------------------------


def read_objects(ids: Sequence[int]) -> dict[str, Any]:
    """On a worker: for each id, the instance its metadata names, its type and its values."""
    import vineyard

    client = vineyard.connect()  # shared connection: never closed (see tests.helpers)
    found = []
    for raw in ids:
        oid = vineyard.ObjectID(int(raw))
        meta = client.get_meta(oid)
        found.append(
            {
                "instance_id": int(meta.instance_id),
                "typename": meta.typename,
                "value": np.array(client.get(oid)),  # a copy: views cannot cross processes
            }
        )
    return {"local_instance": int(client.instance_id), "objects": found}


def global_members(oid: int) -> dict[str, Any]:
    """On a worker: typename, globalness and members (id, instance) of a global object."""
    import vineyard

    client = vineyard.connect()  # shared connection: never closed (see tests.helpers)
    meta = client.get_meta(vineyard.ObjectID(int(oid)))
    members = {
        key: (int(value.id), int(value.instance_id))
        for key, value in meta.items()
        if isinstance(value, vineyard.ObjectMeta)
    }
    return {"typename": meta.typename, "global": bool(meta.isglobal), "members": members}


# -- client-side helpers --------------------------------------------------------------------


def worker_by_instance(cluster: dvml.LocalCluster) -> dict[int, dvml.WorkerInfo]:
    return {w.vineyard_instance_id: w for w in cluster.refresh()}


def sorted_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows in lexicographic order: two matrices hold the same multiset of rows iff equal."""
    return matrix[np.lexsort(matrix.T[::-1])] if len(matrix) else matrix


def as_rows(xs: Sequence[np.ndarray], y: np.ndarray) -> np.ndarray:
    return np.hstack([np.asarray(x).reshape(len(y), -1) for x in xs] + [y])


def expected_one_hot(labels: Sequence[Any], class_values: list[Any], width: int) -> np.ndarray:
    out = np.zeros((len(labels), width), dtype=np.float32)
    index = {v: i for i, v in enumerate(class_values)}
    for row, label in enumerate(labels):
        out[row, index[label]] = 1.0
    return out


def normalized(x: np.ndarray, const: float) -> np.ndarray:
    return np.asarray(x).astype(np.float32) / np.float32(const)


def read_dataset(
    cluster: dvml.LocalCluster, ds: dvml.Dataset, types: dict[str, str] | None = None
) -> dict[str, Any]:
    """Read every member of ``ds`` on the worker that owns it, checking where it lives and
    that its vineyard type is ``types[field]`` (default: every field a float32 tensor).

    Returns the fields concatenated in buffer order and the rows each worker holds.
    """
    owners = worker_by_instance(cluster)
    fields = sorted(ds.layout["fields"])
    types = types or {f: TENSOR for f in fields}
    parts: dict[str, list[np.ndarray]] = {f: [] for f in fields}
    rows: dict[str, int] = {}
    for b in ds.layout["buffers"]:
        owner = owners[b["instance_id"]]
        assert b["worker_name"] == owner.name and b["host"] == owner.host
        ids = [b["fields"][f]["id"] for f in fields]
        answer = on_worker(cluster, owner, read_objects, ids)
        assert answer["local_instance"] == b["instance_id"]
        for field, obj in zip(fields, answer["objects"], strict=True):
            # The metadata of every member names the instance of the worker that owns it.
            assert obj["instance_id"] == owner.vineyard_instance_id
            assert obj["typename"] == types[field], (field, obj["typename"])
            assert list(obj["value"].shape) == b["fields"][field]["shape"]
            assert len(obj["value"]) == b["rows"]
            parts[field].append(obj["value"])
        rows[owner.name] = rows.get(owner.name, 0) + b["rows"]
    return {"fields": {f: np.concatenate(v) for f, v in parts.items()}, "rows": rows}


def check_dataset(
    cluster: dvml.LocalCluster,
    ds: dvml.Dataset,
    targets: Sequence[str],
    xs: Sequence[np.ndarray],
    y: np.ndarray,
    x_dtypes: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Placement, balance, global objects, the stored layout and a round trip of the numbers
    of ``ds``.

    ``xs`` and ``y`` are the rows as the model reads them (x float32 and normalized, y
    one-hot). ``ds`` is in the default, compact layout: each x stored as ``x_dtypes`` (default
    float32 each; "uint8" for a uint8 source, kept raw), y as uint8 class indices. The stored
    values are decoded here (uint8 x divided by ``normalizing_const``, indices one-hot) and
    returned as ``fields``; the raw ones as ``stored``.
    """
    x_dtypes = list(x_dtypes or ["float32"] * len(xs))
    assert ds.summary["storage"] == {"compact": True, "x_dtypes": x_dtypes, "y": "index",
                                     "y_dtype": "uint8"}  # fmt: skip
    types = {f"x_{i}": tensor_type(d) for i, d in enumerate(x_dtypes)} | {"y": tensor_type("uint8")}
    owners = worker_by_instance(cluster)
    by_name = {w.name: w for w in owners.values()}
    # The buffers live exactly on the resolved workers' instances.
    instances = {b["instance_id"] for b in ds.layout["buffers"]}
    assert instances == {by_name[t].vineyard_instance_id for t in targets}
    resolved = ds.summary["distribution_rules"]["resolved"]
    assert sorted(r["name"] for r in resolved) == sorted(targets)

    content = read_dataset(cluster, ds, types)
    # Balance: every target holds rows, and no two differ by more than one.
    assert set(content["rows"]) == set(targets)
    counts = list(content["rows"].values())
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == len(y) == ds.rows == ds.summary["rows"]
    assert ds.summary["rows_per_worker"] == content["rows"]

    # The numbers: the same multiset of (x, y) rows as computed here from the source.
    stored = content["stored"] = content["fields"]
    const, width = np.float32(ds.summary["normalizing_const"]), y.shape[1]
    assert stored["y"].ndim == 1 and int(stored["y"].max()) < len(ds.summary["class_values"])
    fields = content["fields"] = {
        **{f"x_{i}": stored[f"x_{i}"].astype(np.float32) / const if d == "uint8"
           else stored[f"x_{i}"] for i, d in enumerate(x_dtypes)},
        "y": np.eye(width, dtype=np.float32)[stored["y"].astype(np.int64)],
    }  # fmt: skip
    got = as_rows([fields[f"x_{i}"] for i in range(len(xs))], fields["y"])
    want = as_rows([x.astype(np.float32) for x in xs], y)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(sorted_rows(got), sorted_rows(want))
    for i, x in enumerate(xs):
        assert list(fields[f"x_{i}"].shape[1:]) == list(x.shape[1:]) == ds.summary["x_shapes"][i]
        assert ds.layout["fields"][f"x_{i}"]["shape"] == [len(y), *x.shape[1:]]

    # The root and the per-field GlobalTensors list the same members, on the same instances.
    reader = owners[min(owners)]
    root = on_worker(cluster, reader, global_members, ds.id)
    assert root["typename"] == "dvml::Dataset" and root["global"]
    expected = {
        f"{field}-{i}": (obj["id"], b["instance_id"])
        for i, b in enumerate(ds.layout["buffers"])
        for field, obj in b["fields"].items()
    }
    assert root["members"] == expected
    for field, gid in ds.global_tensors.items():
        gt = on_worker(cluster, reader, global_members, gid)
        assert gt["typename"] == "vineyard::GlobalTensor" and gt["global"]
        assert gt["members"] == {
            f"partitions_-{i}": (b["fields"][field]["id"], b["instance_id"])
            for i, b in enumerate(ds.layout["buffers"])
        }
    return content


# -- sources ----------------------------------------------------------------------------------


def test_pandas_array_column_all_workers(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    """A pandas DataFrame with an array-valued column; int labels, num_classes padding."""
    rng = np.random.default_rng(1)
    n = 103  # not a multiple of 4: one worker holds a row fewer
    cells = [rng.integers(0, 256, size=(2, 3)) for _ in range(n)]
    labels = rng.choice([7, 3, 5], size=n)
    frame = pd.DataFrame({"pixels": cells, "digit": labels})
    clean_vineyard4.append("pp_pandas")
    ds = dvml.training_preprocessor(
        frame, y="digit", x="pixels", normalizing_const=255.0, num_classes=5,
        distribution_rules="all_workers", name="pp_pandas", client=cluster4.client,
    )  # fmt: skip
    s = ds.summary
    assert s["class_values"] == [3, 5, 7] and s["num_classes"] == 5 and s["y_shape"] == [5]
    assert s["dependent_vartype"] == "int" and s["independent_varname"] == [["pixels"]]
    assert s["normalizing_const"] == 255.0 and s["x_shapes"] == [[2, 3]]
    y = expected_one_hot(labels.tolist(), [3, 5, 7], 5)
    content = check_dataset(
        cluster4, ds, ["worker-0", "worker-1", "worker-2", "worker-3"],
        [normalized(np.stack(cells), 255.0)], y,
    )  # fmt: skip
    assert not content["fields"]["y"][:, 3:].any()  # the padded classes are never hot
    assert sorted(content["rows"].values()) == [25, 26, 26, 26]


def test_dask_dataframe_columns_as_one_input_gpu_workers(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    """Several numeric columns of a Dask DataFrame as one input; str labels; GPU workers."""
    rng = np.random.default_rng(2)
    n = 80
    frame = pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.integers(-50, 50, size=n),
            "c": rng.normal(size=n).astype(np.float32),
            "animal": rng.choice(["emu", "cat", "dog"], size=n),
        }
    )
    ddf = dd.from_pandas(frame, npartitions=5)
    clean_vineyard4.append("pp_dask_df")
    ds = dvml.training_preprocessor(
        ddf, y="animal", x=[["a", "b", "c"]], normalizing_const=2.0,
        distribution_rules="gpu_workers", name="pp_dask_df", client=cluster4.client,
    )  # fmt: skip
    assert ds.summary["class_values"] == ["cat", "dog", "emu"]
    assert ds.summary["dependent_vartype"] == "str"
    assert ds.summary["distribution_rules"]["kind"] == "gpu_workers"
    x = frame[["a", "b", "c"]].to_numpy(dtype=np.float64)
    y = expected_one_hot(frame["animal"].tolist(), ["cat", "dog", "emu"], 3)
    check_dataset(cluster4, ds, ["worker-0", "worker-1"], [normalized(x, 2.0)], y)


def test_multi_input_bool_labels_list_of_hosts(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    """``x=["a", "b"]``: two model inputs; bool labels; a list of the two hosts."""
    rng = np.random.default_rng(3)
    n = 50
    frame = pd.DataFrame(
        {"a": rng.normal(size=n), "b": rng.integers(0, 9, size=n), "ok": rng.random(n) > 0.5}
    )
    clean_vineyard4.append("pp_multi")
    ds = dvml.training_preprocessor(
        frame, y="ok", x=["a", "b"], distribution_rules=["host-0", "host-1"], name="pp_multi",
        client=cluster4.client,
    )  # fmt: skip
    assert ds.summary["class_values"] == [False, True]
    assert ds.summary["dependent_vartype"] == "bool"
    assert ds.summary["distribution_rules"]["given"] == ["host-0", "host-1"]
    assert sorted(ds.layout["fields"]) == ["x_0", "x_1", "y"]
    xs = [normalized(frame[["a"]].to_numpy(), 1.0), normalized(frame[["b"]].to_numpy(), 1.0)]
    y = expected_one_hot(frame["ok"].tolist(), [False, True], 2)
    check_dataset(cluster4, ds, ["worker-0", "worker-1", "worker-2", "worker-3"], xs, y)


def test_parquet_path_list_of_worker_names(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path
) -> None:
    rng = np.random.default_rng(4)
    n = 61
    frame = pd.DataFrame(
        {"f0": rng.normal(size=n), "f1": rng.normal(size=n), "label": rng.integers(0, 4, n)}
    )
    path = tmp_path / "train.parquet"
    frame.to_parquet(path)
    clean_vineyard4.append("pp_parquet")
    ds = dvml.training_preprocessor(
        str(path), y="label", x=[["f0", "f1"]], normalizing_const=0.5,
        distribution_rules=["worker-1", "worker-3"], name="pp_parquet", client=cluster4.client,
    )  # fmt: skip
    classes = sorted(set(frame["label"].tolist()))
    assert ds.summary["class_values"] == classes
    assert ds.summary["source_table"] == str(path)
    y = expected_one_hot(frame["label"].tolist(), classes, len(classes))
    x = normalized(frame[["f0", "f1"]].to_numpy(), 0.5)
    check_dataset(cluster4, ds, ["worker-1", "worker-3"], [x], y)


def test_csv_path_gpu_configuration_table(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path
) -> None:
    rng = np.random.default_rng(5)
    n = 40
    frame = pd.DataFrame(
        {
            "p": rng.integers(0, 256, n),
            "q": rng.integers(0, 256, n),
            "kind": rng.choice(["x", "y"], n),
        }
    )
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    gpus = dvml.gpu_configuration(cluster4.client)
    assert sorted(gpus["worker_name"]) == ["worker-0", "worker-1"]
    clean_vineyard4.append("pp_csv")
    ds = dvml.training_preprocessor(
        str(path), y="kind", x=[["p", "q"]], normalizing_const=255,
        distribution_rules=gpus, name="pp_csv", client=cluster4.client,
    )  # fmt: skip
    assert ds.summary["distribution_rules"]["kind"] == "table"
    y = expected_one_hot(frame["kind"].tolist(), ["x", "y"], 2)
    x = normalized(frame[["p", "q"]].to_numpy(), 255.0)
    check_dataset(cluster4, ds, ["worker-0", "worker-1"], [x], y)


def test_dict_of_dask_arrays_one_worker(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    n = 90
    x = da.random.default_rng(6).random((n, 4, 2), chunks=(25, 4, 2))
    labels = da.random.default_rng(7).integers(10, 13, size=n, chunks=25)
    x_np, labels_np = x.compute(), labels.compute()  # the expected values, computed here
    clean_vineyard4.append("pp_arrays")
    ds = dvml.training_preprocessor(
        {"x": x, "label": labels}, y="label", x="x", normalizing_const=4.0,
        distribution_rules="worker-2", name="pp_arrays", client=cluster4.client,
    )  # fmt: skip
    classes = sorted(set(labels_np.tolist()))
    assert ds.summary["class_values"] == classes
    y = expected_one_hot(labels_np.tolist(), classes, len(classes))
    check_dataset(cluster4, ds, ["worker-2"], [normalized(x_np, 4.0)], y)


def test_persisted_sources_in_small_batched_blocks(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    """Sources already in the workers' memory (``persist``): their graphs hold futures,
    which the fused prepare tasks must leave as they are; 60 small blocks of arrays are
    prepared in batches (a few per task), a frame's 12 partitions one per task."""
    client = cluster4.client
    rng = np.random.default_rng(8)
    x_np, labels_np = rng.random((600, 3)), rng.integers(0, 4, size=600)
    x, labels = client.persist([da.from_array(x_np, chunks=(10, 3)),
                                da.from_array(labels_np, chunks=10)])  # fmt: skip
    frame = pd.DataFrame({"a": x_np[:, 0], "b": x_np[:, 1], "label": labels_np})
    ddf = client.persist(dd.from_pandas(frame, npartitions=12))
    clean_vineyard4.extend(["pp_persisted_arrays", "pp_persisted_frame"])
    y = expected_one_hot(labels_np.tolist(), [0, 1, 2, 3], 4)
    workers = ["worker-0", "worker-1", "worker-2", "worker-3"]
    ds = dvml.training_preprocessor(
        {"x": x, "label": labels}, y="label", x="x", name="pp_persisted_arrays", client=client
    )
    check_dataset(cluster4, ds, workers, [x_np], y)
    ds = dvml.training_preprocessor(
        ddf, y="label", x=[["a", "b"]], name="pp_persisted_frame", client=client
    )
    check_dataset(cluster4, ds, workers, [x_np[:, :2]], y)


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")  # lossless: pixels come back exactly
    return buf.getvalue()


def test_image_folder_one_host(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path
) -> None:
    rng = np.random.default_rng(8)
    images, labels = [], []
    for label in ["cow", "ant", "bee"]:
        (tmp_path / label).mkdir()
        for i in range(5):
            pixels = rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)  # height 6, width 5
            (tmp_path / label / f"{i}.png").write_bytes(_png(pixels))
            images.append(pixels)
            labels.append(label)
    clean_vineyard4.append("pp_images")
    ds = dvml.training_preprocessor(
        str(tmp_path), normalizing_const=255.0, image_size=(6, 5), distribution_rules=["host-1"],
        name="pp_images", client=cluster4.client,
    )  # fmt: skip
    assert ds.summary["class_values"] == ["ant", "bee", "cow"]
    assert ds.summary["image_size"] == [6, 5] and ds.summary["channels"] == 3
    y = expected_one_hot(labels, ["ant", "bee", "cow"], 3)
    check_dataset(cluster4, ds, ["worker-2", "worker-3"], [normalized(np.stack(images), 255.0)], y,
                  x_dtypes=["uint8"])  # fmt: skip


def test_webdataset_tar_shards(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path
) -> None:
    rng = np.random.default_rng(9)
    images, labels = [], []
    for shard in range(4):
        with tarfile.open(tmp_path / f"train-{shard:04d}.tar", "w") as tar:
            for i in range(5):
                pixels = rng.integers(0, 256, size=(4, 3), dtype=np.uint8)  # grey
                label = int(rng.integers(0, 3))  # .cls decodes as an int, as in webdataset
                for ext, data in (("png", _png(pixels)), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{shard:04d}_{i:02d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                images.append(pixels[..., None])
                labels.append(label)
    classes = sorted(set(labels))
    clean_vineyard4.append("pp_shards")
    ds = dvml.training_preprocessor(
        str(tmp_path / "train-{0000..0003}.tar"), normalizing_const=255.0, image_size=(4, 3),
        channels=1, num_classes=4, name="pp_shards", client=cluster4.client,
    )  # fmt: skip
    assert ds.summary["class_values"] == classes and ds.summary["num_classes"] == 4
    y = expected_one_hot(labels, classes, 4)
    check_dataset(
        cluster4, ds, ["worker-0", "worker-1", "worker-2", "worker-3"],
        [normalized(np.stack(images), 255.0)], y, x_dtypes=["uint8"],
    )  # fmt: skip


# -- data where users keep it: an S3-compatible store, files written by the real libraries ---


def _webdataset_shards(root: pathlib.Path, n: int, seed: int) -> tuple[list[np.ndarray], list[int]]:
    """Shards written by webdataset's own ShardWriter (``shard-%06d.tar``, 7 samples each):
    a PNG, a segmentation PNG (a second image), an int class and a caption per sample."""
    import webdataset as wds

    rng = np.random.default_rng(seed)
    images, labels = [], []
    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=7, verbose=0) as sink:
        for i in range(n):
            pixels = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
            label = int(rng.integers(0, 12))  # 10 and 11 must sort after 2
            sample = {"__key__": f"sample{i:05d}", "png": _png(pixels), "cls": label,
                      "seg.png": _png(255 - pixels), "txt": f"caption {i}"}  # fmt: skip
            sink.write(sample)
            images.append(pixels)
            labels.append(label)
    return images, labels


def test_webdataset_shards_from_s3(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path, s3_server: Any
) -> None:
    images, labels = _webdataset_shards(tmp_path / "wds", 30, seed=21)
    assert len(list((tmp_path / "wds").glob("shard-*.tar"))) == 5
    bucket = s3_server.bucket("wds")
    s3_server.upload(tmp_path / "wds", f"{bucket}/train")
    pattern = f"{bucket}/train/shard-%06d.tar"
    options = s3_server.storage_options
    with pytest.raises(DataError, match=r"several images: \['png', 'seg.png'\]. Pass image_ext="):
        dvml.training_preprocessor(pattern, image_size=(5, 4), name="pp_wds",
                                   storage_options=options, client=cluster4.client)  # fmt: skip
    clean_vineyard4.append("pp_wds")
    ds = dvml.training_preprocessor(
        pattern, image_size=(5, 4), image_ext="png", normalizing_const=255.0, name="pp_wds",
        storage_options=options, client=cluster4.client,
    )  # fmt: skip
    classes = sorted(set(labels))
    assert ds.summary["class_values"] == classes and all(type(c) is int for c in classes)
    assert ds.summary["source_table"] == pattern and "secret" not in str(ds.summary)
    assert ds.summary["image_ext"] == "png" and ds.summary["label_ext"] == "cls"
    # Every (label, pixels) pair, as webdataset wrote it.
    y = expected_one_hot(labels, classes, len(classes))
    check_dataset(
        cluster4, ds, ["worker-0", "worker-1", "worker-2", "worker-3"],
        [normalized(np.stack(images), 255.0)], y, x_dtypes=["uint8"],
    )  # fmt: skip

    # A list of shards (one gzipped, named as webdataset's own seed shards are) and the
    # training set's image_ext, reused by the validation set.
    import gzip

    local = sorted((tmp_path / "wds").glob("shard-*.tar"))
    (tmp_path / "seed-0.tgz").write_bytes(gzip.compress(local[0].read_bytes()))
    s3_server.upload(tmp_path / "seed-0.tgz", f"{bucket}/val/seed-0.tgz")
    clean_vineyard4.append("pp_wds_val")
    val = dvml.validation_preprocessor(
        [f"{bucket}/val/seed-0.tgz", f"{bucket}/train/shard-000001.tar"], training=ds,
        name="pp_wds_val", storage_options=options, client=cluster4.client,
    )  # fmt: skip
    assert val.rows == 14


def test_tables_and_images_from_s3(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path, s3_server: Any
) -> None:
    import dask
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(22)
    frame = pd.DataFrame({"a": rng.normal(size=40), "b": rng.normal(size=40),
                          "label": rng.integers(0, 3, 40)})  # fmt: skip
    bucket = s3_server.bucket("tables")
    # A hive-partitioned data set written by pyarrow; the label lives in the directory names.
    pq.write_to_dataset(pa.Table.from_pandas(frame), tmp_path / "hive", partition_cols=["label"])
    s3_server.upload(tmp_path / "hive", f"{bucket}/hive")
    (tmp_path / "csvs").mkdir()
    for i, part in enumerate(np.array_split(frame, 3)):
        part.to_csv(tmp_path / "csvs" / f"part-{i}.csv", index=False)
    s3_server.upload(tmp_path / "csvs", f"{bucket}/csvs")
    want_x = frame[["a", "b"]].to_numpy()
    want_y = expected_one_hot(frame["label"].tolist(), [0, 1, 2], 3)
    clean_vineyard4.extend(["pp_s3_hive", "pp_s3_csv"])
    # storage options from the configuration, as a job file gets them
    with dask.config.set({"dvml.storage-options": s3_server.storage_options}):
        hive = dvml.training_preprocessor(
            f"{bucket}/hive", y="label", x=[["a", "b"]], name="pp_s3_hive",
            distribution_rules=["host-0"], client=cluster4.client,
        )  # fmt: skip
    assert hive.summary["class_values"] == [0, 1, 2]
    check_dataset(cluster4, hive, ["worker-0", "worker-1"], [want_x], want_y)
    csv = dvml.training_preprocessor(
        f"{bucket}/csvs", y="label", x=[["a", "b"]], name="pp_s3_csv",
        storage_options=s3_server.storage_options, client=cluster4.client,
    )  # fmt: skip
    check_dataset(cluster4, csv, ["worker-0", "worker-1", "worker-2", "worker-3"],
                  [want_x], want_y)  # fmt: skip

    # Class folders of images in the store.
    pixels = rng.integers(0, 256, size=(6, 6, 2, 3), dtype=np.uint8)
    for i, label in enumerate(["cat", "cat", "dog", "dog", "eel", "eel"]):
        path = tmp_path / "imgs" / label / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_png(pixels[i]))
    s3_server.upload(tmp_path / "imgs", f"{bucket}/imgs")
    clean_vineyard4.append("pp_s3_imgs")
    imgs = dvml.training_preprocessor(
        f"{bucket}/imgs", image_size=(6, 2), name="pp_s3_imgs", distribution_rules=["worker-3"],
        storage_options=s3_server.storage_options, client=cluster4.client,
    )  # fmt: skip
    assert imgs.summary["class_values"] == ["cat", "dog", "eel"]
    labels = ["cat", "cat", "dog", "dog", "eel", "eel"]
    check_dataset(cluster4, imgs, ["worker-3"], [pixels.astype(np.float32)],
                  expected_one_hot(labels, ["cat", "dog", "eel"], 3),
                  x_dtypes=["uint8"])  # fmt: skip


def test_a_store_that_dies_during_a_pack_fails_it_once_naming_the_url(
    cluster4: dvml.LocalCluster, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 item 8: the S3 server is killed once the shards are listed, before they are
    read. The pack fails at the first read that fails, with one DataError naming the URL and
    dvml.storage-timeout (it took 141 s and raised a bare botocore error while every read
    task logged its own "Compute Failed"); the other reads are cancelled; nothing published."""
    import os
    import signal
    import time

    from dvml.preprocess import sources
    from tests.helpers.s3 import running_s3_server

    _webdataset_shards(tmp_path / "wds", 7 * 24, seed=8)  # 24 shards, one read task each
    with running_s3_server() as server:
        bucket = server.bucket("dies")
        server.upload(tmp_path / "wds", f"{bucket}/train")
        located = sources.locate

        def locate_then_kill(*args: Any, **kwargs: Any) -> Any:
            where = located(*args, **kwargs)
            os.kill(server.pid, signal.SIGKILL)  # the store dies as the reads begin
            return where

        monkeypatch.setattr(sources, "locate", locate_then_kill)
        before = snapshot(cluster4)
        logs = cluster4.client.get_worker_logs()
        failed_before = sum("Compute Failed" in m for w in logs.values() for _, m in w)
        start = time.monotonic()
        with (
            dask.config.set({"dvml.storage-timeout": 5}),
            pytest.raises(DataError) as e,
        ):
            dvml.training_preprocessor(
                f"{bucket}/train/shard-%06d.tar", image_size=(5, 4), image_ext="png",
                name="pp_store_dies", storage_options=server.storage_options,
                client=cluster4.client,
            )  # fmt: skip
        elapsed = time.monotonic() - start
    message = str(e.value)
    assert f"{bucket}/train/shard-0000" in message and "did not answer within 5 s" in message
    assert "dvml.storage-timeout" in message and "nothing was published" in message
    assert elapsed < 5 + 30, elapsed  # one read's bound plus the pack's own start, not 24
    assert not dvml.datasets.exists("pp_store_dies", client=cluster4.client)
    assert snapshot(cluster4) == before  # no object of the failed pack is left
    logs = cluster4.client.get_worker_logs()
    failed = sum("Compute Failed" in m for w in logs.values() for _, m in w) - failed_before
    assert failed <= 4, failed  # the reads running when the first failed (4 threads), at most


def test_store_errors_name_the_cause(cluster4: dvml.LocalCluster, s3_server: Any) -> None:
    bucket = s3_server.bucket("errors")
    fs = s3_server.filesystem()
    with fs.open(f"{bucket}/t.csv".removeprefix("s3://"), "wb") as f:
        f.write(b"x,y\n1,2\n")
    wrong = {**s3_server.storage_options, "secret": "not-the-secret"}
    with pytest.raises(DataError, match=r"refused access.*credentials are wrong") as e:
        dvml.training_preprocessor(f"{bucket}/t.csv", y="y", x="x", name="pp_err",
                                   storage_options=wrong, client=cluster4.client)  # fmt: skip
    assert "not-the-secret" not in str(e.value) and "Check the path" not in str(e.value)
    with pytest.raises(DataError, match=r"The bucket 'no-bucket' does not exist"):
        dvml.training_preprocessor("s3://no-bucket/t.parquet", y="y", x="x", name="pp_err",
                                   storage_options=s3_server.storage_options,
                                   client=cluster4.client)  # fmt: skip
    with pytest.raises(DataError, match=r"Cannot tell what the source folder holds.*\.txt"):
        fs.pipe(f"{bucket}/notes/a.txt".removeprefix("s3://"), b"hello")
        dvml.training_preprocessor(f"{bucket}/notes", y="y", x="x", name="pp_err",
                                   storage_options=s3_server.storage_options,
                                   client=cluster4.client)  # fmt: skip


def test_local_directories_by_content(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.DataFrame({"a": np.arange(12.0), "label": ["x", "y", "z"] * 4,
                          "part": np.repeat([0, 1, 2], 4)})  # fmt: skip
    pq.write_to_dataset(pa.Table.from_pandas(frame), tmp_path / "hive", partition_cols=["part"])
    clean_vineyard4.append("pp_hive")
    # the partition column is kept, and usable as x
    ds = dvml.training_preprocessor(
        str(tmp_path / "hive"), y="label", x=[["a", "part"]], name="pp_hive",
        distribution_rules=["worker-1"], client=cluster4.client,
    )  # fmt: skip
    check_dataset(cluster4, ds, ["worker-1"], [frame[["a", "part"]].to_numpy()],
                  expected_one_hot(frame["label"].tolist(), ["x", "y", "z"], 3))  # fmt: skip


def test_compact_storage_uint8_and_class_indices(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str], tmp_path: pathlib.Path
) -> None:
    """Compact storage is the default (no compact= argument): a plain vineyard client reads
    uint8 pixels and class indices; a model evaluates the same on the compact and the float32
    (compact=False) packing of the same shards."""
    import json as json_

    rng = np.random.default_rng(31)
    images, labels = [], []
    with tarfile.open(tmp_path / "c-0.tar", "w") as tar:
        for i in range(24):
            pixels = rng.integers(0, 256, size=(4, 3, 3), dtype=np.uint8)
            label = int(rng.integers(0, 4))
            for ext, data in (("png", _png(pixels)), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"k{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            images.append(pixels)
            labels.append(label)
    clean_vineyard4.extend(["pp_compact", "pp_float", "pp_compact_val"])
    kwargs = {"image_size": (4, 3), "normalizing_const": 255.0, "num_classes": 6,
              "distribution_rules": ["worker-0", "worker-2"],
              "client": cluster4.client}  # fmt: skip
    compact = dvml.training_preprocessor(str(tmp_path / "c-0.tar"), name="pp_compact", **kwargs)
    plain = dvml.training_preprocessor(str(tmp_path / "c-0.tar"), name="pp_float",
                                       compact=False, **kwargs)  # fmt: skip
    assert compact.summary["storage"] == {"compact": True, "x_dtypes": ["uint8"], "y": "index",
                                          "y_dtype": "uint8"}  # fmt: skip
    assert plain.summary["storage"] == {"compact": False, "y": "one_hot"}
    assert compact.summary["y_shape"] == [6] == plain.summary["y_shape"]

    owners = worker_by_instance(cluster4)
    got_x, got_y, nbytes = [], [], 0
    for b in compact.layout["buffers"]:
        ids = [b["fields"]["x_0"]["id"], b["fields"]["y"]["id"]]
        answer = on_worker(cluster4, owners[b["instance_id"]], read_objects, ids)
        x_obj, y_obj = answer["objects"]
        assert x_obj["typename"] == "vineyard::Tensor<uint8>" and x_obj["value"].dtype == np.uint8
        assert y_obj["typename"] == "vineyard::Tensor<uint8>" and y_obj["value"].ndim == 1
        got_x.append(x_obj["value"])
        got_y.append(y_obj["value"])
        nbytes += sum(f["nbytes"] for f in b["fields"].values())
    classes = compact.summary["class_values"]
    want = as_rows([np.stack(images)], np.array([[classes.index(v)] for v in labels]))
    got = as_rows([np.concatenate(got_x)], np.concatenate(got_y)[:, None])
    np.testing.assert_array_equal(sorted_rows(got), sorted_rows(want))
    assert nbytes == 24 * (4 * 3 * 3 + 1)  # the pixels and one byte of label a row

    # A validation set is stored as its training set is.
    val = dvml.validation_preprocessor(str(tmp_path / "c-0.tar"), training=compact,
                                       name="pp_compact_val", client=cluster4.client)  # fmt: skip
    assert val.summary["storage"]["compact"] is True

    # The readers (dvml.resolve) turn both into the same tensors: the same loss and accuracy.
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        import os

        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        import tf_keras as keras

        layers = keras.layers
        model = keras.Sequential([layers.InputLayer(input_shape=(4, 3, 3)), layers.Flatten(),
                                  layers.Dense(6, activation="softmax")])  # fmt: skip
        weights = [np.random.default_rng(1).normal(size=(36, 6)).astype(np.float32),
                   np.zeros(6, np.float32)]  # fmt: skip
        arch = dvml.load_keras_model(model.to_json(), weights=weights, registry=registry)
        summary = {"compile_params": "loss='categorical_crossentropy', optimizer='adam', "
                   "metrics=['accuracy']", "class_values": classes, "num_classes": 6,
                   "normalizing_const": 255.0, "dependent_varname": "label",
                   "metrics_type": ["accuracy"]}  # fmt: skip
        registry.save_model("compact_probe", arch, weights, json_.loads(json_.dumps(summary)))
        on_compact = dvml.evaluate("compact_probe", "pp_compact", registry=registry,
                                   client=cluster4.client)  # fmt: skip
        on_plain = dvml.evaluate("compact_probe", "pp_float", registry=registry,
                                 client=cluster4.client)  # fmt: skip
        assert on_compact["rows"] == on_plain["rows"] == 24
        assert on_compact["loss"] == pytest.approx(on_plain["loss"], rel=1e-5)
        assert on_compact["metric"] == pytest.approx(on_plain["metric"])
    finally:
        registry.close()


# -- validation sets ----------------------------------------------------------------------------


def test_validation_reuses_training_classes_and_refuses_unseen_labels(
    cluster4: dvml.LocalCluster, clean_vineyard4: list[str]
) -> None:
    rng = np.random.default_rng(10)
    train = pd.DataFrame(
        {"v": [rng.normal(size=3) for _ in range(40)], "c": rng.choice(["a", "b", "c"], 40)}
    )
    clean_vineyard4.append("pp_train")
    training = dvml.training_preprocessor(
        train, y="c", x="v", normalizing_const=3.0, num_classes=4,
        distribution_rules=["worker-0", "worker-3"], name="pp_train", client=cluster4.client,
    )  # fmt: skip
    # Only two of the three classes: the encoding still follows the training set's classes.
    valid = pd.DataFrame({"v": [rng.normal(size=3) for _ in range(12)], "c": ["c", "a"] * 6})
    clean_vineyard4.append("pp_valid")
    ds = dvml.validation_preprocessor(
        valid, y="c", x="v", training="pp_train", name="pp_valid", client=cluster4.client
    )
    s = ds.summary
    assert s["kind"] == "validation"
    assert s["class_values"] == ["a", "b", "c"] and s["num_classes"] == 4
    assert s["normalizing_const"] == 3.0
    assert s["training_dataset"] == {
        "name": "pp_train",
        "dataset_id": training.summary["dataset_id"],
    }
    y = expected_one_hot(valid["c"].tolist(), ["a", "b", "c"], 4)
    x = normalized(np.stack(valid["v"].tolist()), 3.0)
    check_dataset(cluster4, ds, ["worker-0", "worker-3"], [x], y)  # the training set's rules

    before = snapshot(cluster4)
    unseen = pd.DataFrame({"v": [rng.normal(size=3) for _ in range(8)], "c": ["a", "zebra"] * 4})
    with pytest.raises(DataError, match=r"zebra.*never appear.*pp_train"):
        dvml.validation_preprocessor(
            unseen, y="c", x="v", training=training, name="pp_unseen", client=cluster4.client
        )
    assert not dvml.datasets.exists("pp_unseen", client=cluster4.client)
    assert snapshot(cluster4) == before
    with pytest.raises(DatasetNotFoundError, match="no_such_training"):
        dvml.validation_preprocessor(
            valid, y="c", x="v", training="no_such_training", name="pp_v2", client=cluster4.client
        )
