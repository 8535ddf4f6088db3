"""Tensors written in place into the LOCAL vineyardd, from inside a worker; their deletion.

Everything here runs in a process whose ``VINEYARD_IPC_SOCKET`` points at its own vineyardd.
Tensors are allocated as blobs of the local daemon and filled in place, never put through
``Client.put``: on a full daemon ``Client.put`` silently re-puts the object on another
instance, which would break placement.

Staged buffers cost no etcd round trip: their tensors and one wrapper object that names the run
(:data:`STAGED_TYPENAME`) are created in two local calls, however many buffers one call writes
(:func:`write_buffers`), and stay *transient* (known to this vineyardd only) until the run is
published; :mod:`dvml.store.staging` finds, persists and discards them per instance. Every
metadata write that goes through etcd (persist, a name, deleting a persisted object) takes
vineyard's cluster-wide metadata lock, about six etcd requests each, serialised over all
workers: writing them per field and buffer made packing slower the more buffers it wrote.

vineyardd frees nothing of a client that dies: a blob that the process sealed, or a tensor it
created, but had not yet wrapped in a staged object (or persisted) would stay, referenced by
nothing, until the daemon restarts. So a writer holds its vineyardd's *allocation lock*
(:func:`allocation_lock`, an ``flock`` that the kernel drops with its holder) from its first
blob until everything is referenced, and a run's cleanup takes it exclusively to delete the
blobs that no object references, and dvml's transient tensors that nothing references and no
staged wrapper lists (:func:`dvml.store.staging.sweep_orphans`): whatever a killed writer left
between sealing and staging. Inside that window a writer also keeps a marker file beside the
lock (:func:`writers_died`): a marker that outlives its writer says that a sweep is needed, so a
cleanup does not list every object of the vineyardd when no writer died (at thousands of objects
that listing took most of a pack's cleanup).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import itertools
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dvml.cluster.connection import local_client, this_worker_name
from dvml.exceptions import StoreError, VineyardMemoryError
from dvml.store import readers
from dvml.store.versions import field_digest

__all__ = [
    "STAGED_TYPENAME",
    "STAGING_PREFIX",
    "WRITER_KEY",
    "allocation_lock",
    "clear_writer_markers",
    "delete_objects",
    "memory_advice",
    "put_arrays",
    "release_views",
    "vineyard_room",
    "write_arrays",
    "write_buffers",
    "writers_died",
]

# A staged wrapper carries `<STAGING_PREFIX><run id>/<buffer>/<attempt>` (its "staging
# name", a metadata value, not a vineyard name) between its put and the publication
# of the dataset, so that the objects of a failed or retried run can be found and deleted: no
# orphan stays in any vineyardd.
STAGING_PREFIX = "__dvml_staging__/"
# The wrapper of the buffers one call staged: a local object that lists their tensors' ids.
STAGED_TYPENAME = "dvml::StagedBuffer"
# Carried by every tensor dvml writes (the staging name, or "" for one persisted at once): a
# transient tensor with this key that nothing references and no wrapper lists was left by a
# killed writer.
WRITER_KEY = "dvml_writer"
# The allocation lock of a vineyardd is this file beside its socket (see allocation_lock).
_LOCK_SUFFIX = ".dvml-alloc.lock"
# A writer's marker inside its window: `<lock><_MARKER>.<pid>.<thread>.<n>` (see writers_died).
_MARKER = ".writer"
_MARKER_COUNT = itertools.count()

logger = logging.getLogger("dvml.store")

Shape = tuple[int, ...]


@contextlib.contextmanager
def allocation_lock(client: Any, exclusive: bool = False) -> Iterator[bool]:
    """Hold the allocation lock of ``client``'s vineyardd; yield whether it is held.

    Writers hold it shared from their first blob until every blob they made is referenced by an
    object (a tensor that a staged wrapper lists, or a persisted tensor), with a marker file of
    their own beside it (:func:`writers_died`); the sweep of orphaned blobs holds it
    exclusively, so that it never takes a live writer's blob for an orphan. It is an ``flock``
    on a file beside the daemon's socket: the kernel releases it when its holder dies, so a
    writer killed while holding it blocks nobody. Where that file cannot be opened (a socket in
    a directory this user cannot write), nothing is held and False is yielded: writers go on,
    and the sweep, which needs the lock, does not run.
    """
    lock = _lock_path(client)
    fd, marker = -1, ""
    if lock:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            logger.debug("no allocation lock at %s: %s", lock, exc)
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            if not exclusive:  # after the lock: a sweep never sees a live writer's marker
                marker = _leave_marker(lock)
        yield fd >= 0
    finally:
        if marker:
            with contextlib.suppress(OSError):
                os.unlink(marker)
        if fd >= 0:
            os.close(fd)  # releases the lock


def _leave_marker(lock: str) -> str:
    """Create this writer's marker; "" where it cannot (then a death here goes unswept)."""
    marker = f"{lock}{_MARKER}.{os.getpid()}.{threading.get_ident()}.{next(_MARKER_COUNT)}"
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as exc:  # a lock file we may open in a directory we may not write
        logger.debug("no writer marker at %s: %s", marker, exc)
        return ""
    return marker


