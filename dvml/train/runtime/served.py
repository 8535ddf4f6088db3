"""Registered models served by a trainer process: ``evaluate`` and ``predict`` without
TensorFlow in the Dask workers.

A *model spec* is what a process needs to rebuild a registered model: ``key`` (name, version
and a digest of weights and architecture), ``model_json``, ``weights`` (registry bytes), the
parsed ``compile_params`` and the ``custom_objects``' sources (see
:func:`dvml.train.predict.model_spec`). The worker writes a spec once per session into the
session's private directory (:func:`write_spec`: JSON beside the weights' ``.npz``); the
trainer process builds the model on the first command that names its key and keeps the last
:data:`CACHED` models compiled (:class:`ServedModels`), so consecutive calls of one client
pay neither TensorFlow's import nor a rebuild.

Rows travel as files in the session's owner-only directory: the Dask task writes the feature
arrays of its partition as ``.npy`` files (one copy, into the page cache), the trainer maps them
(``mmap_mode="r"``, no second copy before TensorFlow's own) and writes the raw outputs back
as one ``.npy``. Packed datasets do not travel at all: the trainer resolves its worker's LOCAL
partitions from vineyardd's shared memory (zero-copy), as for training.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.resolve.partitions import open_local
from dvml.train.runtime.local_model import local_metrics
from dvml.train.runtime.protocol import Predict, Predicted, Score, Scored

__all__ = ["CACHED", "ServedModels", "read_spec", "write_spec"]

CACHED = 4  # compiled models one serving process keeps (least recently used out)

_WEIGHTS = "weights"


def write_spec(directory: str, name: str, spec: dict[str, Any]) -> str:
    """Write ``spec`` as ``NAME.json`` (and ``NAME.npz``, its weights) in ``directory``;
    returns the JSON's path (what :class:`~dvml.train.runtime.protocol.Score` and
    :class:`~dvml.train.runtime.protocol.Predict` name)."""
    path = os.path.join(directory, f"{name}.json")
    meta = {k: v for k, v in spec.items() if k != _WEIGHTS}
    blob = spec.get(_WEIGHTS)
    if blob is not None:
        meta["weights_path"] = os.path.join(directory, f"{name}.npz")
        with open(meta["weights_path"], "wb", opener=_private) as f:
            f.write(blob)
    with open(path, "w", opener=_private) as f:
        json.dump(meta, f)
    return path


def read_spec(path: str) -> dict[str, Any]:
    """The spec :func:`write_spec` wrote (its weights as bytes, None when it has none)."""
    with open(path) as f:
        spec: dict[str, Any] = json.load(f)
    weights_path = spec.pop("weights_path", None)
    spec[_WEIGHTS] = None
    if weights_path is not None:
        with open(weights_path, "rb") as w:
            spec[_WEIGHTS] = w.read()
    return spec


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class ServedModels:
    """(Inside a trainer process.) Registered models built from their specs, cached by key."""

    def __init__(self) -> None:
        self.cache = tf_runtime.ModelCache(CACHED)
        self.builds = 0  # how many models this process built (tests count cache hits)

    def model(self, key: str, spec_path: str) -> Any:
        """The compiled tf-keras model of ``key``, built from ``spec_path`` on first use."""

        def build() -> Any:
            from dvml.configs import compile_kwargs
            from dvml.registry.custom import custom_objects_from_sources
            from dvml.registry.weights import weights_from_bytes

            spec = read_spec(spec_path)
            custom = custom_objects_from_sources(spec.get("custom_objects") or {})
            params = spec.get("compile_params")
            kwargs = compile_kwargs(params, custom) if params else None
            blob = spec.get(_WEIGHTS)
            weights = weights_from_bytes(blob) if blob is not None else None
            model = tf_runtime.build_model(spec["model_json"], weights, custom, kwargs)
            self.builds += 1
            return model

        return self.cache.get(key, build)

    def score(self, command: Score) -> Scored:
        """Loss and metrics on this worker's LOCAL rows of the command's dataset."""
        parts = open_local(command.dataset, require=False)
        try:
            if parts.rows == 0:
                return Scored(rows=0, values={})
            model = self.model(command.model, command.spec)
            result = local_metrics(model, parts, int(command.batch_size))
            return Scored(rows=int(result["rows"]), values=result["values"])
        finally:
            parts.close()

    def predict(self, command: Predict) -> Predicted:
        """The model's raw outputs for the rows in the command's input files."""
        model = self.model(command.model, command.spec)
        xs = [np.load(path, mmap_mode="r", allow_pickle=False) for path in command.inputs]
        outputs = model.predict(
            xs[0] if len(xs) == 1 else xs, batch_size=int(command.batch_size), verbose=0
        )
        if isinstance(outputs, list | tuple):
            # a multi-output model: its outputs side by side, split again by the client
            outputs = np.concatenate([np.reshape(o, (len(o), -1)) for o in outputs], axis=1)
        with open(command.output, "wb", opener=_private) as f:
            np.save(f, np.asarray(outputs), allow_pickle=False)
        return Predicted(rows=len(xs[0]), output=command.output)
