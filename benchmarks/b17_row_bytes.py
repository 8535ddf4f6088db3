"""B17: shared-memory bytes per row of packed image datasets vs the raw bytes of their rows.

What is measured: for a dataset packed by ``dvml.training_preprocessor`` from uint8 images
and integer labels, the bytes its buffers hold in vineyard shared memory (every field of
every buffer: rows x shape x item size, as the dataset's layout records them), divided by its
rows. Baseline: the raw bytes of one row as the user holds it, the uint8 pixels plus an int64
label. Two rows:

- B17a: scikit-learn's digits as uint8 images, 8x8x1 (the 0-16 values), 10 classes;
- B17b: 224x224x3 uint8 images (ImageNet's shape), 1,000 classes (``num_classes=1000``),
  64 synthetic rows (``--quick``: 8).

The dvml figure is the default packing, with no ``compact=`` argument: the compact format
(uint8 x as it is, y a class index of the smallest unsigned type, normalized and one-hot
encoded on the fly by the trainers' input pipeline); the row fails if the default is not
compact (its details record the storage). The float32 format (``compact=False``: x
normalized, y one-hot, about 4x) is reported beside it. Both are packed once on a one-worker
LocalCluster (the figures do not vary between repeats; the repeats only satisfy the
harness). Target: ratio <= 1.05 (dvml stores about what the user holds).
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks._clusters import drop_and_close
from benchmarks.harness import Benchmark, register

MiB = 1 << 20
NAMES = {"B17a": "bench_b17_digits", "B17b": "bench_b17_imagenet"}


def _packed_bytes_per_row(ds: Any) -> float:
    import numpy as np

    total = 0
    for buffer in ds.layout["buffers"]:
        for field in buffer["fields"].values():
            if "nbytes" in field:  # as vineyardd allocated it
                total += int(field["nbytes"])
            else:
                itemsize = np.dtype(field.get("dtype", "float32")).itemsize
                total += math.prod(field["shape"]) * itemsize
    return total / ds.rows


def prepare(quick: bool) -> dict[str, Any]:
    import dask.array as da
    import numpy as np
    from sklearn.datasets import load_digits

    import dvml

    rows_big = 8 if quick else 64
    cluster = dvml.LocalCluster(
        n_workers=1, threads_per_worker=1, vineyard_memory=192 * MiB, dashboard_address=None,
        set_as_default=False,
    )  # fmt: skip
    context: dict[str, Any] = {"cluster": cluster, "figures": {}}
    try:
        digits = load_digits()
        images = digits.images.astype(np.uint8).reshape(-1, 8, 8, 1)
        labels = digits.target.astype(np.int64)
        big = np.random.default_rng(0).integers(0, 256, (rows_big, 224, 224, 3), dtype=np.uint8)
        big_labels = np.arange(rows_big, dtype=np.int64) % 1000
        sources = {
            "B17a": ({"image": images, "label": labels}, 16.0, None),
            "B17b": ({"image": da.from_array(big, chunks=8), "label": big_labels}, 255.0, 1000),
        }
        for key, (source, const, classes) in sources.items():
            raw = source["image"][0].nbytes + 8  # uint8 pixels of one row + an int64 label
            found = {}
            # the default (no compact= argument), then the float32 format beside it
            for side, layout in (("default", {}), ("float32", {"compact": False})):
                ds = dvml.training_preprocessor(
                    source, y="label", x="image", normalizing_const=const,
                    num_classes=classes, name=NAMES[key], overwrite=True,
                    client=cluster.client, **layout,
                )  # fmt: skip
                found[side] = (_packed_bytes_per_row(ds), ds.summary["storage"])
                dvml.datasets.drop(NAMES[key], client=cluster.client)
            context["figures"][key] = {
                "dvml": found["default"][0],
                "baseline": float(raw),
                "details": {
                    "default storage": found["default"][1],
                    "float32 format bytes/row": round(found["float32"][0], 1),
                    "float32 format ratio": round(found["float32"][0] / raw, 2),
                },
            }
    except BaseException:
        cluster.close()
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    drop_and_close(context["cluster"], NAMES["B17b"])


def _register(key: str, title: str) -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=title,
            unit="bytes/row",
            dvml=lambda context: context["figures"][key]["dvml"],
            baseline=lambda context: context["figures"][key]["baseline"],
            target=1.05,
            target_op="<=",
            prepare=prepare,
            cleanup=cleanup,
            details=lambda context: dict(context["figures"][key]["details"]),
        )
    )


B17A = _register("B17a", "shared-memory bytes per row, digits as uint8 vs uint8 pixels + int")
B17B = _register("B17b", "shared-memory bytes per row, 224x224x3 uint8 vs uint8 pixels + int")
