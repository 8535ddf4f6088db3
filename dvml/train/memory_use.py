"""A fit's memory against its plan: each trainer's planned and sampled peak resident bytes
(pure; the trainers sample, :mod:`dvml.train.runtime.memory_sample`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["over_plan", "trainer_memory_use"]


def over_plan(planned: int | None, used: int | None, margin: float) -> bool:
    """Whether ``used`` bytes exceed the ``planned`` bytes by more than ``margin`` (0.2: 20 %)."""
    return planned is not None and used is not None and used > planned * (1.0 + margin)


def trainer_memory_use(
    planned: Mapping[str, int],
    samples: Iterable[tuple[str, int | None]],
    margin: float,
) -> dict[str, Any]:
    """The summary's memory fields from each trainer's plan and its samples.

    Parameters
    ----------
    planned : mapping
        Worker name → the trainer's planned resident bytes
        (:attr:`dvml.placement.fit_memory.TrainerMemory.total`).
    samples : iterable of (worker, bytes or None)
        Every sample the trainers sent (one per iteration each).
    margin : float
        How far over its plan a trainer may go before it is named (config ``memory.margin``).

    Returns
    -------
    dict
        ``trainer_memory``: worker → ``{"planned_bytes", "peak_bytes"}`` (None where no
        sample came); ``memory_over_plan``: the workers whose trainer went over, sorted.
    """
    peaks: dict[str, int] = {}
    for worker, used in samples:
        if used is not None:
            peaks[worker] = max(peaks.get(worker, 0), int(used))
    table = {
        w: {"planned_bytes": planned.get(w), "peak_bytes": peaks.get(w)}
        for w in sorted(set(planned) | set(peaks))
    }
    over = [
        w for w, row in table.items() if over_plan(row["planned_bytes"], row["peak_bytes"], margin)
    ]
    return {"trainer_memory": table, "memory_over_plan": over}
