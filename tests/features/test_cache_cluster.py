"""dvml.features.cache on a real LocalCluster: compute, hit, miss, placement, faults, save/load."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
from PIL import Image

import dvml
from dvml.exceptions import (
    ClusterError,
    DatasetExistsError,
    DatasetNotFoundError,
    MemoryPlanError,
    ModelMismatchError,
    StoreError,
    VineyardMemoryError,
)
from tests.helpers import (
    CLASSES,
    batches,
    color_images,
    dataset_names,
    keras,
    read_dataset,
    sort_rows,
    staging_names,
    tiny_backbone,
    vineyard_usage,
    write_image_folder,
    write_tar_shards,
)

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """An image folder and a packed dataset of the same kind of images on cluster2, in the
    float32 layout (compact=False: normalized pixels, one-hot labels, as the cache stores its
    labels); the default, compact packing is featurized against it below."""
    client = cluster2.client
    tmp = tmp_path_factory.mktemp("features")
    folder = write_image_folder(tmp / "images", n_per_class=20)
    x, y = color_images(40, seed=1)
    dvml.training_preprocessor(
        {"image": da.from_array(x, chunks=40), "label": da.from_array(y, chunks=40)},
        y="label",
        x="image",
        normalizing_const=255.0,
        name="fc_src",
        compact=False,
        client=client,
    )
    before = dataset_names(client)
    yield {"client": client, "cluster": cluster2, "folder": folder, "tmp": tmp, "x": x, "y": y}
    for name in dataset_names(client) - (before - {"fc_src"}):
        dvml.datasets.drop(name, client=client)


@pytest.fixture
def cleanup(env: dict[str, Any]) -> Iterator[None]:
    """Drop every dataset a test created; check that no staged object is left anywhere."""
    client = env["client"]
    before = dataset_names(client)
    yield
    for name in dataset_names(client) - before:
        dvml.datasets.drop(name, client=client)
    assert staging_names(client) == []


def source_current(client: Any, name: str) -> bool | None:
    value = dvml.features.list(client=client).set_index("name").loc[name, "source_current"]
    return None if value is None else bool(value)


def local_features(model: Any, images: np.ndarray, pooling: str) -> np.ndarray:
    out = np.asarray(model.predict_on_batch(images.astype(np.float32) / 255.0))
    return out.mean(axis=(1, 2)) if pooling == "avg" else out.max(axis=(1, 2))


def test_cache_from_an_image_folder_then_a_hit(env: dict[str, Any], cleanup: None) -> None:
    client, folder = env["client"], env["folder"]
    bb = tiny_backbone()
    before_batches = batches(client)
    cache = dvml.features.cache(
        str(folder),
        bb,
        pooling="avg",
        batch_size=16,
        image_size=(32, 32),
        normalizing_const=255.0,
        client=client,
    )
    assert cache.kind == "feature_cache"
    assert cache.name.startswith("features-") and cache.summary["cache_key"].startswith(
        cache.name.removeprefix("features-")
    )
    assert cache.rows == 60 and cache.summary["x_shapes"] == [[16]]
    assert cache.summary["normalizing_const"] == 1.0
    assert cache.summary["class_values"] == list(CLASSES)
    assert cache.summary["source"]["kind"] == "images" and not cache.summary["source"]["kept"]
    assert batches(client) > before_batches
    # The images were packed under an internal name and dropped once the features were in.
    assert not [n for n in dataset_names(client) if n.startswith("__dvml_internal__/")]
    # The features are the backbone's, row for row (rows are shuffled: compare as sets).
    got = dvml.features.to_numpy(cache.name, client=client)
    images = np.stack(
        [np.asarray(Image.open(p)) for c in CLASSES for p in sorted((folder / c).iterdir())]
    )
    np.testing.assert_allclose(
        sort_rows(got["x_0"]), sort_rows(local_features(bb, images, "avg")), rtol=1e-4, atol=1e-5
    )
    assert got["y"].sum(axis=0).tolist() == [20.0, 20.0, 20.0]

    # The same request again: the same cache, and the backbone does not run.
    datasets_before, hits_before = dataset_names(client), batches(client)
    again = dvml.features.cache(
        str(folder),
        tiny_backbone(),
        pooling="avg",
        batch_size=16,
        image_size=(32, 32),
        normalizing_const=255.0,
        client=client,
    )
    assert again.id == cache.id and again.summary["dataset_id"] == cache.summary["dataset_id"]
    assert batches(client) == hits_before
    assert dataset_names(client) == datasets_before  # nothing was even packed


def test_cache_from_tar_shards(env: dict[str, Any], cleanup: None) -> None:
    client = env["client"]
    pattern = write_tar_shards(env["tmp"] / "shards", shards=3, n_per_class=10)
    kwargs = {"image_size": (32, 32), "normalizing_const": 255.0, "client": client}
    cache = dvml.features.cache(pattern, tiny_backbone(), pooling="max", name="fc_tar", **kwargs)
    assert cache.rows == 30 and cache.summary["source"]["kind"] == "images"
    assert cache.summary["class_values"] == list(CLASSES)
    got = dvml.features.to_numpy("fc_tar", client=client)
    x, _ = color_images(10)
    np.testing.assert_allclose(
        sort_rows(got["x_0"]), sort_rows(local_features(tiny_backbone(), x, "max")), atol=1e-5
    )
    before = batches(client)
    again = dvml.features.cache(pattern, tiny_backbone(), pooling="max", name="fc_tar", **kwargs)
    assert again.id == cache.id and batches(client) == before


def test_cache_from_shards_in_a_store(env: dict[str, Any], cleanup: None, s3_server: Any) -> None:
    """Shards in an S3-compatible store, named by a glob: each worker reads its own."""
    client = env["client"]
    write_tar_shards(env["tmp"] / "s3shards", shards=3, n_per_class=10)
    bucket = s3_server.bucket("features")
    s3_server.upload(env["tmp"] / "s3shards", f"{bucket}/shards")
    kwargs = {"image_size": (32, 32), "normalizing_const": 255.0, "client": client,
              "storage_options": s3_server.storage_options}  # fmt: skip
    source = f"{bucket}/shards/shard-*.tar"
    cache = dvml.features.cache(source, tiny_backbone(), pooling="max", name="fc_s3", **kwargs)
    assert cache.rows == 30 and cache.summary["class_values"] == list(CLASSES)
    assert s3_server.secret not in json.dumps(cache.summary, default=str)
    got = dvml.features.to_numpy("fc_s3", client=client)
    x, _ = color_images(10)
    np.testing.assert_allclose(
        sort_rows(got["x_0"]), sort_rows(local_features(tiny_backbone(), x, "max")), atol=1e-5
    )
    before = batches(client)
    again = dvml.features.cache(source, tiny_backbone(), pooling="max", name="fc_s3", **kwargs)
    assert again.id == cache.id and batches(client) == before  # a hit


def test_features_stay_beside_their_images(env: dict[str, Any], cleanup: None) -> None:
    client = env["client"]
    bb = tiny_backbone()
    src = dvml.datasets.describe("fc_src", client=client)
    cache = dvml.features.cache(
        "fc_src", bb, layer="conv2", pooling="max", name="fc_placed", batch_size=7, client=client
    )
    assert len(cache.layout["buffers"]) == len(src.layout["buffers"]) == 2
    for mine, theirs in zip(cache.layout["buffers"], src.layout["buffers"], strict=True):
        assert mine["index"] == theirs["index"]
        assert mine["instance_id"] == theirs["instance_id"]
        assert mine["worker_name"] == theirs["worker_name"]
        assert mine["rows"] == theirs["rows"]
    source_rows, cached = read_dataset(client, "fc_src"), read_dataset(client, "fc_placed")
    for i, buf in source_rows.items():
        np.testing.assert_array_equal(cached[i]["y"], buf["y"])  # labels carried row by row
        expected = np.asarray(bb.predict_on_batch(buf["x_0"])).max(axis=(1, 2))
        np.testing.assert_allclose(cached[i]["x_0"], expected, rtol=1e-4, atol=1e-5)
    assert cache.summary["source"] == {
        "kind": "dataset",
        "description": "fc_src",
        "name": "fc_src",
        "dataset_id": src.summary["dataset_id"],
        "kept": True,
        "version": 1,  # and its buffers' digests: what an append may extend (incremental)
        "digests": src.versions[0]["digests"],
    }
    table = dvml.features.list(client=client)
    row = table.set_index("name").loc["fc_placed"]
    assert source_current(client, "fc_placed") is True
    assert sum(row["bytes_per_worker"].values()) == row["nbytes"] == cache.nbytes
    assert set(row["bytes_per_worker"]) == {"worker-0", "worker-1"}
    assert row["layer"] == "conv2" and row["pooling"] == "max"


def test_a_compact_source_gives_the_float32_sources_features(
    env: dict[str, Any], cleanup: None
) -> None:
    """The same images packed with the default, compact layout (uint8 pixels, class indices)
    featurize to the same cache as the float32 dataset: pixels normalized per batch, labels
    one-hot in the cache."""
    client = env["client"]
    dvml.training_preprocessor(
        {"image": da.from_array(env["x"], chunks=40), "label": da.from_array(env["y"], chunks=40)},
        y="label", x="image", normalizing_const=255.0, name="fc_src_compact", client=client,
    )  # fmt: skip
    packed = read_dataset(client, "fc_src_compact")
    assert all(b["x_0"].dtype == np.uint8 and b["y"].ndim == 1 for b in packed.values())
    bb = tiny_backbone()
    dvml.features.cache("fc_src", bb, pooling="max", name="fc_from_f32", client=client)
    dvml.features.cache("fc_src_compact", bb, pooling="max", name="fc_from_u8", client=client)

    def rows(name: str) -> np.ndarray:  # features and one-hot labels side by side, sorted
        found = read_dataset(client, name).values()
        return sort_rows(np.concatenate([np.hstack([b["x_0"], b["y"]]) for b in found]))

    got, expected = rows("fc_from_u8"), rows("fc_from_f32")
    assert got.shape == expected.shape == (len(env["y"]), expected.shape[1])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_weights_change_is_a_miss(env: dict[str, Any], cleanup: None) -> None:
    client, cluster = env["client"], env["cluster"]
    bb = tiny_backbone()
    first = dvml.features.cache("fc_src", bb, pooling="avg", name="fc_w", client=client)
    usage = vineyard_usage(cluster)
    weights = bb.get_weights()
    weights[0] = weights[0] * 1.5
    bb.set_weights(weights)
    before = batches(client)
    second = dvml.features.cache("fc_src", bb, pooling="avg", name="fc_w", client=client)
    assert batches(client) > before  # recomputed
    assert second.summary["cache_key"] != first.summary["cache_key"]
    assert second.summary["backbone"]["fingerprint"] != first.summary["backbone"]["fingerprint"]
    assert dvml.features.describe("fc_w", client=client).id == second.id
    # The replaced cache's memory was freed: usage is what it was with one cache.
    assert vineyard_usage(cluster) == usage
    got = dvml.features.to_numpy("fc_w", client=client)["x_0"]
    source = read_dataset(client, "fc_src")
    x = np.concatenate([source[i]["x_0"] for i in sorted(source)])
    expected = np.asarray(bb.predict_on_batch(x)).mean(axis=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Without a name, a changed key gives a new cache and leaves the other one alone.
    derived = dvml.features.cache("fc_src", tiny_backbone(seed=2), pooling="avg", client=client)
    assert derived.name != "fc_w" and dvml.datasets.exists("fc_w", client=client)
    # overwrite=True recomputes even when nothing changed.
    before = batches(client)
    dvml.features.cache(
        "fc_src", tiny_backbone(seed=2), pooling="avg", overwrite=True, client=client
    )
    assert batches(client) > before


def test_a_hit_depends_on_the_key_not_the_name(env: dict[str, Any], cleanup: None) -> None:
    """#13 item 8: the same request without name= finds the cache stored under a name."""
    client = env["client"]
    named = dvml.features.cache("fc_src", tiny_backbone(seed=5), pooling="max", name="fc_named",
                                client=client)  # fmt: skip
    datasets_before, before = dataset_names(client), batches(client)
    again = dvml.features.cache("fc_src", tiny_backbone(seed=5), pooling="max", client=client)
    assert again.name == "fc_named" and again.id == named.id
    assert batches(client) == before  # the backbone did not run
    assert dataset_names(client) == datasets_before  # no duplicate under the default name