def _lock_path(client: Any) -> str:
    socket = getattr(client, "ipc_socket", None) or os.environ.get("VINEYARD_IPC_SOCKET")
    return f"{socket}{_LOCK_SUFFIX}" if socket else ""


def writers_died(client: Any) -> list[str]:
    """The markers of writers that died inside their window: call under the EXCLUSIVE lock.

    Under the exclusive lock no writer is inside its window, so every marker left is a
    writer's that was killed there (or between its marker and its lock: harmless). None:
    nothing can be orphaned, and the sweep need not look.
    """
    lock = _lock_path(client)
    return sorted(glob.glob(glob.escape(f"{lock}{_MARKER}.") + "*")) if lock else []


def clear_writer_markers(markers: list[str]) -> None:
    """Remove markers once the sweep they called for is done."""
    for marker in markers:
        with contextlib.suppress(OSError):
            os.unlink(marker)


def put_arrays(
    arrays: dict[str, np.ndarray], staging_name: str | None = None, client: Any = None
) -> dict[str, Any]:
    """Put numpy arrays into the LOCAL vineyardd as persisted ``vineyard::Tensor`` objects.

    A copy of each array into shared memory: :func:`write_arrays` with a fill that copies.

    Parameters
    ----------
    arrays : dict of str to ndarray
        Field name → numeric array (stored C-contiguous).
    staging_name : str, optional
        As :func:`write_arrays`.
    client : vineyard.Client, optional
        An open client on the local instance. Default: :func:`local_client`.

    Returns
    -------
    dict
        As :func:`write_arrays`.
    """
    arrays = {field: np.asarray(value) for field, value in arrays.items()}

    def copy(out: dict[str, np.ndarray]) -> None:
        for field, view in out.items():
            np.copyto(view, arrays[field])

    specs = {field: (value.shape, value.dtype) for field, value in arrays.items()}
    return write_arrays(specs, copy, staging_name=staging_name, client=client)


def write_arrays(
    specs: dict[str, tuple[tuple[int, ...], Any]],
    fill: Callable[[dict[str, np.ndarray]], None],
    staging_name: str | None = None,
    client: Any = None,
) -> dict[str, Any]:
    """Allocate and stage tensors in the LOCAL vineyardd, then let ``fill`` write them in place.

    One buffer: :func:`write_buffers` with one spec.

    Parameters
    ----------
    specs : dict of str to (shape, dtype)
        Field name → shape and numeric dtype of its tensor.
    fill : callable
        Called once with ``{field: writable ndarray}``; must fill every element.
    staging_name, client
        As :func:`write_buffers`.

    Returns
    -------
    dict
        ``{"instance_id": int, "fields": {field: {"id", "shape", "dtype", "nbytes"}}}``.
    """
    return write_buffers([specs], lambda _, views: fill(views), staging_name, client)[0]


