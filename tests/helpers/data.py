"""Data the tests build: colour images (arrays, a class folder, tar shards), iris as a frame."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CLASSES",
    "color_images",
    "iris_frame",
    "sort_rows",
    "write_image_folder",
    "write_tar_shards",
]

CLASSES = ("blue", "green", "red")


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


def write_image_folder(root: Path, n_per_class: int, seed: int = 0, grey: bool = False) -> Path:
    """``root/<class>/<i>.png`` from :func:`color_images` (saved as grey ``L`` images when
    ``grey``)."""
    from PIL import Image

    images, labels = color_images(n_per_class, seed)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(image)
        (img.convert("L") if grey else img).save(folder / f"{i:04d}.png")
    return root


def write_tar_shards(
    root: Path, shards: int, n_per_class: int, seed: int = 0, grey: bool = False
) -> str:
    """WebDataset-style shards ``root/shard-{0..k}.tar`` (``<key>.png`` + ``<key>.cls``),
    grey ``L`` images when ``grey``."""
    from PIL import Image

    images, labels = color_images(n_per_class, seed)
    root.mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(seed).permutation(len(labels))
    for s, part in enumerate(np.array_split(order, shards)):
        with tarfile.open(root / f"shard-{s}.tar", "w") as tar:
            for i in part:
                png = io.BytesIO()
                img = Image.fromarray(images[i])
                (img.convert("L") if grey else img).save(png, format="PNG")
                for ext, data in (("png", png.getvalue()), ("cls", CLASSES[labels[i]].encode())):
                    info = tarfile.TarInfo(f"{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root / f"shard-{{0..{shards - 1}}}.tar")


def sort_rows(x: np.ndarray) -> np.ndarray:
    """Rows in a canonical order, to compare two sets of feature rows."""
    flat = x.reshape(len(x), -1)
    return flat[np.lexsort(flat.T[::-1])]


def iris_frame() -> Any:
    """scikit-learn's iris, shuffled (seed 0): ``id``, ``x`` (float32 arrays of 4), ``label``."""
    import pandas as pd
    from sklearn.datasets import load_iris

    iris = load_iris()
    return pd.DataFrame(
        {
            "id": np.arange(len(iris.target)),
            "x": list(iris.data.astype("float32")),
            "label": iris.target,
        }
    ).sample(frac=1.0, random_state=0)
