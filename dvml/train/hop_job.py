"""One model-hopper job: what ``fit_multiple``, Hyperband, hyperopt and ASHA schedule on.

A :class:`HopJob` sets up the runtime's :class:`~dvml.train.runtime.hopper.ModelHopper` for a
placed :class:`~dvml.train.runtime.plan.Job` (its checkpoint directory named by the scheduler's
kind and key), reads the job's checkpoints back as one fold (:func:`fold_checkpoints`), handles
a worker that leaves (:meth:`HopJob.lose`), gathers the final weights
(:meth:`HopJob.final_weights`) and builds MADlib's tables (:mod:`dvml.train.hop_tables`). The
schedulers keep only what differs: which model trains next, on which worker.

Departures. A search (Hyperband, hyperopt, ASHA) goes on without a worker that leaves: it
passes a ``go_on_without`` callback that reloads the lost states from their checkpoints.
``fit_multiple`` does not by default: a departed worker stops the job with
:class:`~dvml.exceptions.TrainerFailedError` and nothing is registered, and the same call run
again resumes each model from its own last checkpoint. That is a choice: ``fit_multiple``
promises that every model visits every partition in every iteration (MADlib's rule), which a
job that went on without a worker's partitions would silently break. With ``elastic=True`` it
goes on (:meth:`HopJob.lose`, the departed rows re-pinned and the trainers restarted on the
remaining workers by :func:`dvml.train.hop_repin.go_on_without`, then the rerun rule there),
and its summary names the departed workers, the rows copied and the rows left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dvml.exceptions import TrainerFailedError
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.train.fit_admission import reserved
from dvml.train.hop_admission import check_hop_fits, hop_memory_plan
from dvml.train.runtime.hopper import ModelHopper
from dvml.train.runtime.plan import Job, checkpoint_dir
from dvml.train.runtime.watcher import describe_departure

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["Checkpoints", "HopJob", "fold_checkpoints"]


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """A job's checkpoints, folded.

    Attributes
    ----------
    holders : dict
        mst_key -> iteration -> the worker that keeps that state (only checkpoints whose
        state is kept).
    records : dict
        (mst_key, iteration) -> the checkpoint's record: ``mst_key``, ``iteration``,
        ``records`` and ``evals`` (the first one read, for a checkpoint kept twice).
    """

    holders: dict[int, dict[int, Any]]
    records: dict[tuple[int, int], dict[str, Any]]

    def has_state(self, mst_key: int, iteration: int) -> bool:
        """Whether model ``mst_key``'s state after ``iteration`` is kept on some worker."""
        return iteration in self.holders.get(mst_key, {})

    def iterations(self, mst_key: int) -> list[int]:
        """The iterations of ``mst_key`` with a checkpoint record, in order."""
        return sorted(t for k, t in self.records if k == mst_key)


def fold_checkpoints(entries: Iterable[tuple[Any, dict[str, Any]]]) -> Checkpoints:
    """Fold :meth:`ModelHopper.checkpoints`'s ``(worker, meta)`` pairs into
    :class:`Checkpoints`. Pure.

    Parameters
    ----------
    entries : iterable of (worker, dict)
        Each meta has ``mst_key``, ``iteration``, ``records``, ``evals`` and ``has_state``.

    Returns
    -------
    Checkpoints
    """
    holders: dict[int, dict[int, Any]] = {}
    records: dict[tuple[int, int], dict[str, Any]] = {}
    for worker, meta in entries:
        k, t = int(meta["mst_key"]), int(meta["iteration"])
        records.setdefault((k, t), {"mst_key": k, "iteration": t, "records": meta["records"],
                                    "evals": meta["evals"]})  # fmt: skip
        if meta["has_state"]:
            holders.setdefault(k, {}).setdefault(t, worker)
    return Checkpoints(holders, records)