def write_buffers(
    specs: Sequence[dict[str, tuple[tuple[int, ...], Any]]],
    fill: Callable[[int, dict[str, np.ndarray]], None],
    staging_name: str | None = None,
    client: Any = None,
) -> list[dict[str, Any]]:
    """Allocate and stage several buffers' tensors in the LOCAL vineyardd, then fill each.

    The arrays ``fill`` receives are C-contiguous views of vineyard shared memory: whatever
    it writes there is the stored tensor, with no copy after it. The objects are sealed and
    staged before ``fill`` runs, so that the run's cleanup finds them even if the process dies
    while filling; publish them only after this returns. They are the same
    ``vineyard::Tensor`` objects that vineyard's own numpy builder makes, so any vineyard
    client on this instance reads them by id.

    The buffers share one round of calls to vineyardd: one memory check, one allocation, one
    metadata call for every tensor and one staged wrapper. Per buffer, what is left is sealing
    its blobs: at hundreds of small buffers, the calls per buffer were most of a pack's writes.

    Parameters
    ----------
    specs : sequence of dict of str to (shape, dtype)
        Per buffer, field name → shape and numeric dtype of its tensor.
    fill : callable
        ``fill(i, {field: writable ndarray})``, called once per buffer ``i``, in order; must
        fill every element.
    staging_name : str, optional
        When given (``<STAGING_PREFIX><run id>/...``), the tensors stay transient, wrapped in
        one :data:`STAGED_TYPENAME` object that carries this name, with no etcd write at all:
        :func:`dvml.store.publish.publish_run` persists them, or its cleanup deletes them.
        When None, each tensor is persisted now (visible from every instance, unnamed).
    client : vineyard.Client, optional
        An open client on the local instance. Default: :func:`local_client`.

    Returns
    -------
    list of dict
        Per buffer, ``{"instance_id": int, "fields": {field: {"id", "shape", "dtype",
        "nbytes", "digest"}}}`` (``digest``: :func:`dvml.store.versions.field_digest`).

    Raises
    ------
    VineyardMemoryError
        When the daemon lacks room: names the worker, the bytes needed and free. Nothing is
        put elsewhere, and nothing this call allocated stays behind (also when ``fill``
        raises).
    """
    from vineyard._C import NotEnoughMemoryException  # type: ignore[attr-defined]

    client = local_client() if client is None else client
    layouts = [_layout(spec) for spec in specs]
    fields = [(b, field, shape, dtype) for b, layout in enumerate(layouts)
              for field, (shape, dtype) in layout.items()]  # fmt: skip
    sizes = [math.prod(shape) * dtype.itemsize for _, _, shape, dtype in fields]
    needed = sum(sizes)
    status = client.status
    free = int(status.memory_limit) - int(status.memory_usage)
    if needed > free:
        raise _memory_error(needed, free, int(status.memory_limit), len(layouts))
    builders: dict[int, Any] = {}
    created: list[Any] = []  # sealed blobs and tensors, deleted on failure
    try:
        # Every object is sealed and staged BEFORE it is filled: vineyardd never frees a
        # blob whose client died, so a worker killed while filling a 256 MiB buffer would
        # leak that memory until the daemon restarts. A staged object, even half filled, is
        # found and deleted by the run's cleanup. Nothing reads it before the dataset is
        # published, which happens only after this call returns. From the first blob until
        # the wrapper (or the persist) references them all, the blobs are nobody's: under
        # the allocation lock, so that the cleanup's sweep finds them should this process be
        # killed in between, and never takes them for orphans while it lives.
        with allocation_lock(client):
            flat, metas = _allocate(client, fields, sizes, builders, created)
            for meta in metas:  # marks dvml's tensors for the sweep of orphans
                meta[WRITER_KEY] = staging_name or ""
            # One local call for every tensor, one for the wrapper: neither touches etcd.
            tensors = client.create_metadata(metas) if metas else []
            created.extend(t.id for t in tensors)
            if staging_name is not None:
                created.append(client.create_metadata(_staged_meta(staging_name, tensors)).id)
            else:
                for t in tensors:
                    client.persist(t.id)
        records: list[dict[str, Any]] = [
            {"instance_id": int(client.instance_id), "fields": {}} for _ in layouts
        ]
        views: list[dict[str, np.ndarray]] = [{} for _ in layouts]
        for (b, field, shape, dtype), nbytes, view, t in zip(
            fields, sizes, flat, tensors, strict=True
        ):
            records[b]["fields"][field] = {"id": int(t.id), "shape": list(shape),
                                           "dtype": str(dtype), "nbytes": nbytes}  # fmt: skip
            views[b][field] = view
        del flat
        for b in range(len(layouts)):
            fill(b, views[b])
            # The content digest of a version (dvml.store.versions), where the bytes are
            # written: they are still in this core's cache.
            for field, view in views[b].items():
                records[b]["fields"][field]["digest"] = field_digest(view)
            views[b] = {}  # the blob's memory is not ours to keep
    except NotEnoughMemoryException:
        _abort_quietly(client, builders, created)
        st = client.status
        raise _memory_error(
            needed, int(st.memory_limit) - int(st.memory_usage), int(st.memory_limit), len(layouts)
        ) from None
    except BaseException:
        _abort_quietly(client, builders, created)
        raise
    return records


