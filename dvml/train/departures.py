"""What an elastic job's summary and log say of the workers that left it. Pure.

One record per departure (:func:`dvml.train.elastic.run_elastic` for ``dvml.fit``,
:func:`dvml.train.hop_repin.go_on_without` for ``fit_multiple``, Hyperband and hyperopt):
``workers``, ``at_iteration`` (the first iteration trained without them), the ``training``
and ``validation`` re-pin records of :func:`dvml.preprocess.repin.repin`, and for a fit the
``stand_ins`` (:mod:`dvml.train.stand_ins`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["departure_fields", "describe_repin"]


def departure_fields(departures: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary's fields about the workers that left an elastic job.

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
    """One line on what a departure's re-pin of the training set did (for the log)."""
    train = departure["training"]
    text = f"{train['repinned_rows']} rows copied onto them in {train['repin_seconds']:.1f}s"
    if departure.get("stand_ins"):  # dvml.train.stand_ins
        text = f"{departure['stand_ins']} train their rows in place, {text}"
    if train["rows_left_out"]:
        text += f", {train['rows_left_out']} rows left out ({train['left_out_reason']})"
    return text
