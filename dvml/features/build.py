"""``dvml.features.cache``: run a backbone where the images live, keep the features in vineyard.

::

    source dataset buffer i (worker A) ──► featurize_buffer(i) on worker A ──► cache buffer i
                                           extractor built once per process    (worker A)

The cache is a dataset of kind ``"feature_cache"``: field ``x_0`` holds float32 features,
``y`` the source's one-hot labels, and its summary has every key :func:`dvml.fit` reads, so a
head trains on it like on any dataset. Its key (:func:`dvml.features.keys.cache_key`) covers
the backbone, layer, pooling, preprocessing and the identity of the source: the same request
returns the existing cache without running the backbone; any change computes anew.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml._version import __version__
from dvml.cluster import current_client
from dvml.cluster.pinned import run_pinned
from dvml.cluster.workers import discover_workers
from dvml.exceptions import (
    ArgumentTypeError,
    ClusterError,
    DatasetExistsError,
    ModelMismatchError,
    PlacementError,
    StoreError,
)
from dvml.features import featurize
from dvml.features.backbone import Backbone, resolve_backbone
from dvml.features.cache_memory import admit, check_cache_fits, source_cache_plan
from dvml.features.incremental import covered_buffers, new_buffers, source_digests
from dvml.features.keys import (
    cache_key,
    check_batch_size,
    check_cache_name,
    check_layer,
    check_pooling,
    default_name,
)
from dvml.features.lookup import by_key, existing, intact, source_workers, with_summary
from dvml.features.manage import KIND
from dvml.features.manage import describe as describe_cache
from dvml.features.source import SourcePlan, pack_source, plan_source
from dvml.names import INTERNAL_PREFIX
from dvml.placement import DistributionRules, resolve_rules
from dvml.placement.memory import MemoryPlan
from dvml.preprocess.admission import admitting_also
from dvml.store import catalog
from dvml.store.datasets import Dataset, drop, run_on
from dvml.store.publish import publish_run, staging_name

if TYPE_CHECKING:
    from distributed import Client

    from dvml.registry import Registry

__all__ = ["cache"]

logger = logging.getLogger("dvml.features")


def cache(
    source: Any,
    backbone: Any,
    layer: str | None = None,
    pooling: str | None = None,
    batch_size: int = 64,
    distribution_rules: Any = None,
    use_gpus: bool = False,
    name: str | None = None,
    overwrite: bool = False,
    registry: Registry | str | None = None,
    client: Client | None = None,
    *,
    training: str | Dataset | None = None,
    **preprocess_kwargs: Any,
) -> Dataset:
    """Compute (or find) the features of ``source`` under ``backbone``, kept in vineyard.

    Parameters
    ----------
    source : str, Dataset, dict or path
        A dataset of images packed by :func:`dvml.training_preprocessor` (its name or handle);
        a dict of Dask/numpy arrays (``{"image": x, "label": y}``); an image folder
        (``root/<class>/<image>``); or tar shards (``"shards-{0000..0009}.tar"``). Raw sources
        are packed first with ``preprocess_kwargs`` (``image_size``, ``normalizing_const``,
        ``x``, ``y``, ...) into a dataset that is dropped once the features are published.
    backbone : tf-keras Model, int, str or dict
        A tf-keras model; an architecture id in ``registry`` (with weights); a Keras
        application name (``"MobileNetV2"``: built for the images' shape with
        ``include_top=False`` and seeded random weights); or ``{"application": "ResNet50",
        "weights": "/path/file.h5", "kwargs": {"alpha": 0.35}, "seed": 0}``. ``"imagenet"``
        weights are never downloaded: pass the file. An application gets its own
        ``preprocess_input`` of the raw pixels (the source's ``normalizing_const`` undone
        first), unless ``"preprocess_input": False``.
    layer : str, optional
        The layer whose output is the features (default: the backbone's output).
    pooling : {None, "avg", "max"}
        Global pooling of that output; None keeps ``(h, w, c)`` feature maps.
    batch_size : int
        Images per backbone batch on a worker.
    distribution_rules : optional
        Where a raw source is packed (and so where its features live); default
        ``"all_workers"`` (``"gpu_workers"`` with ``use_gpus``). A packed dataset's features
        always stay on the workers that hold its images.
    use_gpus : bool
        Run the backbone on the workers' GPUs; refused when a worker that holds images has no
        GPU.
    name : str, optional
        The cache's name; default ``features-<key[:12]>``. Without a name, an existing cache
        with the same key is returned whatever its name. A cache of that name with another
        key (other backbone, weights, layer, pooling, preprocessing or source data) is
        recomputed and replaced.
    overwrite : bool
        Recompute even when the key matches, and replace a dataset of that name that is not
        a feature cache.
    registry : Registry or str, optional
        Where an architecture id is looked up.
    client : distributed.Client, optional
        The cluster's client (default: the current one).
    training : str or Dataset, optional
        For a validation cache: the training feature cache it goes with (found by its key
        when the source was built by :func:`dvml.validation_preprocessor`). The backbone,
        layer and pooling must be the same.
    **preprocess_kwargs
        For raw images: passed to :func:`dvml.training_preprocessor` when they are packed
        first (``image_size``, ``normalizing_const``, ...).

    Returns
    -------
    Dataset
        Kind ``"feature_cache"``; pass it (or its name) to :func:`dvml.fit` as the training or
        validation set.

    Raises
    ------
    ModelMismatchError
        The layer does not exist, the images do not fit the backbone, a weights file does not
        match (all checked before any work).
    DatasetNotFoundError
        The source dataset does not exist (dropped).
    """
    client = current_client(client)
    layer, pooling = check_layer(layer), check_pooling(pooling)
    batch_size, name = check_batch_size(batch_size), check_cache_name(name)
    if not isinstance(use_gpus, bool):
        raise ArgumentTypeError(f"use_gpus must be True or False. Received: use_gpus={use_gpus!r}.")
    plan = plan_source(source, client, preprocess_kwargs)
    bb = resolve_backbone(
        backbone, layer, pooling, plan.input_shape, registry,
        normalizing_const=float(plan.preprocessing.get("normalizing_const") or 1.0),
    )  # fmt: skip
    link, training_cache = _training_link(client, plan, training, bb)
    rules = _check_placement(client, plan, distribution_rules, use_gpus, training_cache)
    key = cache_key(bb.fingerprint, layer, pooling, plan.preprocessing, plan.identity,
                    link and {"dataset_id": link["dataset_id"]})  # fmt: skip
    if name is None and not overwrite:
        # A hit depends on the key only: the same features cached under a given name are
        # served to a request that names none, instead of being computed again.
        same = by_key(client, KIND, key)
        if same is not None:
            logger.info("feature cache %s: hit (key %s)", same.name, key[:12])
            return same
    named = name is not None  # else a cache to extend is found by its lineage key
    name = name or default_name(key)

    found = existing(client, name)
    if found is not None:
        if found.kind != KIND and not overwrite:
            raise DatasetExistsError(
                f"A {found.kind} named {name!r} exists, and it is not a feature cache. "
                "Pass overwrite=True to replace it, or choose another name."
            )
        if found.kind == KIND and found.summary.get("cache_key") == key and not overwrite:
            if intact(client, found):
                logger.info("feature cache %s: hit (key %s)", name, key[:12])
                return found
            logger.warning("feature cache %s lost buffers with a worker: recomputing", name)
        else:
            logger.info("feature cache %s: key changed, recomputing", name)

    lineage = None
    if plan.dataset is not None:  # the key without the version: what an append may extend
        lineage = cache_key(bb.fingerprint, layer, pooling, plan.preprocessing,
                            {"dataset_id": plan.identity["dataset_id"]},
                            link and {"dataset_id": link["dataset_id"]})  # fmt: skip
        extended = _extend(client, plan, bb, key, lineage, found if named else None,
                           batch_size, use_gpus, link, overwrite)  # fmt: skip
        if extended is not None:
            return extended
    hidden, src = None, plan.dataset
    try:
        if src is None:  # a raw source: packed, refused whole at the pack's admission
            hidden = f"{INTERNAL_PREFIX}features-source/{name}"
            with admitting_also(_features_fit(client, bb, batch_size, name)):
                src = pack_source(plan, hidden, rules, client, training_cache)
        summary = _summary(plan, src, bb, key, name, batch_size, use_gpus, link, lineage)
        return _featurize(client, src, bb, batch_size, use_gpus, name, summary)
    finally:
        if hidden is not None:
            _drop_quietly(client, hidden)


def _features_fit(
    client: Client, bb: Backbone, batch_size: int, name: str
) -> Callable[[MemoryPlan, int], None]:
    """The check that the pack of a raw source runs once its own plan fits, before it writes
    a byte: the cache's plan, with the source's packed bytes, must fit too."""

    def check(packed: MemoryPlan, label_values: int) -> None:
        plan = source_cache_plan(client, bb, packed, label_values, batch_size)
        check_cache_fits(plan, name, batch_size)

    return check


def _extend(
    client: Client, plan: SourcePlan, bb: Backbone, key: str, lineage: str,
    named: Dataset | None, batch_size: int, use_gpus: bool, link: dict[str, Any] | None,
    overwrite: bool,
) -> Dataset | None:  # fmt: skip
    """The cache of an earlier version of the same dataset, extended with the features of
    the buffers appended since (:mod:`dvml.features.incremental`); None when there is none to
    extend (``named``: the cache of the requested name, else found by the lineage key)."""
    src = plan.dataset
    if src is None or overwrite:
        return None
    digests = source_digests(src.versions, src.version)
    candidates = (
        [named] if named is not None else with_summary(client, KIND, "lineage_key", lineage)
    )
    for prev in candidates:
        if prev.kind != KIND or not intact(client, prev):
            continue
        covered = covered_buffers(prev.summary, lineage, digests)
        if covered is None or covered >= src.version:
            continue
        positions = new_buffers(src.layout, covered)
        if not positions:  # a version with no new rows (the same buffers, moved): same features
            return prev
        summary = _summary(plan, src, bb, key, prev.name, batch_size, use_gpus, link, lineage)
        summary["dataset_id"] = prev.summary["dataset_id"]  # an append keeps it (validation)
        summary["incremental"] = {"from_version": covered, "buffers_computed": len(positions)}
        logger.info("feature cache %s: extending version %d of %s with %d new buffers",
                    prev.name, covered, src.name, len(positions))  # fmt: skip
        return _featurize(client, src, bb, batch_size, use_gpus, prev.name, summary,
                          positions, append_to=prev)  # fmt: skip
    return None


def _check_placement(client: Client, plan: SourcePlan, rules: Any, use_gpus: bool,
                     training_cache: Dataset | None) -> Any:  # fmt: skip
    """The rules a raw source is packed with; refuse GPUs where a worker has none.

    A raw validation source goes where its training cache's images went, unless told.
    """
    if plan.dataset is not None:
        if rules is not None:
            raise PlacementError(
                f"distribution_rules apply to raw sources only: the features of dataset "
                f"{plan.dataset.name!r} stay on the workers that hold its images. Received: "
                f"distribution_rules={rules!r}."
            )
        workers = source_workers(client, plan.dataset)
    else:
        if rules is None and training_cache is not None:
            rules = training_cache.summary["distribution_rules"]["given"]
        elif rules is None:
            rules = "gpu_workers" if use_gpus else "all_workers"
        workers = resolve_rules(DistributionRules.parse(rules), discover_workers(client))
    if use_gpus:
        without = sorted({w.name for w in workers if not w.gpus})
        if without:
            raise ClusterError(
                f"use_gpus=True but workers {without} hold images and have no GPU. Received: "
                f"workers {sorted({w.name for w in workers})}. Use distribution_rules="
                "'gpu_workers' (preprocess the images there), or use_gpus=False."
            )
    return rules


def _training_link(
    client: Client, plan: SourcePlan, training: str | Dataset | None, bb: Backbone
) -> tuple[dict[str, Any] | None, Dataset | None]:
    """For a validation cache: the training cache it belongs to, and its link record.

    The link (``{"name", "dataset_id"}``) becomes the cache's ``training_dataset``, which
    :func:`dvml.fit` checks against its training set.
    """
    origin = plan.dataset.summary.get("training_dataset") if plan.dataset is not None else None
    if training is None:
        return (None if origin is None else _find_training_cache(client, plan, origin, bb)), None
    name = training.name if isinstance(training, Dataset) else training
    found = describe_cache(name, client)
    if not _same_features(found.summary, bb):
        raise ModelMismatchError(
            f"The training cache {name!r} was computed with {found.summary['backbone']} "
            f"but this cache uses {bb.record()}. A validation cache needs the same "
            "backbone, weights, layer and pooling."
        )
    if origin is not None and origin["dataset_id"] not in (
        found.summary["source"]["dataset_id"], found.summary["dataset_id"],
    ):  # fmt: skip
        raise ModelMismatchError(
            f"The validation set {plan.description!r} was preprocessed for training set "
            f"{origin['name']!r}, but the training cache {name!r} holds the features of "
            "another dataset (or of an older version of it). Cache the training set again."
        )
    if plan.dataset is None:
        _check_like_cache(plan, found)
    return {"name": found.name, "dataset_id": found.summary["dataset_id"]}, found


def _find_training_cache(
    client: Client, plan: SourcePlan, origin: dict[str, Any], bb: Backbone
) -> dict[str, Any]:
    """The newest cache of the validation source's training set with the same features."""
    records = run_on(client, None, catalog.list_records)
    candidates = [r for r in records
                  if r["kind"] == KIND and _same_features(r["summary"], bb)
                  and r["summary"]["source"].get("dataset_id") == origin["dataset_id"]]  # fmt: skip
    if not candidates:
        raise ModelMismatchError(
            f"{plan.description!r} is a validation set of {origin['name']!r}, and no feature "
            f"cache of {origin['name']!r} with this backbone, layer and pooling exists. Cache "
            f"the training set first (dvml.features.cache({origin['name']!r}, ...)), or pass "
            "training= naming its cache."
        )
    newest = max(candidates, key=lambda r: r["summary"].get("created_at") or "")
    return {"name": newest["name"], "dataset_id": newest["summary"]["dataset_id"]}


def _check_like_cache(plan: SourcePlan, training: Dataset) -> None:
    """A raw validation source must be preprocessed as the training cache's images were."""
    s = training.summary
    wanted = {
        "image_size": s.get("source_image_size"),
        "channels": s.get("source_channels"),
        "normalizing_const": s.get("source_normalizing_const"),
    }
    given = {k: plan.preprocessing.get(k) for k in wanted}
    given["image_size"] = list(given["image_size"]) if given["image_size"] else None
    differ = {k: (given[k], v) for k, v in wanted.items() if v is not None and given[k] != v}
    if differ:
        raise ModelMismatchError(
            f"The validation images are preprocessed differently from the training cache "
            f"{training.name!r}: (given, training) = {differ}. Pass the training set's "
            "image_size, channels and normalizing_const."
        )


def _same_features(summary: dict[str, Any], bb: Backbone) -> bool:
    recorded = summary.get("backbone") or {}
    return (recorded.get("fingerprint"), recorded.get("layer"), recorded.get("pooling")) == (
        bb.fingerprint, bb.layer, bb.pooling,
    )  # fmt: skip


def _summary(plan: SourcePlan, src: Dataset, bb: Backbone, key: str, name: str,
             batch_size: int, use_gpus: bool, link: dict[str, Any] | None,
             lineage: str | None = None) -> dict[str, Any]:  # fmt: skip
    s = src.summary
    summary = {
        "kind": KIND,
        "dataset_id": uuid.uuid4().hex,
        "cache_key": key,
        "key_parts": {
            "backbone": bb.fingerprint,
            "layer": bb.layer,
            "pooling": bb.pooling,
            "preprocessing": plan.preprocessing,
            "source": plan.identity,
            "training": link and {"dataset_id": link["dataset_id"]},
        },
        "backbone": bb.record(),
        "source": {
            "kind": plan.kind,
            "description": plan.description,
            "name": src.name if plan.kind == "dataset" else None,
            "dataset_id": s["dataset_id"],
            "kept": plan.kind == "dataset",
            # what dvml.features.incremental needs to extend this cache after an append
            "version": src.version if plan.kind == "dataset" else None,
            "digests": source_digests(src.versions, src.version)
            if plan.kind == "dataset"
            else None,
        },
        "lineage_key": lineage,
        "source_table": plan.description,
        "output_table": name,
        "dependent_varname": s["dependent_varname"],
        "independent_varname": [["features"]],
        "dependent_vartype": s["dependent_vartype"],
        "class_values": s["class_values"],
        "num_classes": s["num_classes"],
        "normalizing_const": 1.0,  # features are used as they are
        "x_shapes": [list(bb.feature_shape)],
        "y_shape": list(s["y_shape"]),
        "dropped_rows": s.get("dropped_rows", 0),
        "distribution_rules": s["distribution_rules"],
        "image_size": None,
        "channels": None,
        "source_image_size": s.get("image_size"),
        "source_channels": s.get("channels"),
        "source_normalizing_const": s["normalizing_const"],
        "seed": s.get("seed"),
        "batch_size": batch_size,
        "use_gpus": use_gpus,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dvml_version": __version__,
    }
    if link is not None:
        summary["training_dataset"] = link
    return summary


def _featurize(client: Client, src: Dataset, bb: Backbone, batch_size: int, use_gpus: bool,
               name: str, summary: dict[str, Any], positions: list[int] | None = None,
               append_to: Dataset | None = None) -> Dataset:  # fmt: skip
    """Featurize ``src``'s buffers (those at ``positions`` only, to extend ``append_to``)."""
    targets = source_workers(client, src)
    if positions is None:
        positions = list(range(len(src.layout["buffers"])))
    buffers = [src.layout["buffers"][i] for i in positions]
    admit(client, src, bb, batch_size, name, targets, positions)
    targets = [targets[i] for i in positions]
    spec = bb.spec(use_gpus)
    addresses = sorted({t.address for t in targets})
    # A list of one: Client.scatter would read a dict as {key: data}.
    shared = client.scatter([spec], workers=addresses, broadcast=True, hash=False)[0]
    dataset_id = src.summary["dataset_id"]
    started = time.perf_counter()

    def produce(run_id: str) -> list[dict[str, Any]]:
        from distributed import Event

        abort_name = f"dvml-features-abort-{run_id}"

        def submit(i: int, address: str, attempt: int) -> Any:
            # A retry may follow a dead worker, which took its copy of the spec along.
            arg = (
                shared if attempt == 1 else client.scatter([spec], workers=[address], hash=False)[0]
            )
            index = buffers[i]["index"]
            return client.submit(
                featurize.featurize_buffer, src.name, dataset_id, index, arg, batch_size,
                staging_name(run_id, index, attempt), abort_name, workers=[address],
                allow_other_workers=False, pure=False, retries=0,
            )  # fmt: skip

        abort = Event(abort_name, client=client)
        try:
            results = run_pinned(client, submit, targets, "featurization", abort=abort.set)
        finally:
            abort.clear()  # events live on the scheduler until cleared
        for b, r in zip(buffers, results, strict=True):
            if r["instance_id"] != b["instance_id"]:  # never expected: pinned to its worker
                raise StoreError(
                    f"Features of buffer {b['index']} landed on vineyard instance "
                    f"{r['instance_id']}, not beside their images on {b['instance_id']}."
                )
        # the cache's own buffer numbers: 0, 1, ... (an extension's follow the cache's)
        return [{**r, "index": k} for k, r in enumerate(results)]

    def finish(summary: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **summary,
            "devices": {r["worker_name"]: r["device"] for r in results},
            "featurize_seconds": time.perf_counter() - started,
        }

    try:
        return publish_run(client, name, KIND, summary, produce, finish, append_to=append_to)
    finally:
        client.cancel([shared])


def _drop_quietly(client: Client, name: str) -> None:
    try:
        drop(name, client=client)
    except Exception:  # gone already, or the cluster is failing: nothing more to free
        logger.warning("could not drop the packed source %s", name, exc_info=True)
