"""Which files of a growing source are new since the last run: a pure diff of file listings.

A file is identified by its path; it is unchanged when its size and stamp (the object store's
ETag, else the modification time, as :func:`dvml.preprocess.locations.locate` reports it) are
those recorded. Appends only add files: a file whose size or stamp changed was rewritten, and
its old rows are already packed, so the diff reports it for the caller to refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dvml.exceptions import DataError

__all__ = ["FileDiff", "diff_files", "entries", "refuse_changed"]


@dataclasses.dataclass(frozen=True)
class FileDiff:
    """The files of a listing against those seen before (each list of entries, by path)."""

    new: list[dict[str, Any]]
    changed: list[tuple[dict[str, Any], dict[str, Any]]]  # (seen, now)
    removed: list[dict[str, Any]]
    unchanged: list[dict[str, Any]]


def entries(
    paths: Sequence[str], sizes: Sequence[int], stamps: Sequence[str]
) -> list[dict[str, Any]]:
    """File entries ``{"path", "size", "stamp"}`` from a listing, sorted by path."""
    rows = zip(paths, sizes, stamps, strict=True)
    return sorted(
        ({"path": str(p), "size": int(s), "stamp": str(t)} for p, s, t in rows),
        key=lambda e: e["path"],
    )


def diff_files(seen: Iterable[Mapping[str, Any]], now: Iterable[Mapping[str, Any]]) -> FileDiff:
    """Compare a listing ``now`` with the files ``seen`` by the runs before."""
    before = {e["path"]: dict(e) for e in seen}
    new, changed, unchanged = [], [], []
    current = sorted((dict(e) for e in now), key=lambda e: e["path"])
    for entry in current:
        old = before.get(entry["path"])
        if old is None:
            new.append(entry)
        elif (old.get("size"), old.get("stamp")) != (entry.get("size"), entry.get("stamp")):
            changed.append((old, entry))
        else:
            unchanged.append(entry)
    paths = {e["path"] for e in current}
    removed = [e for p, e in sorted(before.items()) if p not in paths]
    return FileDiff(new, changed, removed, unchanged)


def refuse_changed(diff: FileDiff, spec: str) -> None:
    """Raise :class:`DataError` naming the first rewritten file (its rows are packed already)."""
    if not diff.changed:
        return
    old, now = diff.changed[0]
    more = f" (and {len(diff.changed) - 1} more)" if len(diff.changed) > 1 else ""
    raise DataError(
        f"A file the dataset was packed from changed since: {now['path']}{more} (size "
        f"{old.get('size')} -> {now.get('size')}, stamp {old.get('stamp')!r} -> "
        f"{now.get('stamp')!r}). Received: data.source={spec!r} with data.append: true, which "
        "only adds new files. Nothing was written. Write new rows to a new file name, or "
        "repack everything with --force."
    )
