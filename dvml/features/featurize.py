"""Worker-side steps of the feature cache (top-level functions, run as pinned Dask tasks).

:func:`featurize_buffer` runs the feature extractor over one buffer of images that lives in
this worker's vineyardd and puts the features beside it. The extractor is built once per
worker process and reused by every later task that asks for the same backbone, layer and
pooling (its ``key``); :data:`CALLS` counts builds and batches so that tests can tell a cache
hit (no batch run) from a miss. :func:`save_buffer` and :func:`load_buffer` write and read one
buffer as ``.npy`` files for :mod:`dvml.features.persist`.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.cluster.connection import this_worker_name
from dvml.cluster.workers import worker_host
from dvml.exceptions import StoreError
from dvml.registry.weights import weights_from_bytes
from dvml.resolve.partitions import open_local
from dvml.store.tensors import put_arrays

__all__ = [
    "CALLS",
    "calls",
    "extractor_for",
    "featurize_buffer",
    "load_buffer",
    "read_buffers",
    "save_buffer",
]

# Extractors kept per process (a backbone can be large); the cache's lock makes two tasks of
# one worker that want the same extractor build it once.
_MODELS = tf_runtime.ModelCache(2)
CALLS = {"builds": 0, "batches": 0, "rows": 0}
"""In this process: extractors built, backbone batches run and rows featurized."""


def calls() -> dict[str, int]:
    """A copy of :data:`CALLS` (run it with ``client.run`` to read every worker's counts)."""
    return dict(CALLS)


def extractor_for(spec: dict[str, Any]) -> tuple[Any, str]:
    """The feature extractor of ``spec`` and the device it runs on, built once per process."""
    device = tf_runtime.device_for(bool(spec.get("use_gpus")))

    def build() -> Any:
        with tf_runtime.tensorflow().device(device):
            model = tf_runtime.build_model(spec["model_json"], weights_from_bytes(spec["weights"]))
        CALLS["builds"] += 1
        return model

    # The device is part of the key: a model's variables live where it was built.
    return _MODELS.get((spec["key"], device), build), device


def _where() -> dict[str, str]:
    from distributed import get_worker

    worker = get_worker()
    return {
        "worker": worker.address,
        "worker_name": str(worker.name),
        "host": worker_host(worker.address),
    }


def _local_buffer(parts: Any, name: str, dataset_id: str, index: int) -> int:
    if parts.summary.get("dataset_id") != dataset_id:
        raise StoreError(
            f"Dataset {name!r} was replaced while this task ran: it now has dataset_id "
            f"{parts.summary.get('dataset_id')!r}, not {dataset_id!r}. Nothing was computed "
            "from the new data; run the call again."
        )
    if index not in parts.buffer_indices:
        raise StoreError(
            f"Buffer {index} of {name!r} is not on {this_worker_name()} (vineyard instance "
            f"{parts.instance_id}), which holds buffers {parts.buffer_indices}."
        )
    return parts.buffer_indices.index(index)


class _Abort:
    """Whether the client gave up on this run (checked at most every ``interval`` seconds)."""

    def __init__(self, name: str | None, interval: float = 0.5) -> None:
        self.name, self.interval, self.last = name, interval, 0.0

    def check(self, force: bool = False) -> None:
        if self.name is None:
            return
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        from distributed import Event

        if Event(self.name).is_set():
            raise StoreError(
                "The run this task belongs to failed elsewhere and was abandoned; nothing was "
                "put. (This error is expected after another buffer's failure.)"
            )


def featurize_buffer(
    source: str,
    dataset_id: str,
    index: int,
    spec: dict[str, Any],
    batch_size: int,
    staging_name: str,
    abort_event: str | None = None,
) -> dict[str, Any]:
    """Run the extractor over buffer ``index`` of ``source`` and put the features HERE.

    Returns the new buffer's layout record (``index``, ``rows``, ``instance_id``, worker,
    ``fields``: ``x_0`` the float32 features, ``y`` the source's one-hot labels) plus the
    ``device`` and ``seconds`` it took. Objects are put under ``staging_name`` until published.
    When the Dask event ``abort_event`` is set (the run failed elsewhere), the task stops
    between batches and puts nothing.
    """
    start = time.perf_counter()
    abort = _Abort(abort_event)
    parts = open_local(source, require=False)
    try:
        pos = _local_buffer(parts, source, dataset_id, index)
        # the cache is in the float32 format whatever its source's: one-hot y, and each
        # batch of a compact source's raw pixels normalized as the backbone reads them
        x, y = parts.fields["x_0"][pos], parts.one_hot_y(parts.fields["y"][pos])
        model, device = extractor_for(spec)
        features = np.empty((len(x), *spec["feature_shape"]), dtype=np.float32)
        with tf_runtime.tensorflow().device(device):
            for lo in range(0, len(x), batch_size):
                abort.check()
                hi = min(len(x), lo + batch_size)
                features[lo:hi] = model.predict_on_batch(parts.float32_x(x[lo:hi]))
                CALLS["batches"] += 1
        CALLS["rows"] += len(x)
        abort.check(force=True)
        record = put_arrays({"x_0": features, "y": y}, staging_name=staging_name)
    finally:
        parts.close()
    return {
        "index": index,
        "rows": len(features),
        "instance_id": record["instance_id"],
        **_where(),
        "fields": record["fields"],
        "device": device,
        "seconds": time.perf_counter() - start,
    }


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def save_buffer(name: str, dataset_id: str, index: int, directory: str) -> dict[str, Any]:
    """Write buffer ``index`` of ``name`` (held HERE) into ``directory/<worker name>/``.

    Each file is written under a temporary name and renamed, so a file is whole or absent.
    """
    where = _where()
    folder = _safe(where["worker_name"])
    os.makedirs(os.path.join(directory, folder), exist_ok=True)
    parts = open_local(name, require=False)
    try:
        pos = _local_buffer(parts, name, dataset_id, index)
        files = {}
        for field, arrays in parts.fields.items():
            array = arrays[pos]
            relative = f"{folder}/buffer-{index:05d}.{field}.npy"
            path = os.path.join(directory, relative)
            with open(path + ".tmp", "wb") as f:
                np.save(f, array, allow_pickle=False)
            os.replace(path + ".tmp", path)
            files[field] = {
                "path": relative,
                "shape": list(array.shape),
                "dtype": str(array.dtype),
                "sha256": _digest(array),
            }
        rows = len(parts.fields["y"][pos])
    finally:
        parts.close()
    return {"index": index, "worker_name": where["worker_name"], "rows": rows, "files": files}


def _read(directory: str, meta: dict[str, Any]) -> np.ndarray:
    path = os.path.join(directory, meta["path"])
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"Cannot read {path} on {this_worker_name()}: {exc}. The save is incomplete here, "
            "or this host does not see the directory: on a real cluster each host keeps the "
            "files its workers wrote, so load where the same worker names run."
        ) from None
    if list(array.shape) != meta["shape"] or str(array.dtype) != meta["dtype"]:
        raise StoreError(
            f"{path} holds {array.dtype} {list(array.shape)}, but the manifest says "
            f"{meta['dtype']} {meta['shape']}. The file was changed since it was saved."
        )
    if _digest(array) != meta["sha256"]:
        raise StoreError(
            f"{path} does not match the checksum in the manifest: it was changed or damaged "
            "since it was saved. Save the cache again."
        )
    return array


