"""B9: parallel image decoding: preprocessing an image folder on 2 workers vs on 1 worker.

What is measured, per repeat and side: images per second of one
``dvml.training_preprocessor(folder, image_size=(64, 64), normalizing_const=255)`` call,
timed with ``time.perf_counter`` in the benchmark process: listing the folder, decoding and
resizing every JPEG with Pillow in the workers' decode tasks (256 images per task), one-hot
encoding, packing and publishing. The dataset is dropped after the clock stops.

- dvml side: a LocalCluster of 2 workers (1 thread each): decode tasks run on both.
- baseline: a LocalCluster of 1 worker (1 thread): the same call, every image decoded by one
  process.

Input: a class-per-folder tree of 4 classes written once with Pillow before timing: 4096
RGB JPEGs of 256x256 pixels (quality 90, smooth gradients plus noise) resized to 64x64
(``--quick``: 512 images of 128x128). Both clusters start before timing, and each runs the
call once on a small folder first (imports, connections). Figure: images/s; the ratio is
the speed-up of the second worker. Target: >= 1.3 (two processes on this machine's cores,
with the client and scheduler sharing them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from benchmarks.harness import Benchmark, register

CLASSES = ("ant", "bee", "cat", "dog")
SIZES = {False: (4096, 256), True: (512, 128)}  # quick -> (images, source side in pixels)
IMAGE_SIZE = (64, 64)
NAME = "bench_b9"
MiB = 1 << 20


def write_folder(root: str, images: int, side: int, seed: int = 0) -> None:
    """``root/<class>/<i>.jpg``: ``images`` JPEGs spread evenly over the classes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    for label in CLASSES:
        os.makedirs(os.path.join(root, label), exist_ok=True)
    for i in range(images):
        base = (ramp[:, None, None] * rng.random(3) + ramp[None, :, None] * rng.random(3)) / 2
        noise = rng.normal(0, 12, (side, side, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        path = os.path.join(root, CLASSES[i % len(CLASSES)], f"{i:05d}.jpg")
        Image.fromarray(pixels).save(path, quality=90)


def _preprocess(cluster: Any, folder: str) -> float:
    import dvml

    start = time.perf_counter()
    ds = dvml.training_preprocessor(
        folder, image_size=IMAGE_SIZE, normalizing_const=255.0, name=NAME, overwrite=True,
        client=cluster.client,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    rows = ds.rows
    dvml.datasets.drop(NAME, client=cluster.client)
    return rows / seconds


def prepare(quick: bool) -> dict[str, Any]:
    import dvml

    images, side = SIZES[quick]
    context: dict[str, Any] = {"directory": tempfile.mkdtemp(prefix="dvml-bench-b9-")}
    try:
        folder = os.path.join(context["directory"], "images")
        warm = os.path.join(context["directory"], "warm")
        write_folder(folder, images, side)
        write_folder(warm, 16, 32, seed=1)
        # float32 64x64x3 rows plus labels, with room to spare.
        memory = max(64 * MiB, 2 * images * (IMAGE_SIZE[0] * IMAGE_SIZE[1] * 3 + 4) * 4)
        for key, n in (("two", 2), ("one", 1)):
            context[key] = dvml.LocalCluster(
                n_workers=n, threads_per_worker=1, vineyard_memory=memory,
                dashboard_address=None, set_as_default=False,
            )  # fmt: skip
            _preprocess(context[key], warm)
        context["folder"] = folder
    except BaseException:
        cleanup(context)
        raise
    return context


def dvml_side(context: dict[str, Any]) -> float:
    return _preprocess(context["two"], context["folder"])


def baseline_side(context: dict[str, Any]) -> float:
    return _preprocess(context["one"], context["folder"])


def cleanup(context: dict[str, Any]) -> None:
    for key in ("two", "one"):
        if context.get(key) is not None:
            context[key].close()
    shutil.rmtree(context["directory"], ignore_errors=True)


BENCHMARK = register(
    Benchmark(
        key="B9",
        title="image folder decode, 2 workers vs 1 worker",
        unit="images/s",
        dvml=dvml_side,
        baseline=baseline_side,
        target=1.3,
        target_op=">=",
        prepare=prepare,
        cleanup=cleanup,
    )
)
