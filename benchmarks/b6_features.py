"""B6: fine-tuning heads on a feature cache, and reusing a saved cache after a restart.

**B6a** (heads on cached features vs recomputing the backbone for each head). What is
measured, per repeat and side: the wall time of the whole job, three heads each trained for
``EPOCHS`` epochs with :func:`dvml.fit` (one trainer per worker, MultiWorkerMirroredStrategy):

- dvml side: ``dvml.features.cache(images, backbone, pooling="avg", overwrite=True)`` (the
  backbone runs ONCE over the images, on the workers that hold them), then the three heads
  are fitted on the cache.
- baseline: the usual way without a cache: each head is fitted on the IMAGES inside one model
  ``frozen backbone -> global average pooling -> head`` (backbone layers ``trainable=False``),
  so the backbone's forward pass runs again on every batch of every epoch of every head.

Both sides: the same images, heads (Dense 10; Dense 64-Dense 10; Dense 128-Dense 64-Dense 10),
compile and fit parameters (Adam, global batch 256, the same epochs, one iteration), and the
same trainer machinery. The backbone is a small ResNet (three residual stages of 48/96/192
filters, about 0.7 M parameters, ~0.7 GFLOP per 64x64 image), seeded. Images: random 64x64
RGB images with 10 classes, generated on the workers and packed into vineyard once in
``prepare`` (not timed). Sizes: 3,000 images and 5 epochs per head (``--quick``: 256 images,
1 epoch). A LocalCluster of 2 workers (1 thread each, 256 MiB of vineyard memory each).
Figure: seconds; target: ratio dvml / baseline <= 0.2 (at least 5x faster). On 2 cores one
repeat of both sides takes about 7 minutes.

**B6b** (a saved cache after a restart vs computing it again). Before each run the cache is
dropped and the workers restarted (``client.restart()``: fresh processes, no TensorFlow, no
built backbone), as after a restart.

- dvml side: ``dvml.features.load(directory)``: each worker reads the ``.npy`` files of its
  buffers (written once by ``dvml.features.save`` in ``prepare``) into its vineyardd.
- baseline: ``dvml.features.cache(image_folder, backbone, ...)``: pack the same images (PNG
  files written once in ``prepare``) and run the backbone over them again.

Figure: seconds; target: ratio <= 0.2.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from benchmarks.harness import Benchmark, register

MiB = 1 << 20
CLASSES = 10
SIZES = {False: (3000, 5), True: (256, 1)}  # quick -> (images, epochs per head)
SIDE = 64  # images are SIDE x SIDE x 3
FILTERS = (48, 96, 192)
BATCH = 256  # global batch: few steps per epoch, so per-step overhead stays small
HEADS = {"b6_head_1": (), "b6_head_2": (64,), "b6_head_3": (128, 64)}
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)'"
SOURCE, CACHE = "bench_b6_images", "bench_b6_features"


def _keras() -> Any:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras

    return tf_keras


def small_resnet(seed: int = 0) -> Any:
    """Three residual stages (48, 96, 192 filters) on SIDE x SIDE x 3 images, seeded weights."""
    k = _keras()
    k.utils.set_random_seed(seed)
    inputs = k.Input((SIDE, SIDE, 3), name="image")
    x = inputs
    for i, filters in enumerate(FILTERS):
        if i:
            x = k.layers.MaxPooling2D(name=f"pool{i}")(x)
        y = k.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"s{i}_a")(x)
        y = k.layers.Conv2D(filters, 3, padding="same", name=f"s{i}_b")(y)
        skip = k.layers.Conv2D(filters, 1, name=f"s{i}_skip")(x)
        x = k.layers.Activation("relu", name=f"s{i}_out")(k.layers.Add(name=f"s{i}_add")([y, skip]))
    return k.Model(inputs, x, name="small_resnet")


def _head(hidden: tuple[int, ...], width: int) -> Any:
    k = _keras()
    layers = [k.layers.InputLayer(input_shape=(width,))]
    layers += [k.layers.Dense(units, activation="relu") for units in hidden]
    layers.append(k.layers.Dense(CLASSES, activation="softmax"))
    return k.Sequential(layers)


def _full(backbone: Any, hidden: tuple[int, ...]) -> Any:
    """Frozen backbone -> average pooling -> head: the model the baseline fits on images."""
    k = _keras()
    frozen = k.models.clone_model(backbone)
    frozen.set_weights(backbone.get_weights())
    frozen.trainable = False
    pooled = k.layers.GlobalAveragePooling2D(name="pool")(frozen.output)
    head = _head(hidden, int(pooled.shape[-1]))
    return k.Model(frozen.input, head(pooled))


def _images(rows: int, seed: int = 0) -> dict[str, Any]:
    import dask.array as da
    import numpy as np

    rng = da.random.default_rng(seed)
    x = rng.integers(0, 256, (rows, SIDE, SIDE, 3), chunks=(256, SIDE, SIDE, 3)).astype(np.uint8)
    y = da.random.default_rng(seed + 1).integers(0, CLASSES, rows, chunks=256)
    return {"image": x, "label": y}


def _fit(context: dict[str, Any], dataset: str, model: str, arch: int) -> None:
    import dvml

    dvml.fit(
        dataset, model, arch, COMPILE, f"batch_size={BATCH}, epochs={context['epochs']}",
        num_iterations=1, progress=False, resume=False, overwrite=True,
        registry=context["registry"], client=context["cluster"].client,
    )  # fmt: skip


def _start(quick: bool) -> dict[str, Any]:
    import dask

    import dvml

    rows, epochs = SIZES[quick]
    tmp = tempfile.mkdtemp(prefix="dvml-b6-")
    config = dask.config.set({"dvml.cluster.state-dir": os.path.join(tmp, "state")})
    config.__enter__()
    context: dict[str, Any] = {"tmp": tmp, "config": config, "epochs": epochs, "rows": rows}
    try:
        context["cluster"] = dvml.LocalCluster(
            n_workers=2, threads_per_worker=1, vineyard_memory=256 * MiB,
            dashboard_address=None, set_as_default=False,
        )  # fmt: skip
        context["backbone"] = small_resnet()
    except BaseException:
        cleanup(context)
        raise
    return context


def prepare(quick: bool) -> dict[str, Any]:
    """Both rows' inputs, on one cluster (the harness shares it between B6a and B6b).

    B6a: the images packed into vineyard, the heads and the frozen full models registered.
    B6b: the images as PNG files, and their cache computed and saved once.
    """
    import numpy as np
    from PIL import Image

    import dvml

    context = _start(quick)
    try:
        client = context["cluster"].client
        reg = context["registry"] = dvml.Registry(f"sqlite:///{context['tmp']}/registry.db")
        dvml.training_preprocessor(
            _images(context["rows"]), y="label", x="image", normalizing_const=255.0,
            name=SOURCE, overwrite=True, client=client,
        )  # fmt: skip
        backbone = context["backbone"]
        width = int(backbone.output_shape[-1])
        context["heads"] = {name: dvml.load_keras_model(_head(h, width).to_json(), registry=reg)
                            for name, h in HEADS.items()}  # fmt: skip
        context["full"] = {name: dvml.load_keras_model(_full(backbone, h), registry=reg)
                           for name, h in HEADS.items()}  # fmt: skip

        folder = context["folder"] = os.path.join(context["tmp"], "images")
        rng = np.random.default_rng(0)
        for i in range(context["rows"]):
            label = os.path.join(folder, f"class{i % CLASSES}")
            os.makedirs(label, exist_ok=True)
            image = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
            Image.fromarray(image).save(os.path.join(label, f"{i:05d}.png"))
        cache = _cache_folder(context)
        context["saved"] = os.path.join(context["tmp"], "saved")
        dvml.features.save(cache.name, context["saved"], client=client)
        dvml.features.drop(cache.name, client=client)
    except BaseException:
        cleanup(context)
        raise
    return context


def _cache_folder(context: dict[str, Any]) -> Any:
    import dvml

    return dvml.features.cache(
        context["folder"], context["backbone"], pooling="avg", name=CACHE, overwrite=True,
        image_size=(SIDE, SIDE), normalizing_const=255.0, client=context["cluster"].client,
    )  # fmt: skip


def heads_on_cache(context: dict[str, Any]) -> float:
    import dvml

    client = context["cluster"].client
    start = time.perf_counter()
    dvml.features.cache(SOURCE, context["backbone"], pooling="avg", name=CACHE, overwrite=True,
                        client=client)  # fmt: skip
    for name, arch in context["heads"].items():
        _fit(context, CACHE, name, arch)
    seconds = time.perf_counter() - start
    dvml.features.drop(CACHE, client=client)
    return seconds


def heads_on_images(context: dict[str, Any]) -> float:
    start = time.perf_counter()
    for name, arch in context["full"].items():
        _fit(context, SOURCE, f"{name}_full", arch)
    return time.perf_counter() - start


def _restart(context: dict[str, Any]) -> None:
    import dvml

    client = context["cluster"].client
    for name in (CACHE,):
        if dvml.datasets.exists(name, client=client):
            dvml.datasets.drop(name, client=client)
    # A generous timeout: on a loaded machine fresh worker processes can take a while.
    client.restart(timeout=300)
    context["cluster"].refresh()


def load_saved(context: dict[str, Any]) -> float:
    import dvml

    _restart(context)
    start = time.perf_counter()
    cache = dvml.features.load(context["saved"], client=context["cluster"].client)
    seconds = time.perf_counter() - start
    if cache.rows != context["rows"]:
        raise RuntimeError(f"loaded {cache.rows} rows, expected {context['rows']}")
    return seconds


def recompute(context: dict[str, Any]) -> float:
    _restart(context)
    start = time.perf_counter()
    cache = _cache_folder(context)
    seconds = time.perf_counter() - start
    if cache.rows != context["rows"]:
        raise RuntimeError(f"computed {cache.rows} rows, expected {context['rows']}")
    return seconds


def cleanup(context: dict[str, Any]) -> None:
    import dvml

    cluster = context.get("cluster")
    try:
        if cluster is not None:
            for name in (SOURCE, CACHE):
                if dvml.datasets.exists(name, client=cluster.client):
                    dvml.datasets.drop(name, client=cluster.client)
    finally:
        if "registry" in context:
            context["registry"].close()
        if cluster is not None:
            cluster.close()
        context["config"].__exit__(None, None, None)
        shutil.rmtree(context["tmp"], ignore_errors=True)


HEADS_BENCHMARK = register(
    Benchmark(
        key="B6a",
        title="3 heads fine-tuned on a feature cache vs recomputing the backbone per head",
        unit="s",
        dvml=heads_on_cache,
        baseline=heads_on_images,
        target=0.2,
        target_op="<=",
        prepare=prepare,
        cleanup=cleanup,
    )
)

RESTART_BENCHMARK = register(
    Benchmark(
        key="B6b",
        title="a saved feature cache loaded after a restart vs computed again",
        unit="s",
        dvml=load_saved,
        baseline=recompute,
        target=0.2,
        target_op="<=",
        prepare=prepare,
        cleanup=cleanup,
    )
)
