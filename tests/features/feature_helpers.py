"""Helpers of the feature-cache tests: a tiny backbone, a synthetic image folder, and what a
cluster holds (datasets, staging names, vineyard memory) to show that nothing is left behind.

Imported by the test modules of this folder (``from feature_helpers import ...``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import dvml
from dvml.store import catalog
from dvml.store.datasets import run_on

CLASSES = ("blue", "green", "red")


def keras() -> Any:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    return tf_keras


def tiny_backbone(seed: int = 1, input_shape: tuple[int, ...] = (32, 32, 3)) -> Any:
    """A small conv net, seeded: the same weights every time for the same seed."""
    k = keras()
    k.utils.set_random_seed(seed)
    inputs = k.Input(input_shape, name="images")
    x = k.layers.Conv2D(8, 3, activation="relu", name="conv1")(inputs)
    x = k.layers.MaxPooling2D(name="pool1")(x)
    x = k.layers.Conv2D(16, 3, activation="relu", name="conv2")(x)
    return k.Model(inputs, x, name="tiny_backbone")


def color_images(n_per_class: int, seed: int = 0, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images whose dominant channel is the class (noisy), and the class index labels."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for c in range(len(CLASSES)):
        x = rng.integers(0, 90, (n_per_class, size, size, 3))
        x[..., 2 - c] += rng.integers(100, 165, (n_per_class, 1, 1))  # blue, green, red
        images.append(x.astype(np.uint8))
        labels.append(np.full(n_per_class, c))
    return np.concatenate(images), np.concatenate(labels)


def write_image_folder(root: Path, n_per_class: int, seed: int = 0) -> Path:
    """``root/<class>/<i>.png`` from :func:`color_images`."""
    from PIL import Image

    images, labels = color_images(n_per_class, seed)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}.png")
    return root


def dataset_names(client: Any) -> set[str]:
    return set(dvml.datasets.list(client=client)["name"])


def staging_names(client: Any) -> list[str]:
    return [name for name, _, _ in run_on(client, None, catalog.staging_objects)]


def vineyard_usage(cluster: Any) -> dict[str, int]:
    """Bytes used in each worker's vineyardd."""
    cluster.refresh()  # a restarted worker has a new address
    table = cluster.status()
    return {row["name"]: int(row["memory_used"]) for _, row in table.iterrows()}


def batches(client: Any) -> int:
    """Backbone batches run so far, summed over the workers."""
    return dvml.features.calls(client)["batches"]


def read_dataset(client: Any, name: str) -> dict[int, dict[str, np.ndarray]]:
    """Every buffer of any dataset, by buffer index (copies; small datasets only)."""
    from dvml.features.featurize import read_buffers

    merged: dict[int, dict[str, np.ndarray]] = {}
    for part in client.run(read_buffers, name).values():
        merged.update(part)
    return merged


def sort_rows(x: np.ndarray) -> np.ndarray:
    """Rows in a canonical order, to compare two sets of feature rows."""
    flat = x.reshape(len(x), -1)
    return flat[np.lexsort(flat.T[::-1])]


def write_tar_shards(root: Path, shards: int, n_per_class: int, seed: int = 0) -> str:
    """WebDataset-style shards ``root/shard-{0..k}.tar`` (``<key>.png`` + ``<key>.cls``)."""
    import io
    import tarfile

    from PIL import Image

    images, labels = color_images(n_per_class, seed)
    root.mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(seed).permutation(len(labels))
    for s, part in enumerate(np.array_split(order, shards)):
        with tarfile.open(root / f"shard-{s}.tar", "w") as tar:
            for i in part:
                png = io.BytesIO()
                Image.fromarray(images[i]).save(png, format="PNG")
                for ext, data in (("png", png.getvalue()), ("cls", CLASSES[labels[i]].encode())):
                    info = tarfile.TarInfo(f"{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root / f"shard-{{0..{shards - 1}}}.tar")