def test_a_replaced_or_dropped_source_is_never_served_stale(
    env: dict[str, Any], cleanup: None
) -> None:
    client = env["client"]
    x, y = env["x"], env["y"]
    source = {
        "image": da.from_array(x[::-1].copy(), chunks=60),
        "label": da.from_array(y[::-1].copy(), chunks=60),
    }
    dvml.training_preprocessor(
        source, y="label", x="image", normalizing_const=255.0, name="fc_tmp_src", client=client
    )
    bb = tiny_backbone()
    old = dvml.features.cache("fc_tmp_src", bb, pooling="avg", name="fc_stale", client=client)
    # The source is preprocessed again (other images, same name): a miss, recomputed.
    x2 = 255 - x
    dvml.training_preprocessor(
        {"image": da.from_array(x2, chunks=60), "label": da.from_array(y, chunks=60)},
        y="label",
        x="image",
        normalizing_const=255.0,
        name="fc_tmp_src",
        overwrite=True,
        client=client,
    )
    assert source_current(client, "fc_stale") is False  # shown as stale until recomputed
    before = batches(client)
    new = dvml.features.cache("fc_tmp_src", bb, pooling="avg", name="fc_stale", client=client)
    assert batches(client) > before
    assert new.summary["source"]["dataset_id"] != old.summary["source"]["dataset_id"]
    got = dvml.features.to_numpy("fc_stale", client=client)["x_0"]
    expected = local_features(bb, x2, "avg")
    np.testing.assert_allclose(sort_rows(got), sort_rows(expected), rtol=1e-4, atol=1e-5)
    # The source is dropped: asking for its cache is a clear error, not the old features.
    dvml.datasets.drop("fc_tmp_src", client=client)
    with pytest.raises(DatasetNotFoundError, match="No dataset named 'fc_tmp_src'"):
        dvml.features.cache("fc_tmp_src", bb, pooling="avg", name="fc_stale", client=client)
    assert source_current(client, "fc_stale") is False


