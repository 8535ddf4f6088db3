"""A model's lineage: which data, which preprocessing and which code trained it.

Every fit (:func:`dvml.fit`, :func:`dvml.fit_multiple`, :func:`dvml.automl`, :func:`dvml.run`)
writes a ``"lineage"`` record in the model's summary (``dvml.train.summary.lineage_record``):
the dataset versions it read, under the job's dataset lease (name, version, the digest of
every buffer read and their ``content_digest``, and the source of each version: files with
sizes and modification times or ETags, preprocessing parameters), the dvml version, the
architecture id and the compile/fit parameters. The registry completes it when it saves the
model (:func:`completed`): the architecture's content hash and, for a warm start (the model
trained on from its previous weights), a snapshot of the model it started from, whose own
lineage holds its parent in turn. The retrain workflow adds its promotions
(:func:`promoted`). :func:`from_summary` reads it back as a :class:`Lineage`.

The lineage lives in the summary (JSON), so no table changed: registries written before it
read fine, their models' lineage holding what their summaries knew (dataset name and
version, dvml version, architecture id). Everything here is pure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_ANCESTORS",
    "Lineage",
    "architecture_sha256",
    "completed",
    "from_summary",
    "promoted",
]

MAX_ANCESTORS = 64
"""Warm-start ancestors kept in a model's lineage (a daily retrain for two months); older
ones are cut, marked ``{"truncated": True}``."""


def architecture_sha256(model_json: str | None) -> str | None:
    """SHA-256 of an architecture's Keras JSON, keys sorted (the same model, the same hash)."""
    if model_json is None:
        return None
    try:
        text = json.dumps(json.loads(model_json), sort_keys=True, separators=(",", ":"))
    except ValueError:
        text = str(model_json)
    return hashlib.sha256(text.encode()).hexdigest()


def _trimmed(parent: dict[str, Any] | None, depth: int) -> dict[str, Any] | None:
    """``parent`` with at most ``depth`` ancestors; deeper ones replaced by a marker."""
    if parent is None or parent.get("truncated"):
        return parent
    if depth <= 0:
        return {"truncated": True}
    inner = dict(parent.get("lineage") or {})
    if inner:
        inner["parent"] = _trimmed(inner.get("parent"), depth - 1)
    return {**parent, "lineage": inner or None}


def completed(
    summary: Mapping[str, Any],
    model_json: str | None,
    previous: Mapping[str, Any] | None,
    name: str,
) -> dict[str, Any]:
    """``summary`` with its lineage completed at save time: architecture hash and parent.

    ``previous`` is the registry entry the save replaces (``summary``, ``version``), None
    for a new name. The parent is set only on a lineage a fit just built (no ``"parent"``
    key yet): a copied model (``copy_model``, a promotion) keeps the lineage it had.
    """
    lineage = summary.get("lineage")
    if not isinstance(lineage, Mapping) or "parent" in lineage:
        return dict(summary)
    new = dict(lineage)
    new["code"] = {
        **dict(new.get("code") or {}),
        "architecture_sha256": architecture_sha256(model_json),
    }
    parent = None
    if new.get("warm_start") and previous is not None:
        before = dict(previous.get("summary") or {})
        # a model copied to be warm-started (the retrain workflow's candidate) names its source
        copied = dict((before.get("lineage") or {}).get("copied_from") or {})
        parent = {
            "model": (before.get("lineage") or {}).get("model", before.get("model", name)),
            "registered_as": copied.get("name", name),
            "registry_version": copied.get("registry_version", previous.get("version")),
            "lineage": before.get("lineage") or _legacy(before),
        }
    new["parent"] = _trimmed(parent, MAX_ANCESTORS)
    new.setdefault("promotions", [])
    return {**summary, "lineage": new}


