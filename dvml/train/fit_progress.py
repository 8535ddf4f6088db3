"""A fit's progress on the client: each iteration reported once all its trainers sent it.

One record per iteration (``on_iteration``'s), the progress line with the stragglers
(:mod:`dvml.train.stragglers`) and the trainers over their memory plan, and the job's
TensorBoard stream.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from dvml import config
from dvml.train.job_scalars import JobScalars, iteration_scalars
from dvml.train.memory_use import over_plan
from dvml.train.stragglers import TrainerTiming, cumulative, describe, stragglers, timings_of
from dvml.train.summary import iteration_record

__all__ = ["FitProgress"]

logger = logging.getLogger("dvml.train")


class FitProgress:
    """Collects trainers' progress events; reports each iteration once all trainers sent it."""

    def __init__(
        self,
        names: dict[str, str],
        model: str,
        total: int,
        callback: Callable[[dict[str, Any]], None] | None,
        echo: bool,
        scalars: JobScalars | None = None,
        planned: dict[str, int] | None = None,
    ) -> None:
        # the trainers' worker names by address (Dask's log_event sets "worker" to the address)
        self.names, self.n, self.model, self.total = names, len(names), model, total
        self.callback, self.echo, self.scalars = callback, echo, scalars
        self.pending: dict[int, list[dict[str, Any]]] = {}
        self.timings: list[list[TrainerTiming]] = []  # of this run's iterations, in order
        self.planned: dict[str, int] = dict(planned or {})
        self.named_over: set[str] = set()  # trainers already named over their memory plan

    def regroup(self, workers: list[Any], why: str) -> None:
        """The trainers of an elastic fit's next run (``why``: the departure, printed with
        the progress lines): iterations wait for these only, and stragglers are named among
        them (a departed trainer's figures are not compared)."""
        if self.echo:
            print(f"[dvml.fit {self.model}] {why}", flush=True)
        self.names, self.n = {w.address: w.name for w in workers}, len(workers)
        self.pending.clear()
        self.timings.clear()

    def _over_plan(self, named: list[dict[str, Any]]) -> list[str]:
        """A line's note for each trainer over its memory plan (once per trainer)."""
        margin = float(config.get("memory.margin"))
        notes = []
        for m in named:
            worker, used = m["worker"], m.get("resident_bytes")
            planned = self.planned.get(worker)
            if worker in self.named_over or planned is None or used is None:
                continue
            if over_plan(planned, used, margin):
                self.named_over.add(worker)
                notes.append(
                    f"the trainer on {worker} uses {used / 2**20:.0f} MiB, over its planned "
                    f"{planned / 2**20:.0f} MiB (+{margin:.0%} margin)"
                )
        return notes

    def __call__(self, event: tuple[float, dict[str, Any]]) -> None:
        _, message = event
        if message.get("kind") != "iteration":
            return
        bucket = self.pending.setdefault(message["iteration"], [])
        bucket.append(message)
        if len(bucket) < self.n:
            return
        record = iteration_record(bucket)
        record["fit_loss"] = sum(m["fit_loss"] for m in bucket) / len(bucket)
        # training time alone (the slowest trainer), and the part of it spent averaging
        record["fit_seconds"] = max(m.get("fit_seconds", 0.0) for m in bucket)
        record["averaging_seconds"] = max(m.get("averaging_seconds", 0.0) for m in bucket)
        # the end-of-iteration metrics over the local rows (0 where none were computed)
        record["metrics_seconds"] = max(m.get("metrics_seconds", 0.0) for m in bucket)
        # the trainers slower than the others over the run so far (dvml.train.stragglers)
        named = [{**m, "worker": self.names.get(m["worker"], m["worker"])} for m in bucket]
        self.timings.append(timings_of(named))
        slow = stragglers(cumulative(self.timings))
        record["stragglers"] = [dataclasses.asdict(s) for s in slow]
        over = self._over_plan(named)  # named once, in the line and the record
        record["memory_over_plan"] = over
        if self.scalars is not None:  # the job's TensorBoard stream (tensorboard_dir/job)
            self.scalars.write(record["iteration"], iteration_scalars(record, named))
        if self.echo:
            metrics = record.get("training_metrics") or {}
            extra = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
            if record.get("validation_loss") is not None:
                extra += f" val_loss={record['validation_loss']:.4f}"
                extra += "".join(
                    f" val_{k}={v:.4f}" for k, v in (record.get("validation_metrics") or {}).items()
                )
            line = (
                f"[dvml.fit {self.model}] iteration {record['iteration']}/{self.total} "
                f"loss={record['fit_loss']:.4f} {extra} ({record['elapsed_s']:.1f}s)"
            )
            step = bucket[0].get("sync") == "step"  # its wait is in the all-reduce
            line += "".join(f"; {describe(s, step=step)}" for s in slow)
            line += "".join(f"; {note}" for note in over)
            logger.info(line)
            print(line, flush=True)
        if self.callback is not None:
            self.callback(record)
