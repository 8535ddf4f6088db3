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
iteration (MADlib's rule).

:func:`rows_per_epoch` and :func:`departure_fields` are pure: they turn the hop records and
the departures into the summary's fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dvml.exceptions import TrainerFailedError
from dvml.preprocess.repin import repin

if TYPE_CHECKING:
    from dvml.cluster.workers import WorkerInfo
    from dvml.train.hop_job import HopJob

__all__ = ["departure_fields", "describe_repin", "go_on_without", "rows_per_epoch"]


def go_on_without(
    hop: HopJob, gone: list[WorkerInfo], remaining: list[WorkerInfo]
) -> dict[str, Any]:
    """Re-pin the rows ``gone`` held onto ``remaining`` and restart the job's trainers there.

    Parameters
    ----------
    hop : HopJob
        The job, its departed workers already left out (:meth:`HopJob.lose`).
    gone, remaining : list of WorkerInfo
        The departed workers and the ones the job goes on with.

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
                f"{type(exc).__name__}: {exc}. Run the same call again: it resumes from the "
                "models' checkpoints."
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


def departure_fields(departures: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run summary's fields about workers that left an elastic ``fit_multiple``. Pure.

    Each departure has ``workers``, ``at_iteration`` (the first iteration any model trained
    without them) and the ``training`` and ``validation`` re-pin records. Returns
    ``departed`` (names), ``departed_at_iterations`` (name -> iteration), ``repinned_rows``
    (training rows copied onto the remaining workers), ``repin_seconds`` (both datasets'
    copies and publications), ``rows_left_out`` (training rows no copy could be made of),
    ``rows_left_out_from_iteration`` (None when none) and ``departures`` (the records).
    """
    at: dict[str, int] = {}
    repinned = left_out = 0
    seconds = 0.0
    left_from = None
    for d in departures:
        at.update({name: int(d["at_iteration"]) for name in d["workers"]})
        train = d["training"]
        repinned += int(train["repinned_rows"])
        left_out += int(train["rows_left_out"])
        if train["rows_left_out"] and left_from is None:
            left_from = int(d["at_iteration"])
        seconds += sum(float(d[k]["repin_seconds"]) for k in ("training", "validation") if d[k])
    return {
        "departed": sorted(at),
        "departed_at_iterations": at,
        "repinned_rows": repinned,
        "repin_seconds": round(seconds, 3),
        "rows_left_out": left_out,
        "rows_left_out_from_iteration": left_from,
        "departures": [dict(d) for d in departures],
    }


def describe_repin(departure: Mapping[str, Any]) -> str:
    """One line on what a departure's re-pin of the training set did (for the log). Pure."""
    train = departure["training"]
    text = f"{train['repinned_rows']} rows copied onto them in {train['repin_seconds']:.1f}s"
    if train["rows_left_out"]:
        text += f", {train['rows_left_out']} rows left out ({train['left_out_reason']})"
    return text
