"""A job's own TensorBoard stream: one event file per job under ``tensorboard_dir/job``, with
per-iteration (``fit``) or per-report (``dvml.run``) scalars of the job and of every trainer
(written by the client as the trainers' messages arrive; the trainers' own Keras streams are
``tensorboard_dir/<worker>``).

Written with TensorBoard's protobufs, not TensorFlow: the client never imports TensorFlow.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

JOB_DIR = "job"
"""The job's stream, beside the trainers' directories."""


def iteration_scalars(
    record: Mapping[str, Any], trainers: Iterable[Mapping[str, Any]]
) -> dict[str, float]:
    """The scalars of one iteration (pure): the job's figures and, under
    ``trainer/<worker>/``, each trainer's ``fit_loss``, ``steps``, ``step_seconds`` (its own
    input and compute per step) and ``averaging_seconds``. Missing or non-finite values are
    left out."""
    found: dict[str, Any] = {
        "loss": record.get("fit_loss"),
        "training_loss": record.get("training_loss"),
        "validation_loss": record.get("validation_loss"),
        "seconds/fit": record.get("fit_seconds"),
        "seconds/averaging": record.get("averaging_seconds"),
        "seconds/metrics": record.get("metrics_seconds"),
    }
    for part in ("training", "validation"):
        for name, value in (record.get(f"{part}_metrics") or {}).items():
            found[f"{part}_{name}"] = value
    for m in trainers:
        steps = max(int(m.get("steps") or 1), 1)
        fit_s, wait_s = float(m.get("fit_seconds") or 0.0), float(m.get("averaging_seconds") or 0.0)
        prefix = f"trainer/{m['worker']}"
        found[f"{prefix}/fit_loss"] = m.get("fit_loss")
        found[f"{prefix}/steps"] = steps
        found[f"{prefix}/step_seconds"] = max(fit_s - wait_s, 0.0) / steps
        found[f"{prefix}/averaging_seconds"] = wait_s
    return _finite(found)


def report_scalars(
    record: Mapping[str, Any], reports: Iterable[Mapping[str, Any]]
) -> dict[str, float]:
    """The scalars of one ``dvml.run`` report step (pure): each metric averaged over the
    trainers (``record``, as the run's history holds it) and, under ``trainer/<worker>/``,
    each trainer's own value and its seconds since the run started (``elapsed``)."""
    found: dict[str, Any] = {k: v for k, v in record.items() if k not in ("step", "elapsed_s")}
    found["seconds/elapsed"] = record.get("elapsed_s")
    for m in reports:
        prefix = f"trainer/{m['worker']}"
        found[f"{prefix}/elapsed_seconds"] = m.get("elapsed")
        for metric, value in (m.get("metrics") or {}).items():
            found[f"{prefix}/{metric}"] = value
    return _finite(found)


def _finite(found: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in found.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }


class JobScalars:
    """The job's event file; :meth:`write` one iteration, :meth:`close` at the end."""

    def __init__(self, tensorboard_dir: str) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        path = os.path.join(tensorboard_dir, JOB_DIR)
        os.makedirs(path, exist_ok=True)
        self._writer = EventFileWriter(path)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
        self._writer.add_event(
            event_pb2.Event(
                wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
            )
        )
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