def _ids(ds: Any) -> list[dict[str, int]]:
    return [{f: v["id"] for f, v in b["fields"].items()} for b in ds.layout["buffers"]]


def test_an_append_extends_the_cache_with_the_new_rows_only(
    env: dict[str, Any], cleanup: None
) -> None:
    """Issue 39 item 4: after an append, the backbone runs on the appended rows alone; the old
    feature buffers are shared by the cache's next version; the features are all right."""
    client, x, y = env["client"], env["x"], env["y"]

    def arrays(rows: slice) -> dict[str, Any]:
        return {
            "image": da.from_array(x[rows], chunks=12),
            "label": da.from_array(y[rows], chunks=12),
        }

    dvml.training_preprocessor(arrays(slice(0, 24)), y="label", x="image", normalizing_const=255.0,
                               name="fc_grow", client=client)  # fmt: skip
    bb = tiny_backbone(seed=3)
    first = dvml.features.cache("fc_grow", bb, pooling="avg", name="fc_grow_f", client=client)
    assert first.rows == 24 and first.summary["source"]["version"] == 1
    dvml.datasets.append("fc_grow", arrays(slice(24, 40)), client=client)
    assert source_current(client, "fc_grow_f") is False  # the dataset has moved on
    rows_before = dvml.features.calls(client)["rows"]
    grown = dvml.features.cache("fc_grow", bb, pooling="avg", name="fc_grow_f", client=client)
    assert dvml.features.calls(client)["rows"] - rows_before == 16  # the new rows only
    assert grown.summary["incremental"]["from_version"] == 1 and grown.version == 2
    assert grown.rows == 40 and grown.summary["source"]["version"] == 2
    assert _ids(grown)[: len(_ids(first))] == _ids(first)  # the old features, not copied
    assert grown.summary["dataset_id"] == first.summary["dataset_id"]
    got = dvml.features.to_numpy("fc_grow_f", client=client)["x_0"]
    expected = local_features(bb, x[:40], "avg")
    np.testing.assert_allclose(sort_rows(got), sort_rows(expected), rtol=1e-4, atol=1e-5)
    assert source_current(client, "fc_grow_f") is True
    # the same request again, without a name: found by its key, nothing computed
    before = batches(client)
    again = dvml.features.cache("fc_grow", bb, pooling="avg", client=client)
    assert again.name == "fc_grow_f" and batches(client) == before
    # another backbone is not an extension: every row is featurized
    rows_before = dvml.features.calls(client)["rows"]
    other = dvml.features.cache("fc_grow", tiny_backbone(seed=4), pooling="avg", client=client)
    assert dvml.features.calls(client)["rows"] - rows_before == 40
    assert "incremental" not in other.summary