def _layout(spec: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, tuple[Shape, np.dtype]]:
    """Field → (shape, dtype) as plain ints and numpy dtypes; only numeric dtypes."""
    layout = {
        field: (tuple(int(n) for n in shape), np.dtype(dtype))
        for field, (shape, dtype) in spec.items()
    }
    for field, (_, dtype) in layout.items():
        if dtype.kind not in "biuf":
            raise StoreError(
                f"Field {field!r} has dtype {dtype}; only bool, integer and float tensors are "
                "stored. Encode it first (labels are one-hot encoded by the preprocessor)."
            )
    return layout


def _allocate(
    client: Any,
    fields: list[tuple[int, str, tuple[int, ...], np.dtype]],
    sizes: list[int],
    builders: dict[int, Any],
    created: list[Any],
) -> tuple[list[np.ndarray], list[Any]]:
    """One sealed blob per field, writable views of them, and the tensors' metadata.

    The blobs are allocated in one call, and each is sealed right after, before anything
    else: an UNSEALED blob is listed by no vineyard call, so not even the sweep of orphans
    could find it. ``builders`` holds a blob until it is sealed and ``created`` every sealed
    one (for the caller's abort).
    """
    nonempty = [i for i, size in enumerate(sizes) if size]
    if nonempty:
        allocated = client.create_blob([sizes[i] for i in nonempty])
        builders.update(zip(nonempty, allocated, strict=True))
    views: list[np.ndarray] = []
    metas = []
    for i, (_, _, shape, dtype) in enumerate(fields):
        builder = builders.get(i)
        if builder is None:  # an empty field
            blob = client.create_empty_blob()
            views.append(np.empty(shape, dtype))
        else:
            blob = builder.seal(client)
            # The builder's memory stays mapped and writable after the seal.
            views.append(np.frombuffer(memoryview(builder), dtype).reshape(shape))
        created.append(blob.id)
        builders.pop(i, None)  # sealed: deleted through `created` from now on
        metas.append(_tensor_meta(shape, dtype, blob))
    return views, metas


def _tensor_meta(shape: tuple[int, ...], dtype: np.dtype, blob: Any) -> Any:
    """The metadata vineyard's numpy builder writes for a C-contiguous numeric tensor."""
    from vineyard._C import ObjectMeta
    from vineyard.data.utils import normalize_cpptype, to_json

    meta = ObjectMeta()
    meta["typename"] = f"vineyard::Tensor<{normalize_cpptype(dtype)}>"
    meta["value_type_"] = dtype.name
    meta["value_type_meta_"] = dtype.str
    meta["shape_"] = to_json(shape)
    meta["partition_index_"] = to_json([])
    meta["nbytes"] = math.prod(shape) * dtype.itemsize
    meta["order_"] = to_json("C")
    meta.add_member("buffer_", blob)  # the sealed Blob: an id alone is a placeholder
    return meta


def _staged_meta(staging_name: str, tensors: list[Any]) -> Any:
    """The transient wrapper of staged buffers: the run in a value, their tensors' ids in another.

    The ids, not the tensors as members: a member costs vineyardd a copy of the tensor's
    metadata in the wrapper's, each time it is created and listed.
    """
    import json

    from vineyard._C import ObjectMeta

    meta = ObjectMeta()
    meta["typename"] = STAGED_TYPENAME
    meta["dvml_staging"] = staging_name
    meta["dvml_members"] = json.dumps([int(t.id) for t in tensors])
    return meta


