"""A worker killed in the middle of featurization: the cache completes or fails cleanly.

Its own LocalCluster, since a worker is killed (the Nanny restarts it; its vineyardd, which
holds the images, runs on).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
import pytest

import dvml
from dvml.exceptions import ClusterError
from dvml.features.featurize import calls
from tests.helpers import (
    Background,
    color_images,
    dataset_names,
    keras,
    poll_for,
    read_dataset,
    staging_names,
    vineyard_usage,
)

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]


def heavy_backbone() -> Any:
    """Slow enough (upsampled convs) that a kill lands between two of its many batches."""
    k = keras()
    k.utils.set_random_seed(3)
    inputs = k.Input((32, 32, 3))
    x = k.layers.UpSampling2D(3)(inputs)
    x = k.layers.Conv2D(16, 3, activation="relu")(x)
    x = k.layers.Conv2D(16, 3, activation="relu")(x)
    return k.Model(inputs, x)


def test_worker_killed_during_featurization(
    local_cluster: Callable[..., dvml.LocalCluster],
) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="256MiB")
    client = cluster.client
    x, y = color_images(200, seed=5)
    src = dvml.training_preprocessor(
        {"image": da.from_array(x, chunks=200), "label": da.from_array(y, chunks=200)},
        y="label",
        x="image",
        normalizing_const=255.0,
        name="src",
        client=client,
    )
    usage, names = vineyard_usage(cluster), dataset_names(client)
    victim = next(w for w in cluster.workers if w.name == "worker-1")
    # Either outcome is fine, a cache or run_pinned's ClusterError; what it leaves is checked.
    job = Background(
        lambda seen: dvml.features.cache(
            "src", heavy_backbone(), pooling="avg", batch_size=4, name="fc", client=client
        )
    )

    def victim_is_busy() -> bool:
        try:
            counts = client.run(calls, workers=[victim.address], nanny=False)
        except Exception:
            return False
        return counts.get(victim.address, {}).get("batches", 0) > 0

    assert poll_for(victim_is_busy, 120, interval=0.05), "featurization never started"
    os.kill(victim.pid, signal.SIGKILL)
    error = job.error(300)

    if error is None:
        cache = job.outcome["result"]
        assert cache.rows == 600
        for mine, theirs in zip(cache.layout["buffers"], src.layout["buffers"], strict=True):
            assert mine["instance_id"] == theirs["instance_id"]  # still beside the images
        source, cached = read_dataset(client, "src"), read_dataset(client, "fc")
        model = heavy_backbone()
        width = src.summary["y_shape"][0]
        for i, buf in source.items():
            # the source's default, compact layout: raw uint8 pixels, which the cache
            # normalizes for the backbone, and class indices, which it stores one-hot
            assert buf["x_0"].dtype == np.uint8 and buf["y"].ndim == 1
            pixels = buf["x_0"].astype(np.float32) / np.float32(255.0)
            expected = np.asarray(model.predict_on_batch(pixels)).mean(axis=(1, 2))
            np.testing.assert_allclose(cached[i]["x_0"], expected, rtol=1e-4, atol=1e-5)
            one_hot = np.eye(width, dtype=np.float32)[buf["y"].astype(np.int64)]
            np.testing.assert_array_equal(cached[i]["y"], one_hot)
        dvml.features.drop("fc", client=client)
    else:
        # the one clean failure: the worker left more often than run_pinned retries, or did
        # not come back (dvml.cluster.pinned); anything else is a bug
        assert isinstance(error, ClusterError), repr(error)
        assert "featurization" in str(error), str(error)
        assert not dvml.datasets.exists("fc", client=client), error
    # Nothing of the killed attempt stays: no staged object, no name, no memory.
    assert staging_names(client) == []
    assert dataset_names(client) == names
    assert vineyard_usage(cluster) == usage
