"""The one checkpoint store of every training job: atomic, owner-only, one resume rule.

A checkpoint is a state (``.npz`` bytes: weights, and for a serving trainer the optimizer's
variables too) with a small JSON record beside it (the job key, the iteration, what the
iteration reported). Both are written to a temporary file and renamed, so a reader sees the
old checkpoint or the new one, never half of one; directories are 0700 and files 0600, since a
state is the model itself and a rerun loads it back: nobody else may read or replace it.

:func:`resume_iteration` is the rule for where a rerun of a job in lockstep starts: the last
iteration that every participant (a trainer of a synchronous fit, the models of one search
step) completed and whose state is still kept. :func:`resume_points` applies the same rule to
each participant on its own, for participants that do not wait for each other (the models of
``fit_multiple``'s model hopper): each resumes from its own last kept state, so a model that
lags does not throw away the later checkpoints of the others (and a model whose older states
were pruned does not send everyone back to the start).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from dvml.cluster.state import private_dir

__all__ = ["CheckpointStore", "resume_iteration", "resume_points"]

K = TypeVar("K")

_STATE = ".npz"
_META = ".npz.json"


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class CheckpointStore:
    """The checkpoints of one job on this host, in ``directory`` (created 0700 on first write).

    Parameters
    ----------
    directory : str
        ``<state dir>/checkpoints/<job>``: the job's own directory; its parent is made
        owner-only too.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def save(self, name: str, state: bytes, meta: dict[str, Any]) -> None:
        """Write checkpoint ``name``: its state, then its record (each atomically)."""
        # the job's directory and <state dir>/checkpoints, tightened when an older dvml made
        # them 0755
        private_dir(self.directory, root=os.path.dirname(self.directory))
        path = self._path(name)
        for suffix, data in ((_STATE, state), (_META, json.dumps(meta).encode())):
            with open(path + suffix + ".tmp", "wb", opener=_private_opener) as f:
                f.write(data)
            os.replace(path + suffix + ".tmp", path + suffix)

    def load(self, name: str) -> tuple[dict[str, Any], bytes] | None:
        """Checkpoint ``name``'s record and state, or None when either is missing or torn."""
        path = self._path(name)
        try:
            with open(path + _META) as f:
                meta = json.load(f)
            with open(path + _STATE, "rb") as f:
                return dict(meta), f.read()
        except (OSError, ValueError):
            return None

    def records(self, job_key: str) -> list[dict[str, Any]]:
        """Every record of ``job_key`` here, each with ``name`` and ``has_state`` (its state is
        still kept), sorted by name."""
        try:
            names = sorted(
                n[: -len(_META)] for n in os.listdir(self.directory) if n.endswith(_META)
            )
        except OSError:
            return []
        found = []
        for name in names:
            try:
                with open(self._path(name) + _META) as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                continue
            if meta.get("job_key") == job_key:
                meta.update(name=name, has_state=os.path.exists(self._path(name) + _STATE))
                found.append(meta)
        return found

    def drop_state(self, name: str) -> None:
        """Remove checkpoint ``name``'s state (its small record stays, for the history)."""
        try:
            os.remove(self._path(name) + _STATE)
        except FileNotFoundError:
            pass

    def clear(self) -> None:
        """Remove every checkpoint of the job (it finished and its result is registered)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def resume_iteration(
    completed: Mapping[Any, Iterable[int]], has_state: Callable[[int], bool]
) -> int:
    """The iteration a rerun resumes after: the last one that every participant completed
    and whose state is kept (``has_state``); 0 when there is none (start afresh).

    >>> resume_iteration({"w0": [1, 2, 3], "w1": [1, 2, 3, 4]}, lambda i: i in (3, 4))
    3
    >>> resume_iteration({"m1": [1, 2], "m2": [1]}, lambda i: i == 2)
    0
    """
    sets = [set(done) for done in completed.values()]
    if not sets:
        return 0
    common = set.intersection(*sets)
    return max((i for i in common if has_state(i)), default=0)


def resume_points(
    completed: Mapping[K, Iterable[int]], has_state: Callable[[K, int], bool]
) -> dict[K, int]:
    """Each participant's own resume point: the last iteration ``i`` such that it completed
    every iteration ``1..i`` (its history has no gap) and its state after ``i`` is kept
    (``has_state(participant, i)``); 0 when there is none (it starts afresh).

    :func:`resume_iteration` for each participant alone, for participants that do not wait
    for each other (the models of the model hopper).

    >>> resume_points({"m1": [1, 2, 3], "m2": [1]}, lambda k, i: (k, i) in {("m1", 2),
    ...               ("m1", 3), ("m2", 1)})
    {'m1': 3, 'm2': 1}
    >>> resume_points({"m1": [1, 3], "m2": []}, lambda k, i: True)
    {'m1': 1, 'm2': 0}
    """
    out: dict[K, int] = {}
    for key, done in completed.items():
        found, last = set(done), 0
        while last + 1 in found:  # the history is whole up to here
            last += 1
        out[key] = max((i for i in range(1, last + 1) if has_state(key, i)), default=0)
    return out
