"""The catalog of named datasets in vineyard: publish, read, list and drop.

A dataset named ``digits`` is one global vineyard object, ``put_name``d as ``digits`` once
every buffer is in place (so the name never points at a partial dataset)::

    dvml::Dataset (global)     dvml_kind, dvml_summary (JSON), dvml_layout (JSON),
    │                          dvml_global_tensors (JSON: field -> id of its GlobalTensor),
    │                          dvml_run (the run that wrote it: see dvml.store.staging),
    │                          dvml_versions (JSON: one record per version, dvml.store.versions)
    ├── x_0-0 … x_0-N: vineyard::Tensor<float>     buffer i of input 0
    └── y-0 … y-N:     vineyard::Tensor<float>     buffer i of the one-hot labels

    vineyard::GlobalTensor per field (global)  partitions_-0 … partitions_-N: the same tensors

Buffer ``i`` of every field lives on the same vineyard instance. Every member is a standard
``vineyard::Tensor``, so a plain vineyard client on that instance reads it by id, and each
field is also a standard ``vineyard::GlobalTensor``. (Vineyard forbids a global object inside
another, so the per-field GlobalTensors sit beside the root, referenced by id.)

The functions here run inside a worker (they talk to its local vineyardd); the client-side
API is :mod:`dvml.store.datasets`.
"""

from __future__ import annotations

import json
from typing import Any

from dvml.cluster.connection import local_client
from dvml.exceptions import (
    ArgumentTypeError,
    DatasetExistsError,
    DatasetNotFoundError,
    StoreError,
)
from dvml.store import versions as ver
from dvml.store.tensors import STAGING_PREFIX

__all__ = [
    "DATASET_TYPENAME",
    "drop_metadata",
    "find_record",
    "list_records",
    "not_found",
    "publish",
]

DATASET_TYPENAME = "dvml::Dataset"


def _lookup(client: Any, name: str) -> Any | None:
    try:
        return client.get_name(name)
    except Exception:  # vineyard raises ObjectNotExistsException for an unknown name
        return None


def find_record(name: str) -> dict[str, Any] | None:
    """A dataset's id, kind, summary and layout by name, or None (no tensor data is read)."""
    client = local_client()
    oid = _lookup(client, name)
    return None if oid is None else _record_from_meta(client.get_meta(oid), name)


def not_found(name: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"No dataset named {name!r} in vineyard. List datasets with dvml.datasets.list() or "
        "`dvml datasets list`."
    )


def _record_from_meta(meta: Any, name: str) -> dict[str, Any]:
    if meta.typename != DATASET_TYPENAME:
        raise DatasetNotFoundError(
            f"The vineyard name {name!r} points at a {meta.typename}, not a dvml dataset. "
            "Choose another name or drop that object with a vineyard client."
        )
    summary = json.loads(meta["dvml_summary"])
    layout = json.loads(meta["dvml_layout"])
    # A dataset published before versions existed reads as version 1.
    stored = json.loads(meta["dvml_versions"]) if "dvml_versions" in meta else None
    versions = ver.versions_of(stored, layout, summary.get("created_at"))
    return {
        "name": name,
        "id": int(meta.id),
        "kind": meta["dvml_kind"],
        "summary": summary,
        "layout": layout,
        "global_tensors": json.loads(meta["dvml_global_tensors"]),
        "versions": versions,
        "version": ver.latest_version(versions),
    }


def list_records() -> list[dict[str, Any]]:
    """Every named dvml dataset and feature cache, sorted by name."""
    client = local_client()
    records = []
    for name, oid in sorted(client.ipc_client.list_names("*", limit=100000).items()):
        if name.startswith(STAGING_PREFIX):
            continue
        try:
            meta = client.get_meta(oid)
        except Exception:  # dropped between the listing and this read
            continue
        if meta.typename == DATASET_TYPENAME:
            records.append(_record_from_meta(meta, name))
    return records