def load_buffer(
    directory: str,
    pieces: Sequence[tuple[dict[str, Any], np.ndarray | None]],
    index: int,
    staging_name: str,
) -> dict[str, Any]:
    """Assemble one buffer from saved files and put it HERE.

    ``pieces`` are ``(files of a saved buffer, row indices or None for all rows)``; the rows
    of every piece are concatenated, field by field.
    """
    fields: dict[str, list[np.ndarray]] = {}
    for files, rows in pieces:
        for field, meta in files.items():
            array = _read(directory, meta)
            fields.setdefault(field, []).append(
                np.asarray(array) if rows is None else array[np.sort(rows)]
            )
    arrays = {f: np.concatenate(parts) if len(parts) > 1 else np.ascontiguousarray(parts[0])
              for f, parts in fields.items()}  # fmt: skip
    record = put_arrays(arrays, staging_name=staging_name)
    return {
        "index": index,
        "rows": len(arrays["y"]),
        "instance_id": record["instance_id"],
        **_where(),
        "fields": record["fields"],
    }


def read_buffers(name: str) -> dict[int, dict[str, np.ndarray]]:
    """Copies of this worker's buffers of ``name``: ``{buffer index: {field: array}}``."""
    parts = open_local(name, require=False)
    try:
        return {
            index: {field: np.array(arrays[pos]) for field, arrays in parts.fields.items()}
            for pos, index in enumerate(parts.buffer_indices)
        }
    finally:
        parts.close()
