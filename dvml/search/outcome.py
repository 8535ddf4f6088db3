"""What a search leaves to register, built once for every search driver.

A driver (ASHA's, or the one that runs Hyperband's diagonals and hyperopt's batches) keeps
each configuration's history on one :class:`~dvml.train.runtime.hopper.ModelHopper`: per
iteration, its hop records and its evaluations (:data:`dvml.train.hop_schedule.History`),
numbered over the whole search. :func:`build_outcome` turns it into MADlib's tables: one
model per configuration (its fit summary and iteration rows), the ``.info`` rows (MADlib's
columns: metrics concatenated over the search, ``metrics_iters`` counted over the whole
search) and the run summary's common fields. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dvml.train.hop_schedule import History
from dvml.train.hop_tables import Tables, Trained, run_summary
from dvml.train.runtime.plan import Job

__all__ = ["Configuration", "SearchOutcome", "build_outcome"]


Configuration = Trained
"""One configuration as the search trained it (:class:`dvml.train.hop_tables.Trained`: its
parameters' text is written from its parsed ``spec``)."""


@dataclasses.dataclass
class SearchOutcome:
    """What the search leaves for :func:`dvml.automl` to register."""

    info: dict[int, dict[str, Any]]
    models: list[dict[str, Any]]
    summary: dict[str, Any]
    journal: str
    best: int | None


def build_outcome(
    tables: Tables,
    job: Job,
    history: History,
    *,
    times: dict[str, Any],
    journal: str,
    best: int | None,
) -> SearchOutcome:
    """What a search registers: its models and ``.info`` rows from ``tables``
    (:func:`dvml.train.hop_tables.build_tables`, the one builder of MADlib's tables for every
    model-hopper run) and the run summary's common fields.

    ``times`` holds ``start`` and ``end`` (ISO text), ``name``, ``description`` and
    ``wall_seconds``.
    """
    info = {row["mst_key"]: row for row in tables.info}
    return SearchOutcome(info, tables.models, _run_summary(job, history, times), journal, best)


def _run_summary(job: Job, history: History, times: dict[str, Any]) -> dict[str, Any]:
    pids: dict[str, set[int]] = {}
    for entries in history.values():
        for entry in entries.values():
            for r in entry["records"]:
                pids.setdefault(str(r["worker"]), set()).add(int(r["pid"]))
    return {
        **run_summary(job, times, job.args.metrics_compute_frequency),
        # every trainer process that trained a model of the search, by worker
        "trainer_pids": {w: sorted(p) for w, p in sorted(pids.items())},
        "model_iterations": sum(len(h) for h in history.values()),
        "wall_seconds": times["wall_seconds"],
    }
