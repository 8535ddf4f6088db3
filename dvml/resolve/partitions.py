"""Open the local partitions of a named dataset through the local vineyardd (zero-copy).

Only members whose vineyard instance is the local one are resolved, through the IPC client:
``vineyard.Client.get`` of a global object would fetch every remote blob over RPC and hand
the trainer the WHOLE dataset, copied (see COMPAT.md).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from dvml.cluster.connection import local_client, this_worker_name
from dvml.exceptions import DatasetNotFoundError, TrainingError
from dvml.store import readers
from dvml.store.tensors import release_views

__all__ = ["LocalPartitions", "aligned_empty", "open_local"]

# TensorFlow wraps a numpy array as a tensor without a copy only when its data is aligned to
# this many bytes (EIGEN_MAX_ALIGN_BYTES); otherwise tf.data copies every batch once more.
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGNMENT`` boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@dataclasses.dataclass
class LocalPartitions:
    """The local buffers of one dataset: per field, a list of read-only shared-memory views."""

    name: str
    summary: dict[str, Any]
    instance_id: int
    buffer_indices: list[int]
    fields: dict[str, list[np.ndarray]]
    _client: Any = dataclasses.field(repr=False, default=None)
    # Object ids pinned for this reader (dvml.store.readers): a drop in this process defers
    # their delete until close().
    _pinned: list[int] = dataclasses.field(repr=False, default_factory=list)

    @property
    def x_fields(self) -> list[str]:
        return sorted((f for f in self.fields if f.startswith("x_")), key=lambda f: int(f[2:]))

    @property
    def y_fields(self) -> list[str]:
        """``["y"]``, or a multi-output set's ``["y", "y_1", ...]`` (one field per output)."""
        more = sorted((f for f in self.fields if f.startswith("y_")), key=lambda f: int(f[2:]))
        return ["y", *more]

    @property
    def buffer_rows(self) -> tuple[int, ...]:
        return tuple(len(a) for a in self.fields["y"])

    @property
    def rows(self) -> int:
        return int(sum(self.buffer_rows))

    @property
    def compact(self) -> bool:
        """Whether the dataset is packed in the compact format (raw x, y as class indices)."""
        return bool((self.summary.get("storage") or {}).get("compact"))

    def float32_x(self, x: np.ndarray) -> np.ndarray:
        """Rows of an x field as the model reads them: float32, normalized (a compact
        dataset's raw pixels are scaled here; the float32 format is returned as it is)."""
        if not self.compact or x.dtype == np.float32:
            return x
        const = float(self.summary["normalizing_const"])
        out = x.astype(np.float32)
        return out / const if const != 1.0 else out

    def one_hot_y(self, y: np.ndarray) -> np.ndarray:
        """Rows of y as one-hot float32 (a compact dataset stores class indices, unless its
        labels came already one-hot encoded)."""
        if not self.compact or y.dtype == np.float32:
            return y
        depth = int(self.summary["y_shape"][0])
        return np.eye(depth, dtype=np.float32)[y.astype(np.int64)]

    def take(self, pieces: list[tuple[int, np.ndarray]]) -> dict[str, np.ndarray]:
        """Gather one batch: ONE copy of just the rows asked for, from the views.

        Rows are gathered straight into a 64-byte aligned array, which TensorFlow adopts
        without copying it again (it copies any numpy array that is not 64-byte aligned, and
        numpy's own allocations are only 16-byte aligned). Gathering piece by piece and
        concatenating would copy every row twice.
        """
        rows = sum(len(idx) for _, idx in pieces)
        batch = {}
        for field, arrays in self.fields.items():
            first = arrays[pieces[0][0]]
            out = aligned_empty((rows, *first.shape[1:]), first.dtype)
            start = 0
            for b, idx in pieces:
                # mode="clip" writes straight into `out` (the default "raise" buffers the
                # result first); BatchPlan's indices are in range by construction.
                np.take(arrays[b], idx, axis=0, out=out[start : start + len(idx)], mode="clip")
                start += len(idx)
            batch[field] = out
        return batch

    def close(self) -> None:
        """Drop the views (they must not be used afterwards).

        The process's vineyard connection stays open: it is shared by every user in the
        process (see :func:`dvml.cluster.connection.local_client`). A drop of the dataset that
        waited for this reader frees the memory now.
        """
        self.fields = {f: [] for f in self.fields}
        self._client = None
        pinned, self._pinned = self._pinned, []
        if pinned:
            release_views(pinned)


def open_local(name: str, require: bool = True, socket: str | None = None) -> LocalPartitions:
    """Resolve the buffers of dataset ``name`` that live on this process's vineyardd.

    Parameters
    ----------
    name : str
        The dataset (or feature cache) name.
    require : bool
        Raise when this instance holds no buffer of the dataset (a trainer with nothing to
        train on), instead of returning empty fields.

    Raises
    ------
    DatasetNotFoundError
        No dataset of that name.
    TrainingError
        ``require`` and no local buffer: names the worker and where the buffers are.

    Notes
    -----
    The fields are zero-copy views of vineyardd's shared memory: a drop or overwrite of the
    dataset frees it under them. What protects a reader is a *lease* on the dataset
    (:func:`dvml.store.leases.holding`): :func:`dvml.fit` and the other jobs hold one for
    their trainers, and a process of your own that reads through this function should hold
    one too (``with holding([name], job="my reader") as lease: ...``) for as long as it uses
    the views; a drop or overwrite is then refused unless forced, and a forced one makes
    ``lease.check()`` raise.
    """
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    client = local_client(socket)
    try:
        root = client.get_meta(client.get_name(name))
    except Exception:
        raise DatasetNotFoundError(
            f"No dataset named {name!r} in vineyard (looked up from {this_worker_name()}). "
            "List datasets with dvml.datasets.list()."
        ) from None
    layout = json.loads(root["dvml_layout"])
    summary = json.loads(root["dvml_summary"])
    me = int(client.instance_id)
    local = [b for b in layout["buffers"] if b["instance_id"] == me]
    if require and not local:
        where = sorted({b["worker_name"] for b in layout["buffers"]})
        raise TrainingError(
            f"{this_worker_name()} (vineyard instance {me}) holds no partition of dataset "
            f"{name!r}; its buffers are on {where}. Train on the workers that hold the data "
            "(dvml.fit does so), or preprocess with distribution_rules naming this worker."
        )
    ipc = client.ipc_client
    fields: dict[str, list[np.ndarray]] = {f: [] for f in layout["fields"]}
    # Pin before mapping: a drop from now on waits for close(); one that came first left
    # nothing to map, which is reported below instead of reading freed memory.
    pinned = readers.pin(obj["id"] for buf in local for obj in buf["fields"].values())
    try:
        for buf in local:
            for field, obj in buf["fields"].items():
                oid = vineyard.ObjectID(obj["id"])
                try:
                    meta = ipc.get_meta(oid)
                except Exception:
                    raise DatasetNotFoundError(
                        f"Dataset {name!r} was dropped or replaced while {this_worker_name()} "
                        "opened it. Run the call again (it reads the current dataset)."
                    ) from None
                if not meta.islocal:  # never expected: the layout says local
                    raise TrainingError(f"Buffer {buf['index']} of {name!r} is not local.")
                fields[field].append(ipc.get(oid))
    except BaseException:
        release_views(pinned)
        raise
    return LocalPartitions(
        name=name,
        summary=summary,
        instance_id=me,
        buffer_indices=[b["index"] for b in local],
        fields=fields,
        _client=client,
        _pinned=pinned,
    )
