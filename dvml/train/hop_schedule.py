"""Pure pieces of ``fit_multiple``: the model hopper schedule and MADlib's ``.info`` rows.

Model Hopper Parallelism (MOP, Cerebro: Nakandala et al., PVLDB 13(11), 2020; MADlib's
``madlib_keras_fit_multiple_model``): the data stays where it is and the models move. With
``M`` models and ``W`` workers holding partitions, an iteration is ``W`` rounds; in round
``r`` model ``m`` trains one sub-epoch on the partition of worker ``(m + r) mod W``. After
``W`` rounds every model has seen every partition exactly once.

- ``M >= W``: every worker trains in every round. When ``M`` is not a multiple of ``W`` some
  workers train one model more than others in a round (they train their models of the round
  one after the other).
- ``M < W``: MADlib's rule: the number of configurations should be at least the number of
  workers (segments) or some sit idle. Here ``W - M`` workers have no model in each round;
  every model still visits every partition once per iteration, so an iteration still takes
  ``W`` rounds.

Nothing here does I/O; :mod:`dvml.train.fit_multiple` runs the schedule on a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentError
from dvml.train.summary import iteration_record

__all__ = [
    "build_info",
    "hop_schedule",
    "iteration_rows",
    "model_histories",
    "resumed_from",
]


def hop_schedule(n_models: int, n_workers: int) -> list[list[tuple[int, int]]]:
    """The rounds of one iteration: round ``r`` lists ``(model, worker)`` pairs.

    Model ``m`` is on worker ``(m + r) mod W`` in round ``r`` (Cerebro's round-robin).

    Raises
    ------
    ArgumentError
        Fewer than one model or one worker.
    """
    if n_models < 1 or n_workers < 1:
        raise ArgumentError(
            f"A hop schedule needs at least one model and one worker. Received: "
            f"n_models={n_models}, n_workers={n_workers}."
        )
    return [[(m, (m + r) % n_workers) for m in range(n_models)] for r in range(n_workers)]


def build_info(
    configs: Sequence[Mapping[str, Any]],
    model_names: dict[int, str],
    summaries: dict[int, dict[str, Any]],
    seconds: dict[int, dict[str, float]],
) -> list[dict[str, Any]]:
    """MADlib's ``<model_output>_info`` rows, one per configuration (in mst_key order).

    Parameters
    ----------
    configs
        ``{"mst_key", "model_id"}`` of each configuration, in mst_key order.
    model_names
        mst_key -> the registered model's name.
    summaries
        mst_key -> that model's MADlib fit summary (:func:`dvml.train.summary.build_summary`).
    seconds
        mst_key -> ``{"training_s", "moving_s"}``: the model's sub-epoch training seconds and
        the seconds its weights and optimizer state spent moving between workers.
    """
    rows = []
    for c in configs:
        key = c["mst_key"]
        s = summaries[key]
        rows.append(
            {
                "mst_key": key,
                "model_id": c["model_id"],
                "model_name": model_names[key],
                "compile_params": s["compile_params"],
                "fit_params": s["fit_params"],
                "model_type": s["model_type"],
                "model_size": s["model_size"],
                "metrics_elapsed_time": s["metrics_elapsed_time"],
                "metrics_type": s["metrics_type"],
                "loss_type": s["loss_type"],
                "training_metrics_final": s["training_metrics_final"],
                "training_loss_final": s["training_loss_final"],
                "training_metrics": s["training_metrics"],
                "training_loss": s["training_loss"],
                "validation_metrics_final": s["validation_metrics_final"],
                "validation_loss_final": s["validation_loss_final"],
                "validation_metrics": s["validation_metrics"],
                "validation_loss": s["validation_loss"],
                "metrics_iters": s["metrics_iters"],
                "training_seconds": round(seconds[key]["training_s"], 4),
                "moving_seconds": round(seconds[key]["moving_s"], 4),
            }
        )
    return rows


History = dict[int, dict[int, dict[str, Any]]]
"""mst_key -> iteration -> ``{"records": [hop records], "evals": [per-worker evaluations]}``."""


def model_histories(
    keys: Sequence[int],
    history: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
    evals: dict[tuple[int, int], list[dict[str, Any]]],
) -> History:
    """Every model's iterations: its hop ``records`` and ``evals`` (by ``(mst_key,
    iteration)``), after the iterations ``history`` holds (checkpoint records of a resumed
    run: ``mst_key``, ``iteration``, ``records``, ``evals``)."""
    out: History = {int(k): {} for k in keys}
    for h in history:
        out[int(h["mst_key"])][int(h["iteration"])] = {
            "records": h["records"],
            "evals": h["evals"],
        }
    for r in records:
        entry = out[r["mst_key"]].setdefault(r["iteration"], {"records": [], "evals": []})
        entry["records"].append(r)
    for (k, iteration), found in evals.items():
        out[k][iteration]["evals"] = found
    return out


def iteration_rows(
    entries: dict[int, dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One model's registry iteration rows (:func:`~dvml.train.summary.iteration_record`),
    and its training and moving seconds, from its history (:data:`History`)."""
    rows = []
    train_s = moving_s = 0.0
    for iteration in sorted(entries):
        entry = entries[iteration]
        elapsed = max((r.get("elapsed", 0.0) for r in entry["records"]), default=0.0)
        train_s += sum(r["train_s"] for r in entry["records"])
        moving_s += sum(r["moving_s"] for r in entry["records"])
        pseudo = [{"iteration": iteration, "elapsed": elapsed, **e} for e in entry["evals"]]
        rows.append(iteration_record(pseudo or [{"iteration": iteration, "elapsed": elapsed}]))
    return rows, {"training_s": train_s, "moving_s": moving_s}


def resumed_from(points: dict[int, int]) -> int | None:
    """The run's ``resumed_from_iteration``: None when no model resumed (a fresh run);
    otherwise the lowest iteration a model resumed from: every model's iterations up to it
    come from the interrupted run (0: a model had no checkpoint and started afresh while
    others resumed). Each model's own point is its summary's ``resumed_from_iteration`` and
    the run summary's ``resumed_from_iterations`` (in ``mst_keys`` order).

    >>> resumed_from({1: 3, 2: 1}), resumed_from({1: 0, 2: 0}), resumed_from({1: 2, 2: 0})
    (1, None, 0)
    """
    return min(points.values()) if any(points.values()) else None
