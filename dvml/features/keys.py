"""Pure pieces of the feature cache: fingerprints, the cache key, names and argument checks.

The cache key is a sha256 over everything that determines the features: the backbone (its
architecture JSON and weight bytes), the layer, the pooling, the preprocessing parameters and
the identity of the source data. Plain values in, plain values out; no Dask, vineyard or TF.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from dvml.exceptions import ArgumentError, ArgumentTypeError

__all__ = [
    "POOLINGS",
    "cache_key",
    "check_batch_size",
    "check_cache_name",
    "check_layer",
    "check_pooling",
    "default_name",
    "json_fingerprint",
    "weights_fingerprint",
]

POOLINGS = (None, "avg", "max")
NAME_PREFIX = "features-"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def json_fingerprint(model_json: str) -> str:
    """sha256 of a Keras architecture JSON, insensitive to key order and whitespace."""
    try:
        parsed = json.loads(model_json)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(
            f"The backbone's architecture is not valid JSON: {exc}. Received: "
            f"{str(model_json)[:80]!r}. Pass a tf-keras model or model.to_json()."
        ) from None
    return hashlib.sha256(_canonical(parsed)).hexdigest()


def weights_fingerprint(weights: Sequence[np.ndarray]) -> str:
    """sha256 over every weight array's dtype, shape and bytes, in order."""
    h = hashlib.sha256()
    h.update(str(len(weights)).encode())
    for array in weights:
        a = np.ascontiguousarray(array)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def cache_key(
    backbone: str,
    layer: str | None,
    pooling: str | None,
    preprocessing: dict[str, Any],
    source: dict[str, Any],
    training: dict[str, Any] | None = None,
) -> str:
    """The cache key: sha256 of the parts that determine the features.

    Parameters
    ----------
    backbone : str
        Fingerprint of the backbone (architecture JSON + weights), from :func:`json_fingerprint`
        and :func:`weights_fingerprint`.
    layer, pooling : str or None
        The output layer (None: the backbone's output) and the pooling.
    preprocessing : dict
        ``image_size``, ``channels``, ``normalizing_const`` (and what else shaped the input).
    source : dict
        The identity of the source data: a dataset's ``dataset_id`` (new whenever it is
        preprocessed again), or a token of raw arrays or files.
    training : dict, optional
        For a validation cache, the identity of the training cache it belongs to.
    """
    parts = {
        "version": 1,
        "backbone": backbone,
        "layer": layer,
        "pooling": pooling,
        "preprocessing": preprocessing,
        "source": source,
        "training": training,
    }
    return hashlib.sha256(_canonical(parts)).hexdigest()


def default_name(key: str) -> str:
    """The name of a cache given without ``name=``: ``features-<key[:12]>``."""
    return f"{NAME_PREFIX}{key[:12]}"


def check_cache_name(name: Any) -> str | None:
    if name is None:
        return None
    from dvml.names import check_name

    return check_name(name)


def check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ArgumentTypeError(
            f"batch_size must be a positive int. Received: batch_size={batch_size!r}."
        )
    if batch_size < 1:
        raise ArgumentError(
            f"batch_size must be a positive int. Received: batch_size={batch_size!r}."
        )
    return int(batch_size)


def check_pooling(pooling: Any) -> str | None:
    if pooling not in POOLINGS:
        raise ArgumentError(
            f"pooling must be None, 'avg' or 'max'. Received: pooling={pooling!r}. None keeps "
            "the layer's output as it is (for example (h, w, c) feature maps)."
        )
    return None if pooling is None else str(pooling)


def check_layer(layer: Any) -> str | None:
    if layer is not None and (not isinstance(layer, str) or not layer):
        raise ArgumentTypeError(
            f"layer must be None (the backbone's output) or a layer name. Received: "
            f"layer={layer!r}."
        )
    return layer