def publish(
    name: str,
    kind: str,
    summary: dict[str, Any],
    layout: dict[str, Any],
    overwrite: bool,
    run_id: str = "",
    append_to: int | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create the global objects of a dataset and name it; return ``{"id", "replaced"}``.

    The layout's tensors must be persisted already (:func:`dvml.store.staging.persist_staged`).
    ``replaced`` is the record of a dataset that had the name before (its objects are
    deleted by the caller on the workers that own them), or None. ``run_id`` is recorded in
    the dataset, so that the run's cleanup keeps its tensors even when this call's result is
    lost on its way back. ``append_to``: the id of the dataset this publication appends to
    (the name must still point at it); the layout's buffers without a ``"version"`` are the
    new version's, recorded with ``source`` (:mod:`dvml.store.versions`). Writes through
    etcd: one persist per field and one for the root,
    then the name; none per buffer.
    """
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    client = local_client()
    old = _lookup(client, name)
    replaced = None
    if old is not None:
        replaced = _record_from_meta(client.get_meta(old), name)
        if not overwrite:
            raise DatasetExistsError(
                f"A dataset named {name!r} already exists. Pass overwrite=True to "
                "replace it, or choose another name."
            )
    if append_to is not None and (old is None or int(old) != int(append_to)):
        raise StoreError(
            f"Dataset {name!r} was replaced or dropped while rows were appended to it "
            f"(expected object {append_to}, found {None if old is None else int(old)}). Nothing "
            "was published; append again."
        )
    created_at = summary.get("appended_at") or summary.get("created_at") or ""
    previous = replaced["versions"] if replaced is not None else None
    new_buffers = [b for b in layout["buffers"] if "version" not in b]
    versions = ver.next_versions(
        previous, new_buffers, source, str(created_at), append=append_to is not None
    )
    version = versions[-1]["version"]
    layout = {**layout, "buffers": [{**b, "version": b.get("version", version)}
                                    for b in layout["buffers"]]}  # fmt: skip
    gmetas = []
    for field, spec in layout["fields"].items():
        gmeta = vineyard.ObjectMeta()
        gmeta["typename"] = "vineyard::GlobalTensor"
        gmeta.set_global(True)
        gmeta["shape_"] = json.dumps(spec["shape"])
        gmeta["partition_shape_"] = json.dumps([b["rows"] for b in layout["buffers"]])
        gmeta["partitions_-size"] = len(layout["buffers"])
        for i, buf in enumerate(layout["buffers"]):
            gmeta.add_member(f"partitions_-{i}", vineyard.ObjectID(buf["fields"][field]["id"]))
        gmetas.append(gmeta)
    # One call (and one metadata sync) for every field's GlobalTensor.
    created = client.create_metadata(gmetas) if gmetas else []
    global_tensors = {}
    for field, gmeta in zip(layout["fields"], created, strict=True):
        client.persist(gmeta.id)
        global_tensors[field] = int(gmeta.id)
    root = vineyard.ObjectMeta()
    root["typename"] = DATASET_TYPENAME
    root.set_global(True)
    root["dvml_kind"] = kind
    root["dvml_summary"] = json.dumps(summary, default=_json_default)
    root["dvml_layout"] = json.dumps(layout)
    root["dvml_global_tensors"] = json.dumps(global_tensors)
    root["dvml_run"] = run_id
    root["dvml_versions"] = json.dumps(versions)
    for i, buf in enumerate(layout["buffers"]):
        for field, obj in buf["fields"].items():
            root.add_member(f"{field}-{i}", vineyard.ObjectID(obj["id"]))
    root_id = client.create_metadata(root).id
    client.persist(root_id)
    # The name appears last and in one step: readers never see a partial dataset.
    client.put_name(root_id, name)
    return {"id": int(root_id), "replaced": replaced, "global_tensors": global_tensors,
            "layout": layout, "versions": versions, "version": version}  # fmt: skip


def drop_metadata(record: dict[str, Any], drop_name: bool) -> None:
    """Delete the global metadata of a dataset (its tensors are deleted by their owners)."""
    from dvml.vineyard_runtime import import_vineyard

    vineyard = import_vineyard()
    client = local_client()
    if drop_name:
        current = _lookup(client, record["name"])
        if current is not None and int(current) == record["id"]:
            client.drop_name(record["name"])
    ids = [record["id"], *record["global_tensors"].values()]
    for oid in map(vineyard.ObjectID, ids):
        try:
            client.delete(oid, force=False, deep=False)
        except Exception:
            pass


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise ArgumentTypeError(
        f"Summary value of type {type(value).__name__} is not JSON-serialisable."
    )
