"""A fit's memory against its plan: each trainer's planned and sampled peak resident bytes
(pure; the trainers sample, :mod:`dvml.train.runtime.memory_sample`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dvml.placement.fit_memory import FitMemoryPlan, HostRow

__all__ = ["host_memory_use", "memory_summary", "over_plan", "trainer_memory_use"]


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


def host_memory_use(
    hosts: Iterable[HostRow],
    trainer_memory: Mapping[str, Mapping[str, int | None]],
    zygote_samples: Iterable[tuple[str, int | None]],
) -> dict[str, dict[str, int | None]]:
    """Each host's planned bytes against what its trainers and their zygote used at most.

    Parameters
    ----------
    hosts : iterable of HostRow
        The plan's hosts (:attr:`dvml.placement.fit_memory.FitMemoryPlan.hosts`); each one's
        planned bytes are what its processes sample
        (:attr:`~dvml.placement.fit_memory.HostRow.process_bytes`).
    trainer_memory : mapping
        :func:`trainer_memory_use`'s ``trainer_memory``.
    zygote_samples : iterable of (worker, bytes or None)
        The zygote's resident set as that worker's trainer sampled it (forked trainers).

    Returns
    -------
    dict
        host → ``{"planned_bytes", "peak_bytes", "zygote_peak_bytes"}``: the peak is the
        zygote's plus each trainer's (None where a trainer sent no sample).
    """
    zygote: dict[str, int] = {}
    for worker, used in zygote_samples:
        if used is not None:
            zygote[worker] = max(zygote.get(worker, 0), int(used))
    table: dict[str, dict[str, int | None]] = {}
    for host in hosts:
        workers = [t.worker for t in host.trainers]
        peaks = [(trainer_memory.get(w) or {}).get("peak_bytes") for w in workers]
        shared = max((zygote[w] for w in workers if w in zygote), default=None)
        known = None if any(p is None for p in peaks) else sum(int(p or 0) for p in peaks)
        table[host.host] = {
            "planned_bytes": host.process_bytes,
            "peak_bytes": None if known is None else known + (shared or 0),
            "zygote_peak_bytes": shared,
        }
    return table


def memory_summary(
    plan: FitMemoryPlan | None,
    samples: Iterable[tuple[str, int | None, int | None]],
    margin: float,
) -> dict[str, Any]:
    """A job's summary fields of memory: :func:`trainer_memory_use`'s and ``host_memory``
    (:func:`host_memory_use`), from its plan (None: not planned) and the samples its trainers
    sent, as ``(worker, resident bytes, zygote bytes)``."""
    samples = list(samples)
    trainers = plan.trainers if plan is not None else ()
    planned = {t.worker: t.trainer_bytes for t in trainers}
    use = trainer_memory_use(planned, [(w, r) for w, r, _ in samples], margin)
    hosts = plan.hosts if plan is not None else ()
    use["host_memory"] = host_memory_use(hosts, use["trainer_memory"],
                                         [(w, z) for w, _, z in samples])  # fmt: skip
    return use