def test_bad_requests_fail_before_any_work(env: dict[str, Any], cleanup: None) -> None:
    client = env["client"]
    names, before = dataset_names(client), batches(client)
    with pytest.raises(ModelMismatchError, match=r"no layer named 'conv9'.*'conv1', 'pool1'"):
        dvml.features.cache("fc_src", tiny_backbone(), layer="conv9", client=client)
    with pytest.raises(ModelMismatchError, match=r"shape \(32, 32, 3\).*\(64, 64, 3\)"):
        dvml.features.cache("fc_src", tiny_backbone(input_shape=(64, 64, 3)), client=client)
    wrong = str(env["tmp"] / "wrong.h5")
    tiny_backbone().save_weights(wrong)
    with pytest.raises(ModelMismatchError, match="weights file does not match"):
        dvml.features.cache(
            str(env["folder"]),
            {"application": "MobileNetV2", "weights": wrong, "kwargs": {"alpha": 0.35}},
            image_size=(32, 32),
            normalizing_const=255.0,
            client=client,
        )
    with pytest.raises(ClusterError, match="use_gpus=True but workers"):
        dvml.features.cache("fc_src", tiny_backbone(), use_gpus=True, client=client)
    with pytest.raises(ValueError, match="distribution_rules apply to raw sources only"):
        dvml.features.cache(
            "fc_src", tiny_backbone(), distribution_rules="all_workers", client=client
        )
    with pytest.raises(DatasetNotFoundError, match="No dataset named 'fc_nothing'"):
        dvml.features.cache("fc_nothing", tiny_backbone(), client=client)
    with pytest.raises(TypeError, match="Unknown keyword arguments"):
        dvml.features.cache("fc_src", tiny_backbone(), image_szie=(32, 32), client=client)
    dvml.features.cache("fc_src", tiny_backbone(), pooling="avg", name="fc_plain", client=client)
    with pytest.raises(DatasetExistsError, match="not a feature cache"):
        dvml.features.cache("fc_src", tiny_backbone(), name="fc_src", client=client)
    with pytest.raises(DatasetNotFoundError, match="'fc_src' is a dataset, not a feature cache"):
        dvml.features.describe("fc_src", client=client)
    assert dataset_names(client) == names | {"fc_plain"}
    assert batches(client) - before == 2  # only fc_plain ran: 80 rows, 2 buffers of 40


