"""The transfer-learning feature cache: a backbone runs where the images live, once.

This package owns feature caches: datasets of kind ``"feature_cache"`` whose ``x_0`` holds a
backbone's features and ``y`` the source's labels, keyed by (backbone architecture + weights,
layer, pooling, preprocessing, source data). Heads are then fine-tuned on a cache with
:func:`dvml.fit` as on any dataset, without running the backbone again. It leaves packing
images to :mod:`dvml.preprocess`, storage to :mod:`dvml.store` and training to
:mod:`dvml.train`.

::

    cache(source, backbone, layer, pooling)   compute, or return the cache with the same key
    list() / describe(name) / drop(name)      the caches, their memory per worker
    save(name, directory) / load(directory)   keep a cache across a cluster restart
    calls()                                   backbone batches run on the workers (cache hits)
    to_numpy(name)                            a small cache's features on the client, to look at

Modules: :mod:`~dvml.features.keys` (pure: fingerprints and the key),
:mod:`~dvml.features.backbone` (building and checking a backbone on the client),
:mod:`~dvml.features.source` (what the features are computed from),
:mod:`~dvml.features.featurize` (the tasks on the workers), :mod:`~dvml.features.build`
(``cache``), :mod:`~dvml.features.manage` and :mod:`~dvml.features.persist`.
"""

from dvml.features.build import cache
from dvml.features.manage import KIND, calls, describe, drop, list, to_numpy
from dvml.features.persist import load, save

__all__ = ["KIND", "cache", "calls", "describe", "drop", "list", "load", "save", "to_numpy"]