class HopJob:
    """The model-hopper job of one ``fit_multiple`` or search run.

    Parameters
    ----------
    client : distributed.Client
        The Dask client.
    job : Job
        :func:`~dvml.train.runtime.plan.place_job`'s job (datasets, workers, seed, timeout).
    model_output : str
        The run's name (its models are ``f"{model_output}_{mst_key}"``).
    kind : str
        The scheduler's checkpoint folder kind: ``"mop"`` (fit_multiple), ``"hop"``
        (Hyperband, hyperopt), ``"asha"``.
    key : str
        The run's key (:func:`~dvml.train.runtime.plan.job_key`): the same call, the same key.
    started_at : float, optional
        Wall clock the job's records are timed from (an earlier run's, once resumed).
    configs : sequence of dict, optional
        The trainer configurations the job trains (``model_json``, parsed ``compile_params``
        and ``fit_params``): the job is admitted by their memory plan (:attr:`memory`) before
        any trainer starts, and holds its reservation until its trainers stop. None: not
        planned (a search whose configurations are drawn as it runs).

    Raises
    ------
    MemoryPlanError
        The plan of ``configs`` does not fit its hosts, alone or beside the running jobs'
        reservations: no trainer was started.
    """

    #: the scheduler's name in messages and reservations, by checkpoint folder kind
    JOB_NAMES: Mapping[str, str] = {"mop": "dvml.fit_multiple", "hop": "dvml.automl",
                                    "asha": "dvml.automl"}  # fmt: skip

    def __init__(
        self,
        client: Client,
        job: Job,
        model_output: str,
        *,
        kind: str,
        key: str,
        started_at: float | None = None,
        configs: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.client, self.job, self.model_output, self.key = client, job, model_output, key
        self.checkpoint_dir = checkpoint_dir(model_output, kind, key)
        # Admitted before any trainer starts (a memory plan of the trainers on each worker),
        # its bytes reserved on the scheduler until its trainers stop: every model-hopper
        # scheduler passes here.
        self.name = f"{self.JOB_NAMES.get(kind, 'dvml.fit_multiple')} {model_output!r}"
        self.memory: FitMemoryPlan | None = None
        self.reservation = contextlib.ExitStack()
        if configs:
            self.memory = hop_memory_plan(
                client, job.workers, job.train, configs, use_gpus=bool(job.args.use_gpus)
            )
            check_hop_fits(self.memory, self.name, len(configs))
            self.reservation.enter_context(reserved(client, self.memory, self.name))
        try:
            self.hopper = self._hopper(started_at)
        except BaseException:
            self.reservation.close()
            raise
        self.hopper.on_stop.append(self.reservation.close)

    def _hopper(self, started_at: float | None) -> ModelHopper:
        client, job, model_output, key = self.client, self.job, self.model_output, self.key
        return ModelHopper(
            client, name=model_output, training=job.train.name,
            validation=job.valid.name if job.valid else None, workers=list(job.workers),
            seed=job.seed, job_key=key, checkpoint_dir=self.checkpoint_dir,
            custom_sources=job.custom_sources, use_gpus=job.args.use_gpus, timeout=job.timeout,
            augment=job.augment, started_at=started_at,
        )  # fmt: skip

    def checkpoints(self) -> Checkpoints:
        """Every checkpoint of the job on its remaining workers, folded."""
        return fold_checkpoints(self.hopper.checkpoints())

    def lose(self, gone: list[Any], workers: list[Any], hint: str) -> list[int]:
        """Leave the departed workers ``gone`` out (:meth:`ModelHopper.lose`); returns the
        models whose state went with them. Raises when none of ``workers`` (the scheduler's
        own, ``gone`` left out) is left; ``hint`` says what to do then."""
        lost = self.hopper.lose(gone)
        if not workers:
            raise TrainerFailedError(
                f"{describe_departure(gone)}; no worker of job {self.model_output!r} is "
                f"left. {hint}"
            )
        return lost

    def final_weights(
        self, go_on_without: Callable[[list[Any]], object] | None = None
    ) -> dict[int, bytes]:
        """Every model's weights, gathered once at the end.

        With ``go_on_without`` (a search), a worker that departs meanwhile is passed to it
        (which reloads the states it held from their checkpoints, or fails their models) and
        the weights are asked again; a model whose state is lost is left out. Without it
        (``fit_multiple``), a departure stops the job (:meth:`ModelHopper.departure_error`)
        and every model must have its weights.

        Raises
        ------
        TrainerFailedError
            Without ``go_on_without``: a worker departed, or a model's weights could not be
            read.
        """
        while True:
            weights, gone = self.hopper.all_weights()
            if not gone:
                break
            if go_on_without is None:
                raise self.hopper.departure_error(gone)
            go_on_without(gone)
        missing = sorted(set(self.hopper.states) - set(weights))
        if go_on_without is None and missing:
            raise TrainerFailedError(
                f"The final weights of models {missing} of job {self.model_output!r} could "
                "not be read (their last task failed). Received: no weights for mst_keys "
                f"{missing}. Run the same call again: it resumes from the models' checkpoints."
            )
        return weights
