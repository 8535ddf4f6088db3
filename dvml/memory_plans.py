"""``dvml.plan``: a job's memory plan, computed as the job would, without doing the job.

:func:`fit`, :func:`fit_multiple`, :func:`run` and :func:`pack` are :mod:`dvml.train.plans`';
this module adds :func:`features`, the plan of a feature cache (:mod:`dvml.features` and
:mod:`dvml.train` are siblings, so the namespace that holds both sits above them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import current_client
from dvml.exceptions import PlacementError
from dvml.features.backbone import resolve_backbone
from dvml.features.cache_memory import cache_memory_plan, dataset_rows, source_cache_plan
from dvml.features.keys import check_batch_size, check_layer, check_pooling
from dvml.features.lookup import source_workers
from dvml.features.source import pack_source, plan_source
from dvml.placement.feature_memory import FeatureMemoryPlan
from dvml.preprocess.admission import Planned, planning_only
from dvml.train.plans import fit, fit_multiple, pack, run

if TYPE_CHECKING:
    from distributed import Client

    from dvml.registry import Registry

__all__ = ["features", "fit", "fit_multiple", "pack", "run"]


def features(
    source: Any,
    backbone: Any,
    layer: str | None = None,
    pooling: str | None = None,
    batch_size: int = 64,
    distribution_rules: Any = None,
    registry: Registry | str | None = None,
    client: Client | None = None,
    **preprocess_kwargs: Any,
) -> FeatureMemoryPlan:
    """The memory plan of ``dvml.features.cache(source, backbone, layer, pooling, ...)``.

    The backbone is built and checked on the client as the cache does; each worker holding
    images is read once (its vineyardd, its host, whether TensorFlow is imported there).
    Nothing is computed or written. A raw source (arrays, an image folder, shards) is read and
    its rows counted as its pack would (:func:`pack`), then planned with its packed bytes
    written first (the ``source`` column); each worker's rows are taken as one buffer.

    Parameters
    ----------
    source, backbone, layer, pooling, batch_size, distribution_rules : as for features.cache
        What :func:`dvml.features.cache` takes.
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).
    **preprocess_kwargs
        For a raw source: the arguments of its pack (:func:`pack`).

    Returns
    -------
    FeatureMemoryPlan
        ``.fits``, ``.table()`` (one row per worker), ``.describe()``, ``.fixes``.
    """
    client = current_client(client)
    batch_size = check_batch_size(batch_size)
    src = plan_source(source, client, preprocess_kwargs)
    bb = resolve_backbone(
        backbone, check_layer(layer), check_pooling(pooling), src.input_shape, registry,
        normalizing_const=float(src.preprocessing.get("normalizing_const") or 1.0),
    )  # fmt: skip
    if src.dataset is not None:
        ds = src.dataset
        targets = source_workers(client, ds)
        rows = dataset_rows(ds.layout, targets, range(len(ds.layout["buffers"])))
        return cache_memory_plan(
            client, bb, _label_values(ds.summary["y_shape"]), batch_size, rows, targets,
            compact=bool((ds.summary.get("storage") or {}).get("compact")),
        )  # fmt: skip
    try:
        with planning_only():
            pack_source(src, "dvml-plan-features", distribution_rules, client)
    except Planned as planned:
        return source_cache_plan(client, bb, planned.plan, planned.label_values, batch_size)
    # a preprocessor path that skipped its plan: a dvml bug
    raise PlacementError("The source was packed without its memory plan. Report this bug.")


def _label_values(y_shape: Any) -> int:
    return math.prod(int(d) for d in y_shape)
