"""An elastic ``fit_multiple``: a departed worker's rows re-pinned, the trainers restarted.

When a worker leaves ``dvml.fit_multiple(..., elastic=True)``, :func:`go_on_without` copies
its buffers of the training and validation sets onto the remaining workers
(:func:`dvml.preprocess.repin.repin`, as an elastic ``dvml.fit`` does; when its vineyardd is
gone too, its rows are left out and counted) and restarts the job's serving trainers on them
(:meth:`~dvml.train.runtime.hopper.ModelHopper.renew`). Restarting rather than telling the
running trainers to re-open their partitions: a serving trainer opens its rows once, at
start, and a new one opens the latest layout by the code path every job uses, with no new
command in the protocol; the cost is one trainer start per survivor (a standby one when
ready), once per departure. The scheduler then resumes each model from its own last
checkpoint, so from the next iteration every model again visits every row once per
iteration (MADlib's rule). :func:`workers_to_leave` says which workers a job goes on without
after a failed hop: those that departed, else those whose trainer died while the worker stays
(killed, out of memory), which are left out the same way.

:func:`rows_per_epoch` is pure: it turns the hop records into the summary's rows per
iteration; the departures' fields are :mod:`dvml.train.departures`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml.exceptions import TrainerFailedError
from dvml.preprocess.repin import repin
from dvml.train.runtime.watcher import departed_workers

if TYPE_CHECKING:
    from dvml.cluster.workers import WorkerInfo
    from dvml.train.hop_job import HopJob

__all__ = ["dead_trainers", "go_on_without", "rows_per_epoch", "trainers_gone", "workers_to_leave"]


def dead_trainers(hop: HopJob, workers: list[WorkerInfo]) -> list[WorkerInfo]:
    """The ``workers`` whose trainer of ``hop`` died (the worker itself may stay)."""
    return [w for w in workers if not hop.hopper.alive(w)]


def trainers_gone(workers: list[WorkerInfo]) -> str:
    """What a job's line says of ``workers`` whose trainer died."""
    return f"the trainer on {', '.join(w.name for w in workers)} is gone (its worker stays)"


def workers_to_leave(hop: HopJob) -> tuple[list[WorkerInfo], str]:
    """After a hop of ``hop`` failed: the workers to go on without, and why.

    Returns
    -------
    tuple of (list of WorkerInfo, str)
        The workers that left the cluster (and ""), else those whose trainer died while
        the worker stays (and a phrase saying so); no worker when none did, or when every
        trainer died (nothing is left to go on with: the caller raises its error).
    """
    workers = list(hop.hopper.workers)
    gone = departed_workers(hop.client, workers, wait=0.0)
    if gone:
        return gone, ""
    dead = dead_trainers(hop, workers)
    if len(dead) == len(workers):
        return [], ""
    return dead, trainers_gone(dead)


def go_on_without(
    hop: HopJob, gone: list[WorkerInfo], remaining: list[WorkerInfo], rerun: str
) -> dict[str, Any]:
    """Re-pin the rows ``gone`` held onto ``remaining`` and restart the job's trainers there.

    Parameters
    ----------
    hop : HopJob
        The job, its departed workers already left out (:meth:`HopJob.lose`).
    gone, remaining : list of WorkerInfo
        The departed workers and the ones the job goes on with.
    rerun : str
        What the user runs to go on when a copy fails (the caller's rerun: the same call,
        or ``dvml.automl(..., resume=True)``).

    Returns
    -------
    dict
        ``workers`` (the departed names), ``training`` and ``validation`` (each dataset's
        :func:`~dvml.preprocess.repin.repin` record, None for no validation set).

    Raises
    ------
    TrainerFailedError
        A copy failed: the job stops rather than train on fewer rows unannounced.
    """
    departure: dict[str, Any] = {"workers": [w.name for w in gone]}
    for what, dataset in (("training", hop.job.train), ("validation", hop.job.valid)):
        if dataset is None:
            departure[what] = None
            continue
        try:
            departure[what] = repin(hop.client, dataset.name, gone, remaining)
        except Exception as exc:
            raise TrainerFailedError(
                f"Workers {departure['workers']} left job {hop.model_output!r} and copying "
                f"their rows of {dataset.name!r} onto {[w.name for w in remaining]} failed: "
                f"{type(exc).__name__}: {exc}. {rerun}"
            ) from exc
    hop.hopper.renew(remaining)
    return departure


def rows_per_epoch(history: Mapping[int, Mapping[str, Any]]) -> list[list[int | None]]:
    """One model's ``[iteration, rows]`` pairs: the rows its hops of each iteration trained,
    each once per epoch (the sum of its hop records' ``rows``; None for an iteration whose
    records do not all say, e.g. resumed from a checkpoint of an older dvml). Pure.

    Parameters
    ----------
    history : mapping
        iteration -> ``{"records": [hop records], ...}``
        (:data:`~dvml.train.hop_schedule.History`'s entry for one model).
    """
    out: list[list[int | None]] = []
    for iteration in sorted(history):
        rows = [r.get("rows") for r in history[iteration]["records"]]
        known = bool(rows) and all(r is not None for r in rows)
        out.append([int(iteration), sum(int(r) for r in rows if r is not None) if known else None])
    return out