def promoted(
    candidate_summary: Mapping[str, Any],
    record: Mapping[str, Any],
    over: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The lineage of a promoted model: the candidate's, plus this promotion.

    ``record`` is the retrain workflow's promotion (run id, metric, values); ``over`` the
    production model it replaces (``name``, ``registry_version``), None for the first one.
    """
    lineage = dict(candidate_summary.get("lineage") or _legacy(candidate_summary))
    entry = {**dict(record), "over": dict(over) if over is not None else None}
    lineage["promotions"] = [*list(lineage.get("promotions") or []), entry]
    lineage.setdefault("parent", None)
    return lineage


def _legacy(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage of a model saved before lineage was recorded: what its summary knew."""

    def read(table: Any, version: Any) -> dict[str, Any] | None:
        return None if table is None else {"name": table, "version": version}

    return {
        "model": summary.get("model"),
        "data": {
            "training": read(summary.get("source_table"), summary.get("training_dataset_version")),
            "validation": read(
                summary.get("validation_table"), summary.get("validation_dataset_version")
            ),
        },
        "code": {
            "dvml_version": summary.get("version"),
            "architecture_id": summary.get("model_id"),
            "compile_params": summary.get("compile_params"),
            "fit_params": summary.get("fit_params"),
        },
        "warm_start": bool(summary.get("warm_start")),
        "parent": None,
        "promotions": [],
        "legacy": True,
    }


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Which data, which preprocessing and which code trained a model (:func:`dvml.lineage`).

    Attributes
    ----------
    model : str
        The model's name in the registry.
    registry_version : int or None
        The registry's version of that entry (bumped by every replace), None for an ancestor
        recorded before it was known.
    trained_as : str or None
        The name the fit wrote (a promoted model was trained as its candidate's name).
    training, validation : dict or None
        The dataset each read: ``name``, ``version``, ``digests`` (buffer index to content
        digest), ``content_digest`` (one for the version:
        :func:`dvml.store.versions.version_digest`),
        ``digest_algorithm``, ``rows`` and ``sources`` (per version up to it: ``version``,
        ``rows_added``, ``created_at``, ``source`` with ``description``, ``files`` (path,
        size, mtime or etag) and ``params``, the preprocessing parameters).
    code : dict
        ``dvml_version``, ``architecture_id``, ``architecture_sha256``, ``compile_params``,
        ``fit_params``.
    warm_start : bool
        Whether it was trained on from an earlier model's weights.
    parent : Lineage or None
        The model it warm-started from, with its own lineage (a chain).
    promotions : list of dict
        The retrain workflow's promotions of this model: ``from`` (the candidate), ``over``
        (the production model replaced), ``metric``, ``candidate``, ``previous``, ``promoted``.
    legacy : bool
        True for a model saved before lineage was recorded (only names and versions known).
    """

    model: str
    registry_version: int | None
    trained_as: str | None
    training: dict[str, Any] | None
    validation: dict[str, Any] | None
    code: dict[str, Any]
    warm_start: bool
    parent: Lineage | None
    promotions: list[dict[str, Any]]
    legacy: bool = False

    def chain(self) -> list[Lineage]:
        """This model and its warm-start ancestors, the newest first."""
        found: list[Lineage] = []
        node: Lineage | None = self
        while node is not None:
            found.append(node)
            node = node.parent
        return found

    def to_dict(self) -> dict[str, Any]:
        """The lineage as plain values (JSON-ready), the parent nested."""
        return dataclasses.asdict(self)


def from_summary(
    name: str, registry_version: int | None, summary: Mapping[str, Any] | None
) -> Lineage:
    """The :class:`Lineage` of a model from its registry summary."""
    summary = dict(summary or {})
    return _from_record(name, registry_version, summary.get("lineage") or _legacy(summary))


def _from_record(name: str, registry_version: int | None, record: Mapping[str, Any]) -> Lineage:
    raw_parent = record.get("parent")
    parent = None
    if isinstance(raw_parent, Mapping) and not raw_parent.get("truncated"):
        parent = _from_record(
            str(raw_parent.get("registered_as") or raw_parent.get("model")),
            raw_parent.get("registry_version"),
            raw_parent.get("lineage") or {},
        )
    data = dict(record.get("data") or {})
    return Lineage(
        model=name,
        registry_version=registry_version,
        trained_as=record.get("model"),
        training=data.get("training"),
        validation=data.get("validation"),
        code=dict(record.get("code") or {}),
        warm_start=bool(record.get("warm_start")),
        parent=parent,
        promotions=[dict(p) for p in record.get("promotions") or []],
        legacy=bool(record.get("legacy")),
    )
