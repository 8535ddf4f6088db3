"""MADlib's Hyperband and hyperopt on ONE job of serving trainers, with MOP's schedule.

MADlib runs every step of a search as a ``fit_multiple`` call (new trainers, every model
registered, survivors warm-started from the registry). Here a search is one
:class:`~dvml.train.runtime.hopper.ModelHopper` for its whole length: the trainers start once,
a configuration joins the running job when it first trains (:meth:`ModelHopper.add`), and a
configuration that goes on (a Hyperband survivor) continues from its state in the cluster,
weights AND optimizer variables, never from the registry. Each step
(:meth:`HopSearch.train`: a Hyperband diagonal, a hyperopt batch) trains its configurations
with ``fit_multiple``'s MOP loop (:func:`dvml.train.hop_loop.run_iterations`) for ``r``
iterations, evaluating at the end and every ``metrics_compute_frequency`` iterations,
checkpointing every iteration (owner-only); iterations are numbered over the whole search, so
the history of each configuration gives MADlib's ``metrics_iters`` directly.
:meth:`HopSearch.finish` gathers every configuration's weights once, at the end, for
:func:`~dvml.search.outcome.build_outcome`.

A worker that leaves the cluster during a step is named within the runtime watcher's bound
and left out: its rows are re-pinned onto the remaining workers and their trainers restarted
on the new layout (:func:`dvml.train.hop_repin.go_on_without`, as an elastic
``fit_multiple`` does; rows whose vineyardd is gone too are left out and counted), the step
starts again there from the states its configurations began it with (a configuration whose
state went with the worker is failed: loss None, ranked last), and the search goes on. So is a
worker whose trainer died (killed, out of memory) while the worker stays, as ASHA does; the
search stops only when every trainer died.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.configs import ModelConfig
from dvml.exceptions import TrainerFailedError
from dvml.registry.database import Registry
from dvml.search.outcome import Configuration, SearchOutcome, build_outcome
from dvml.train.departures import departure_fields
from dvml.train.hop_job import HopJob
from dvml.train.hop_loop import Evaluations, first_workers, run_iterations
from dvml.train.hop_repin import go_on_without, workers_to_leave
from dvml.train.hop_schedule import History, model_histories
from dvml.train.hop_tables import build_tables
from dvml.train.runtime.checkpoints import resume_iteration
from dvml.train.runtime.model_state import state_bytes
from dvml.train.runtime.plan import Job, dataset_key, job_key, model_spec, now
from dvml.train.runtime.watcher import describe_departure
from dvml.train.summary import aggregate

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = ["HopSearch"]

logger = logging.getLogger("dvml.search")
RERUN = (
    "Bring the workers back and run the search again: Hyperband and hyperopt start "
    "again from the beginning (only ASHA resumes, with resume=True)."
)


class HopSearch:
    """The trainers (one :class:`~dvml.train.hop_job.HopJob`), states and history of one
    Hyperband or hyperopt search.

    Parameters
    ----------
    client, reg
        The Dask client and the registry.
    job : Job
        The placed job (:func:`~dvml.train.runtime.plan.place_job`) the search runs on.
    model_output : str
        The search's name (its models are ``f"{model_output}_{mst_key}"``).
    header : dict
        The scheduler's journal header: with the datasets and workers, the search's key.
    memory_configs : list of dict, optional
        The trainer configurations the job is admitted by (its memory plan, before any trainer
        starts: :func:`dvml.search.search_memory.bounding_configs`); None: not planned.
    """

    def __init__(
        self,
        client: Client,
        reg: Registry,
        job: Job,
        model_output: str,
        header: dict[str, Any],
        *,
        progress: bool = True,
        name: str | None = None,
        description: str | None = None,
        memory_configs: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        self.client, self.reg, self.job, self.model_output = client, reg, job, model_output
        self.progress, self.name, self.description = progress, name, description
        self.loss_part = "validation" if job.valid is not None else "training"
        key = job_key(
            "automl-hop", model_output, dataset_key(job.train), dataset_key(job.valid), header,
            [w.name for w in job.workers], job.seed, *job.augment_key,
        )  # fmt: skip
        self.start_text = now()
        # admitted by the plan of ``memory_configs`` (the space's largest configurations)
        self.hop = HopJob(client, job, model_output, kind="hop", key=key, configs=memory_configs)
        self.hopper = self.hop.hopper
        self.configs: dict[int, tuple[int, dict[str, Any]]] = {}  # mst_key -> arch, spec
        self.iterations: dict[int, int] = {}  # mst_key -> iterations trained
        self.last: dict[int, int] = {}  # mst_key -> the search's iteration of its last state
        self.failed: set[int] = set()  # state lost with a departed worker
        self.departed: list[str] = []
        self.departures: list[dict[str, Any]] = []  # the re-pins (hop_repin.go_on_without)
        self.history: History = {}
        self.initial: dict[int, bytes] = {}  # the starting state of models new in this step

    def train(
        self, rows: Sequence[ModelConfig], iterations: int, offset: int
    ) -> dict[int, float | None]:
        """Train ``rows`` (new ones join the job) ``iterations`` more, numbered after
        ``offset``; return each one's loss (validation, else training; None: failed)."""
        for r in rows:
            if r.mst_key not in self.configs:
                spec = model_spec(
                    self.reg, r.model_id, r.compile_params, r.fit_params, self.job.train,
                    list(self.job.custom_sources),
                )  # fmt: skip
                self.configs[r.mst_key] = (r.model_id, spec.config())
                self.iterations[r.mst_key] = 0
                weights = list(spec.weights) if spec.weights is not None else []
                self.initial[r.mst_key] = state_bytes(weights)
                self._add(r.mst_key, self.initial[r.mst_key])
        keys = sorted(r.mst_key for r in rows if r.mst_key not in self.failed)
        frequency = self.job.args.metrics_compute_frequency
        if frequency is None or not 1 <= frequency <= iterations:
            frequency = iterations  # MADlib's _is_valid_metrics_compute_frequency
        records, evals = self._run(keys, iterations, frequency, offset)
        self.initial.clear()  # trained: a departure from now on goes back to its state
        keys = [k for k in keys if k not in self.failed]
        for k, entries in model_histories(keys, [], records, evals).items():
            self.history.setdefault(k, {}).update(entries)
            self.iterations[k] += iterations
            self.last[k] = offset + iterations
        return {r.mst_key: self._loss(evals, r.mst_key, offset + iterations) for r in rows}

    def _add(self, mst_key: int, state: bytes | Future) -> None:
        """Add a model where the MOP schedule starts it (among the job's models)."""
        keys = sorted({*self.hopper.states, mst_key})
        self.hopper.add(mst_key, self.configs[mst_key][1], state,
                        first_workers(keys, self.hopper.workers)[mst_key])  # fmt: skip

    def _run(
        self, keys: list[int], iterations: int, frequency: int, offset: int
    ) -> tuple[list[dict[str, Any]], Evaluations]:
        """The MOP loop over ``keys``, numbered after ``offset``. When a worker departs, the
        step goes on on the remaining workers from the last iteration that every model of it
        checkpointed there (else from the states they began it with)."""
        first, done_before = 1, list[dict[str, Any]]()
        began = {k: self.hopper.states[k] for k in keys}
        while keys:
            label = f"dvml.automl {self.model_output}" if self.progress else None
            try:
                records, evals = run_iterations(
                    self.hopper, keys, range(first, iterations + 1), frequency, offset=offset,
                    label=label,
                )  # fmt: skip
                break
            except TrainerFailedError:
                gone, why = workers_to_leave(self.hop)
                if not gone:
                    raise
            keys, first, done_before = self._go_on_without(gone, began, offset, iterations, why)
            # the step goes on over every row: the departed rows re-pinned, new trainers
            departure = go_on_without(self.hop, gone, list(self.hopper.workers), RERUN)
            self.departures.append({**departure, "at_iteration": offset + first})
        else:
            return [], {}
        # iterations checkpointed before a departure: their records and evaluations
        for h in done_before:
            records.extend(h["records"])
            evals.update({(h["mst_key"], h["iteration"]): h["evals"]} if h["evals"] else {})
        return records, evals

    def _go_on_without(
        self,
        gone: list[Any],
        began: dict[int, Future],
        offset: int,
        iterations: int,
        why: str = "",
    ) -> tuple[list[int], int, list[dict[str, Any]]]:
        """Leave ``gone`` out. The step's models go on from the last iteration every one of
        them checkpointed on the remaining workers, or else from the states they began it
        with (kept in memory, or checkpointed); a model outside the step whose state went with
        ``gone`` is added again from its last checkpoint (for its weights). A model with
        neither is failed. Returns the step's models, its first iteration to run and the
        checkpoint records of the iterations before it. ``why``: their trainer died (they
        stay in the cluster); else they departed."""
        self.departed.extend(w.name for w in gone)
        line = f"{why or describe_departure(gone)}: the search goes on without it"
        logger.warning("[dvml.automl %s] %s", self.model_output, line)
        remaining = [w for w in self.hopper.workers if w not in gone]
        lost = self.hop.lose(gone, remaining, RERUN)
        step = sorted(k for k in began if k not in self.failed)
        self.hopper.forget([k for k in step if k in self.hopper.states])  # mid-step states
        found = self.hop.checkpoints()
        latest, metas = found.holders, list(found.records.values())
        for k in lost:  # outside the step: its last state, for its weights
            if k not in began and self.last.get(k, 0) in latest.get(k, {}):
                self._load(k, self.last[k], latest[k][self.last[k]])
            elif k not in began:
                self.failed.add(k)
        window = range(offset + 1, offset + iterations + 1)
        done = resume_iteration(
            {k: [t - offset for t in latest.get(k, {}) if t in window] for k in step},
            lambda iteration: True,
        )
        if done > 0:
            for k in step:
                self._load(k, offset + done, latest[k][offset + done])
            kept = [m for m in metas if m["mst_key"] in began and offset < m["iteration"]
                    <= offset + done]  # fmt: skip
            return step, done + 1, kept
        kept_on = {w.address for w in self.hopper.workers}
        finished = [f for f in began.values() if f.status == "finished"]
        held = self.client.who_has(finished) if finished else {}
        for k in step:
            at = self.last.get(k, 0)
            if k in self.initial:
                self._add(k, self.initial[k])
            elif kept_on & set(held.get(began[k].key, ())):
                self._add(k, began[k])
            elif at in latest.get(k, {}):  # the state it began the step with, checkpointed
                self._load(k, at, latest[k][at])
            else:
                self.failed.add(k)
        return [k for k in step if k not in self.failed], 1, []

    def _load(self, mst_key: int, iteration: int, holder: Any) -> None:
        """Add a model again from its checkpoint after ``iteration``, kept on ``holder``."""
        self._add(mst_key, self.hopper.load(mst_key, iteration, holder))

    def _loss(self, evals: Evaluations, mst_key: int, iteration: int) -> float | None:
        found = [e[self.loss_part] for e in evals.get((mst_key, iteration), [])
                 if self.loss_part in e]  # fmt: skip
        return aggregate(found).get("loss") if found else None

    def finish(
        self, info: dict[int, dict[str, Any]], journal: str, best: int | None
    ) -> SearchOutcome:
        """Every configuration's weights (gathered once), MADlib's tables; stop the trainers.

        ``info`` holds the method's own ``.info`` columns of each configuration.
        """
        try:
            # a worker that departs now is left out, and the states it held are reloaded
            # from their checkpoints (or their models failed)
            weights = self.hop.final_weights(lambda gone: self._go_on_without(gone, {}, 0, 0))
        finally:
            self.hopper.stop()
        configurations = [
            Configuration(k, arch, spec, self.iterations[k], info=info.get(k, {}))
            for k, (arch, spec) in sorted(self.configs.items())
        ]
        times = {"start": self.start_text, "end": now(), "name": self.name,
                 "description": self.description, "wall_seconds": self._wall()}  # fmt: skip
        tables = build_tables(self.job, self.model_output, configurations, self.history,
                              weights, times)  # fmt: skip
        outcome = build_outcome(tables, self.job, self.history, times=times, journal=journal,
                                best=best)  # fmt: skip
        outcome.summary["departed"] = self.departed
        repins = departure_fields(self.departures)  # its "departed": only the steps' departures
        outcome.summary.update({k: v for k, v in repins.items() if k != "departed"})
        outcome.summary["failed"] = sorted(self.failed)  # their state went with a departed worker
        self.hopper.clear_checkpoints()
        return outcome

    def _wall(self) -> float:
        return time.time() - float(self.hopper.job["started_at"])

    def stop(self) -> None:
        """Stop the trainers and every task of the search (on an error)."""
        self.hopper.cancel()
        self.hopper.stop()