def test_a_failed_featurization_leaves_nothing(
    env: dict[str, Any], cleanup: None, monkeypatch: Any
) -> None:
    """One worker's vineyardd has no room: the other's features are deleted, no name appears.
    The backstop, as when another job fills the vineyardd between the plan and the writes: the
    plan's admission is skipped here (it would refuse this cache before any work)."""
    from dvml.features import build
    from dvml.store.tensors import delete_objects, put_arrays

    monkeypatch.setattr(build, "admit", lambda *args, **kwargs: None)
    client, cluster = env["client"], env["cluster"]
    k = keras()
    inputs = k.Input((32, 32, 3))
    big = k.Model(inputs, k.layers.Conv2D(8, 1, name="wide")(k.layers.UpSampling2D(8)(inputs)))
    # 40 rows x 256*256*8 floats = 80 MiB of features per worker; fill worker-0 first.
    worker0 = next(w for w in cluster.workers if w.name == "worker-0")
    free = cluster.status().set_index("name").loc["worker-0"]
    ballast_bytes = int(free["memory_limit"] - free["memory_used"]) - 40 * 2**20
    zeros = client.submit(np.zeros, ballast_bytes // 4, np.float32, workers=[worker0.address])
    ballast = client.submit(put_arrays, {"b": zeros}, workers=[worker0.address], pure=False)
    ballast = ballast.result()
    del zeros
    try:
        usage, names = vineyard_usage(cluster), dataset_names(client)
        with pytest.raises(VineyardMemoryError, match="worker-0 has no room"):
            dvml.features.cache("fc_src", big, name="fc_too_big", client=client)
        assert not dvml.datasets.exists("fc_too_big", client=client)
        assert dataset_names(client) == names
        assert staging_names(client) == []
        assert vineyard_usage(cluster) == usage  # worker-1's finished buffer was deleted too
    finally:
        client.submit(
            delete_objects, [ballast["fields"]["b"]["id"]], workers=[worker0.address], pure=False
        ).result()


def test_the_plan_is_what_the_vineyardds_gain_and_too_much_is_refused(
    env: dict[str, Any], cleanup: None
) -> None:
    """dvml.plan.features: each worker's features and labels are exactly what its vineyardd
    gains; a cache too big for the vineyardds, or for the hosts' memory, is refused with
    MemoryPlanError before any work, nothing written."""
    import dask

    client, cluster = env["client"], env["cluster"]
    bb = tiny_backbone()
    plan = dvml.plan.features("fc_src", bb, layer="conv2", batch_size=8, client=client)
    assert plan.fits and plan.row_bytes == 4 * (13 * 13 * 16 + len(CLASSES))
    before = vineyard_usage(cluster)
    dvml.features.cache("fc_src", bb, layer="conv2", batch_size=8, name="fc_planned",
                        client=client)  # fmt: skip
    after = vineyard_usage(cluster)
    assert {w: after[w] - before[w] for w in after} == {w.worker: w.features for w in plan.workers}

    k = keras()
    inputs = k.Input((32, 32, 3))
    huge = k.Model(inputs, k.layers.Conv2D(8, 1)(k.layers.UpSampling2D(24)(inputs)))
    usage, names = vineyard_usage(cluster), dataset_names(client)
    with pytest.raises(MemoryPlanError, match="vineyard_memory: at least") as refused:
        dvml.features.cache("fc_src", huge, name="fc_too_big", client=client)
    assert not refused.value.plan.fits and "Nothing was computed" in str(refused.value)
    capped = dask.config.set({"dvml.memory.host-memory": "1KiB"})
    with capped, pytest.raises(MemoryPlanError, match="more memory on host"):
        dvml.features.cache("fc_src", bb, pooling="avg", name="fc_no_room", client=client)
    assert vineyard_usage(cluster) == usage and dataset_names(client) == names
    assert staging_names(client) == []


def test_a_raw_source_is_planned_and_refused_before_its_pack_writes(
    env: dict[str, Any], cleanup: None
) -> None:
    """An image folder's cache is planned from its pack's plan (labels from its classes,
    whatever the storage layout) and refused at the pack's admission, before a byte of the
    source is written: the refusal's plan still counts the source's bytes to be written."""
    client, cluster, folder = env["client"], env["cluster"], str(env["folder"])
    images = {"image_size": (32, 32), "normalizing_const": 255.0}
    bb = tiny_backbone()
    plan = dvml.plan.features(folder, bb, layer="conv2", batch_size=8, client=client, **images)
    assert plan.fits and plan.row_bytes == 4 * (13 * 13 * 16 + len(CLASSES))
    assert sum(w.rows for w in plan.workers) == 20 * len(CLASSES)
    assert all(w.source > 0 for w in plan.workers), plan.table()

    k = keras()
    inputs = k.Input((32, 32, 3))
    huge = k.Model(inputs, k.layers.Conv2D(8, 1)(k.layers.UpSampling2D(24)(inputs)))
    usage, names = vineyard_usage(cluster), dataset_names(client)
    with pytest.raises(MemoryPlanError, match="vineyard_memory: at least") as refused:
        dvml.features.cache(folder, huge, name="fc_raw_too_big", client=client, **images)
    assert all(w.source > 0 for w in refused.value.plan.workers)  # planned before the pack
    assert vineyard_usage(cluster) == usage and dataset_names(client) == names
    assert staging_names(client) == []


def test_save_and_load(env: dict[str, Any], cleanup: None) -> None:
    client, tmp = env["client"], env["tmp"]
    cache = dvml.features.cache(
        "fc_src", tiny_backbone(), pooling="avg", name="fc_saved", client=client
    )
    expected = dvml.features.to_numpy("fc_saved", client=client)
    directory = tmp / "saved"
    manifest = dvml.features.save("fc_saved", directory, client=client)
    content = json.loads(Path(manifest).read_text())
    assert content["summary"]["cache_key"] == cache.summary["cache_key"]
    for buf in content["buffers"]:  # each worker wrote its own buffers under its name
        assert all(f["path"].startswith(f"{buf['worker_name']}/") for f in buf["files"].values())
        assert all((directory / f["path"]).is_file() for f in buf["files"].values())
    with pytest.raises(DatasetExistsError, match="holds a saved feature cache already"):
        dvml.features.save("fc_saved", directory, client=client)

    dvml.features.drop("fc_saved", client=client)
    loaded = dvml.features.load(directory, client=client)
    assert loaded.name == "fc_saved" and not loaded.summary["rebalanced"]
    assert loaded.summary["cache_key"] == cache.summary["cache_key"]
    assert [b["worker_name"] for b in loaded.layout["buffers"]] == [
        b["worker_name"] for b in cache.layout["buffers"]
    ]
    got = dvml.features.to_numpy("fc_saved", client=client)
    for field in ("x_0", "y"):
        np.testing.assert_array_equal(got[field], expected[field])
    # The same request as before is a hit on the loaded cache.
    before = batches(client)
    assert (
        dvml.features.cache(
            "fc_src", tiny_backbone(), pooling="avg", name="fc_saved", client=client
        ).id
        == loaded.id
    )
    assert batches(client) == before
    assert dvml.features.load(directory, client=client).id == loaded.id  # loaded already
    with pytest.raises(DatasetExistsError, match="not this saved cache"):
        dvml.features.load(directory, name="fc_src", client=client)

    # Saved on workers that are gone: the rows are spread evenly over the live workers.
    content["buffers"][0]["worker_name"] = "worker-gone"
    Path(manifest).write_text(json.dumps(content))
    moved = dvml.features.load(directory, name="fc_moved", client=client)
    assert moved.summary["rebalanced"] and moved.rows == cache.rows
    assert sorted(moved.summary["rows_per_worker"].values()) == [60, 60]
    again = dvml.features.to_numpy("fc_moved", client=client)
    assert again["x_0"].dtype == np.float32
    both = np.concatenate([again["x_0"], again["y"]], axis=1)
    np.testing.assert_array_equal(
        sort_rows(both), sort_rows(np.concatenate([expected["x_0"], expected["y"]], 1))
    )

    (directory / "worker-1" / os.listdir(directory / "worker-1")[0]).write_bytes(b"broken")
    with pytest.raises(StoreError, match=r"Cannot read|checksum"):
        dvml.features.load(directory, name="fc_broken", client=client)
    assert not dvml.datasets.exists("fc_broken", client=client)
    with pytest.raises(StoreError, match="No saved feature cache"):
        dvml.features.load(tmp / "nowhere", client=client)
