"""``dvml.plan``: a job's memory plan, computed as the job would, without doing the job.

- :func:`fit`: the trainers' resident bytes per host (a
  :class:`~dvml.placement.fit_memory.FitMemoryPlan`), what :func:`dvml.fit` checks before
  any trainer starts;
- :func:`fit_multiple`: the model hopper's trainers per host (the same table type), what
  :func:`dvml.fit_multiple` checks before any trainer starts
  (:mod:`dvml.placement.hop_memory`: the largest configuration in the step, every
  configuration kept compiled in each trainer, the parked states in the Dask workers);
- :func:`run`: the trainers of :func:`dvml.run` per host (the same table type): TensorFlow's
  runtime, the primary dataset's batches and the caller's estimate of what ``train_fn``
  builds (``memory=``), what :func:`dvml.run` checks before any trainer starts;
- :func:`pack`: the shared-memory bytes per vineyardd of a preprocessor call
  (:class:`~dvml.placement.memory.MemoryPlan`), what the preprocessors check before any write.

Each returns the plan whether it fits or not (``plan.fits``, ``plan.table()``,
``plan.describe()``, ``plan.fixes``); nothing is written and no trainer starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import current_client
from dvml.exceptions import PlacementError
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.placement.memory import MemoryPlan
from dvml.preprocess import api as preprocess_api
from dvml.preprocess.admission import Planned, planning_only
from dvml.registry.database import Registry, open_registry
from dvml.store.datasets import Dataset
from dvml.train import fit_multiple as fit_multiple_module
from dvml.train.hop_admission import hop_memory_plan
from dvml.train.run import place_run
from dvml.train.runtime.plan import JobArgs, batch_split, model_spec, place_job
from dvml.train.trainer_memory import fit_memory_plan

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["fit", "fit_multiple", "pack", "run"]


def fit(
    training_set: str | Dataset,
    arch_id: int,
    compile_params: str | dict[str, Any],
    fit_params: str | dict[str, Any] | None = None,
    *,
    use_gpus: bool = False,
    validation_set: str | Dataset | None = None,
    custom_objects: list[str] | None = None,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> FitMemoryPlan:
    """The memory plan of ``dvml.fit(training_set, ..., arch_id, compile_params, fit_params)``.

    Takes :func:`dvml.fit`'s arguments (those that change its memory) and checks them as it
    does, then reads each trainer host's room (from the workers' heartbeats). Starts no trainer.

    Parameters
    ----------
    training_set, arch_id, compile_params, fit_params : as for dvml.fit
        The training set, the architecture and its parameters.
    use_gpus, validation_set, custom_objects : optional
        As for :func:`dvml.fit`.
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).

    Returns
    -------
    FitMemoryPlan
        One row per trainer in ``.table()``; ``.fits``; ``.fixes`` when it does not fit.
    """
    reg = open_registry(registry)
    client = current_client(client)
    args = JobArgs("memory_plan", training_set, validation_set, 1, None, use_gpus, False,
                   custom_objects, None, None)  # fmt: skip
    job = place_job(reg, client, args)
    spec = model_spec(reg, arch_id, compile_params, fit_params, job.train, custom_objects or [])
    per_worker, _ = batch_split(job.train, job.workers, int(spec.fit_params["batch_size"]))
    return fit_memory_plan(
        client, job.workers, per_worker, job.train.summary, spec.arch, spec.compile_params,
        spec.weights, use_gpus=use_gpus,
    )  # fmt: skip


def fit_multiple(
    training_set: str | Dataset,
    configs: Any,
    *,
    use_gpus: bool = False,
    validation_set: str | Dataset | None = None,
    custom_objects: list[str] | None = None,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> FitMemoryPlan:
    """The memory plan of ``dvml.fit_multiple(training_set, ..., configs, ...)``.

    Takes :func:`dvml.fit_multiple`'s arguments that change its memory (``configs``: a stored
    model selection table's name, the table, or its rows) and checks them as it does, then
    reads each trainer host's room (from the workers' heartbeats). Starts no trainer.

    Parameters
    ----------
    training_set, configs : as for dvml.fit_multiple
        The training set and the configurations.
    use_gpus, validation_set, custom_objects : optional
        As for :func:`dvml.fit_multiple`.
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).

    Returns
    -------
    FitMemoryPlan
        One row per trainer in ``.table()`` (with the hopper's ``models`` and ``parked``
        columns); ``.fits``; ``.fixes`` when it does not fit.
    """
    reg = open_registry(registry)
    client = current_client(client)
    args = JobArgs("memory_plan", training_set, validation_set, 1, None, use_gpus, False,
                   custom_objects, None, None)  # fmt: skip
    prepared = fit_multiple_module.prepare(reg, client, args, configs)
    return hop_memory_plan(
        client, prepared.job.workers, prepared.job.train, list(prepared.parsed.values()),
        use_gpus=use_gpus,
    )  # fmt: skip


def pack(source: Any, *, validation: bool = False, **kwargs: Any) -> MemoryPlan:
    """The memory plan of ``dvml.training_preprocessor(source, **kwargs)``.

    The source is read and its rows counted as the preprocessor does (that is most of a pack's
    time for a large source); then, instead of splitting and packing, the plan is returned.
    Nothing is written to any vineyardd.

    Parameters
    ----------
    source : as for dvml.training_preprocessor
        The data to pack.
    validation : bool
        Plan ``dvml.validation_preprocessor(source, **kwargs)`` instead.
    **kwargs
        The preprocessor's other arguments.

    Returns
    -------
    MemoryPlan
        The shared-memory bytes per vineyardd; ``.fits``; ``.fixes`` when it does not fit.
    """
    api = preprocess_api
    call = api.validation_preprocessor if validation else api.training_preprocessor
    try:
        with planning_only():
            call(source, **kwargs)
    except Planned as planned:
        return planned.plan
    raise PlacementError(  # only when a preprocessor path skipped its plan: a dvml bug
        "The preprocessor packed without computing its memory plan. Received: "
        f"validation={validation}. Report this as a dvml bug."
    )


def run(
    datasets: str | Dataset | Mapping[str, str | Dataset],
    *,
    batch_size: int = 32,
    use_gpus: bool = False,
    memory: int | str | None = None,
    client: Client | None = None,
) -> FitMemoryPlan:
    """The memory plan of ``dvml.run(train_fn, datasets, batch_size=..., memory=...)``.

    Takes :func:`dvml.run`'s arguments that change its memory and places the trainers as it
    does; starts no trainer.

    Parameters
    ----------
    datasets, batch_size, use_gpus : as for dvml.run
        The datasets the trainers read, the global batch size, GPU placement.
    memory : int or str, optional
        The caller's estimate of what ``train_fn`` builds in each trainer (without it the
        plan is a lower bound, and its notes say so).
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    FitMemoryPlan
        One row per trainer in ``.table()``; ``.fits``; ``.fixes`` when it does not fit.
    """
    client = current_client(client)
    placed = place_run(client, "memory_plan", datasets, "step", use_gpus, batch_size, None,
                       memory, check=False)  # fmt: skip
    return placed.plan
