"""How trainers synchronise: the ``sync`` choice of :func:`dvml.fit` and its pure pieces.

Three modes:

- ``"step"``: MultiWorkerMirroredStrategy all-reduces the gradients at every step (one
  all-reduce per step: see :mod:`dvml.train.runtime.step_collectives`). Right on GPUs with NCCL; on
  CPU each all-reduce goes through gRPC (~3 ms on loopback here, whatever the model size),
  so it dominates small models.
- ``"iteration"``: MADlib's model averaging (``madlib_keras_fit``). Each trainer fits its
  LOCAL rows for the iteration's epochs with its own optimizer (its state is kept across
  iterations), then every weight, trainable or not (batch-norm statistics too), is averaged
  over the trainers weighted by their row counts, and the next iteration starts from the
  average. One collective per iteration.
- an int ``k >= 1``: the same averaging every ``k`` steps (local SGD), and at the end of each
  iteration.

This module holds the validation, the automatic choice and a numpy reference of the
row-weighted average; the collective itself is in :mod:`dvml.train.runtime.averaging`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dvml.exceptions import ArgumentError

__all__ = [
    "MODES",
    "SyncMode",
    "check_sync",
    "choose_sync",
    "flatten",
    "unflatten",
    "weighted_average",
]

SyncMode = str | int
MODES = ("step", "iteration")


def check_sync(sync: Any) -> SyncMode | None:
    """Return ``sync`` if it is a valid choice (None = automatic), else raise.

    Raises
    ------
    ArgumentError
        Naming what was received and what is allowed.
    """
    if sync is None or (isinstance(sync, str) and sync in MODES):
        return sync
    if isinstance(sync, int | np.integer) and not isinstance(sync, bool) and int(sync) >= 1:
        return int(sync)
    raise ArgumentError(
        f"sync must be 'step', 'iteration', a positive int k (average every k steps) or None "
        f"(automatic: 'step' when every trainer trains on a GPU, else 'iteration'). "
        f"Received: sync={sync!r}."
    )


def choose_sync(sync: Any, use_gpus: bool, trainer_gpus: Sequence[Any]) -> tuple[SyncMode, str]:
    """The mode a fit runs with, and why (for progress lines and the demo).

    Parameters
    ----------
    sync
        The user's choice (already merged with the config key ``dvml.train.sync``); None picks
        automatically.
    use_gpus : bool
        Whether the fit trains on GPUs.
    trainer_gpus : sequence
        Each trainer's worker's GPUs (a tuple of GPU ids, a count or a flag; truthy = has one).
    """
    chosen = check_sync(sync)
    if chosen is not None:
        return chosen, f"sync={chosen!r} was asked for"
    if use_gpus and trainer_gpus and all(trainer_gpus):
        return "step", (
            "every trainer trains on a GPU: a gradient all-reduce per step (NCCL) is cheap "
            "there and keeps synchronous SGD's convergence"
        )
    return "iteration", (
        "the trainers run on CPU, where a gradient all-reduce over gRPC costs more per step "
        "than the step itself (~5 ms against ~3 ms, B10d): each trainer fits its local rows "
        "and the weights are averaged once per iteration (MADlib's model averaging)"
    )


def flatten(weights: Sequence[np.ndarray]) -> np.ndarray:
    """All weights as one float64 vector (float64: averaging identical weights is exact)."""
    if not weights:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in weights])


def unflatten(vector: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Split ``vector`` back into arrays shaped and typed like ``like``."""
    sizes = [int(np.asarray(w).size) for w in like]
    if int(vector.size) != sum(sizes):
        raise ArgumentError(
            f"The averaged vector has {vector.size} values but the model's weights have "
            f"{sum(sizes)}. Received shapes: {[np.asarray(w).shape for w in like]}."
        )
    out, start = [], 0
    for w, n in zip(like, sizes, strict=True):
        w = np.asarray(w)
        out.append(vector[start : start + n].reshape(w.shape).astype(w.dtype))
        start += n
    return out


def weighted_average(
    weights_per_trainer: Sequence[Sequence[np.ndarray]], rows: Sequence[int]
) -> list[np.ndarray]:
    """Row-weighted mean of every trainer's weights: the reference the collective must match.

    ``sum_t rows_t * w_t / sum_t rows_t``, computed in float64 and cast back.
    """
    if len(weights_per_trainer) != len(rows) or not rows:
        raise ArgumentError(
            f"Need one row count per trainer. Received: {len(weights_per_trainer)} weight "
            f"lists and rows={list(rows)}."
        )
    total = float(sum(rows))
    if total <= 0:
        raise ArgumentError(f"The trainers hold no rows to weight by. Received: rows={list(rows)}.")
    summed = sum(flatten(w) * float(r) for w, r in zip(weights_per_trainer, rows, strict=True))
    return unflatten(np.asarray(summed) / total, weights_per_trainer[0])