def _abort_quietly(client: Any, builders: dict[int, Any], created: list[Any]) -> None:
    ipc = getattr(client, "ipc_client", client)  # abort() takes the C++ client only
    for builder in builders.values():
        try:
            builder.abort(ipc)
        except Exception:  # already gone with the daemon
            pass
    _delete_quietly(client, created[::-1])


def _memory_error(needed: int, free: int, limit: int, buffers: int) -> VineyardMemoryError:
    what = "a buffer" if buffers == 1 else f"{buffers} buffers written together"
    return VineyardMemoryError(
        f"The vineyardd of {this_worker_name()} has no room for {what}: it needs "
        f"{needed} bytes and {free} of {limit} bytes are free. Nothing was put elsewhere. "
        + memory_advice(needed, free, limit)
    )


def vineyard_room() -> tuple[int, int, int]:
    """On a worker: its vineyardd's ``(instance id, memory limit, memory usage)``, in bytes.

    The same status the late check of :func:`write_buffers` reads, asked once for a plan
    (:mod:`dvml.preprocess.admission`).
    """
    client = local_client()
    status = client.status
    return int(client.instance_id), int(status.memory_limit), int(status.memory_usage)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def memory_advice(needed: int, free: int, limit: int) -> str:
    """What can make room for ``needed`` bytes in a vineyardd with ``free`` of ``limit``
    bytes free, with numbers. A smaller buffer_size cannot: the dataset's bytes on a worker
    are the same however they are cut into buffers."""
    used = max(0, limit - free)
    at_least = -(-(used + needed) // 2**20) * 2**20  # rounded up to a MiB
    return (
        f"{_mib(used)} of the {_mib(limit)} are in use. A smaller buffer_size does not help (the "
        "bytes are the same). What helps: compact=True, the default, if the pack passed "
        "compact=False (uint8 images stored as uint8, about a quarter of float32); more target "
        "workers (distribution_rules), so each holds less; a "
        f"larger vineyard_memory (at least {_mib(at_least)} here); or dropping datasets this "
        "vineyardd holds (dvml datasets list / drop). overwrite=True keeps the dataset it "
        "replaces until the new one is complete, so replacing needs room for both: drop the "
        "old one first if you can do without it meanwhile."
    )


def _delete_quietly(client: Any, ids: list[Any]) -> None:
    for oid in ids:
        try:
            client.delete(oid, force=True, deep=True)
        except Exception:  # already gone
            pass


def delete_objects(ids: list[int], names: list[str] | None = None) -> int:
    """Delete local objects (deeply) and drop names; return how many objects were deleted.

    Runs on the worker that owns the objects. Missing objects and names are ignored, so the
    call is idempotent (safe in retried Dask tasks). The objects go in one delete call: one
    etcd transaction for persisted ones, however many there are. An object that a reader in
    this process still maps (:mod:`dvml.store.readers`) loses its name now but is deleted when
    the last reader lets go (:func:`release_views`): readers never see freed or reused memory.
    """
    client = local_client()
    for name in names or []:
        try:
            client.drop_name(name)
        except Exception:
            pass
    now, later = readers.split_pinned(ids)
    return _delete_existing(client, now) + len(later)


def release_views(ids: list[int]) -> int:
    """A reader of ``ids`` (from :func:`dvml.store.readers.pin`) is done with its views.

    Deletes the objects whose delete waited for it; returns how many.
    """
    due = readers.unpin(ids)
    return _delete_existing(local_client(), due) if due else 0


def _delete_existing(client: Any, ids: list[int]) -> int:
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    # Which exist, from this vineyardd's own metadata: Client.exists asks etcd each time.
    ipc = client.ipc_client
    oids = []
    for raw in ids:
        oid = vineyard.ObjectID(int(raw))
        try:
            ipc.get_meta(oid, False)
        except Exception:  # deleted already
            continue
        oids.append(oid)
    if oids:
        client.delete(oids, force=True, deep=True)
    return len(oids)
