"""``dvml.run``: your own training loop on pinned, zero-copy data.

A scheduler on the trainer runtime, like ``fit``: one trainer per worker that holds the
primary dataset, in lock-step (``TF_CONFIG``, a MultiWorkerMirroredStrategy), each running
the user's ``train_fn(context)`` (:class:`~dvml.train.runtime.user_program.TrainContext`) on
its LOCAL rows. The runtime does the rest as for ``fit``: the standby start, the client lease,
the failure watcher (a trainer that raises stops every trainer, its traceback in the error),
owner-only checkpoints and the resume point.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from dvml import config as settings
from dvml._version import __version__
from dvml.cluster.workers import current_client
from dvml.configs import parse_compile_params
from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.names import check_name
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.registry.database import Registry, open_registry
from dvml.registry.weights import weights_from_bytes
from dvml.store.datasets import Dataset, resolve_dataset
from dvml.store.leases import holding
from dvml.store.versions import dataset_lineage
from dvml.tracking.mlflow_client import log_run, tracking_uri
from dvml.tracking.model_events import log_models_saved
from dvml.tracking.runs import DatasetInput, dataset_input, user_run
from dvml.train.fit_admission import reserved
from dvml.train.job_scalars import JobScalars, report_scalars
from dvml.train.memory_use import memory_summary
from dvml.train.model_lock import holding_model
from dvml.train.run_memory import memory_estimate, run_memory_plan
from dvml.train.runtime.lockstep import clear_checkpoints, find_checkpoint, run_lockstep
from dvml.train.runtime.plan import (
    batch_split,
    check_colocated,
    checkpoint_dir,
    dataset_key,
    job_key,
    now,
    runtime_settings,
    training_workers,
)
from dvml.train.runtime.shipped import pickle_by_value, source_texts
from dvml.train.summary import build_summary, weights_size_kb
from dvml.train.trainer_memory import check_fit_fits

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["PlacedRun", "RunResult", "place_run", "run"]

logger = logging.getLogger("dvml.train")

SYNC_MODES = ("step", "none")


@dataclasses.dataclass
class RunResult:
    """What :func:`run` returns.

    Parameters
    ----------
    name : str
        The run's name (its checkpoints and lock are keyed by it).
    value : Any
        What ``train_fn`` returned on the chief (rank 0).
    history : pandas.DataFrame
        One row per ``context.report`` step: ``step``, ``elapsed_s`` and each metric averaged
        over the trainers.
    reports : list of dict
        Every trainer's reports (``worker``, ``step``, ``metrics``, ``elapsed``).
    models : list of str
        The models ``context.save_model`` stored in the registry.
    workers : list of str
        The workers a trainer ran on.
    resumed_from_step : int or None
        The checkpointed step a rerun started after.
    memory_plan : FitMemoryPlan or None
        The run's memory plan (``dvml.plan.run``): per trainer and host, what was admitted.
    memory : dict
        The plan against what the trainers used, as in a fit's summary: ``trainer_memory``
        (worker → planned and peak bytes), ``memory_over_plan`` and ``host_memory``.
    """

    name: str
    value: Any
    history: pd.DataFrame
    reports: list[dict[str, Any]]
    models: list[str]
    workers: list[str]
    resumed_from_step: int | None
    memory_plan: FitMemoryPlan | None = None
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"<dvml.RunResult {self.name!r} steps={len(self.history)} "
            f"workers={self.workers} models={self.models}>"
        )


def run(
    train_fn: Callable[[Any], Any],
    datasets: str | Dataset | Mapping[str, str | Dataset],
    config: Mapping[str, Any] | None = None,
    *,
    sync: str = "step",
    use_gpus: bool = False,
    name: str | None = None,
    batch_size: int = 32,
    seed: int | None = None,
    timeout: float | None = None,
    resume: bool = True,
    progress: bool = True,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    tensorboard_dir: str | None = None,
    memory: int | str | None = None,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> RunResult:
    """Run ``train_fn(context)`` in one trainer per worker that holds the data.

    Parameters
    ----------
    train_fn : callable
        Your training loop, shipped as code (cloudpickle, as Dask ships tasks). It receives a
        :class:`~dvml.train.runtime.user_program.TrainContext`: ``context.strategy`` (a
        MultiWorkerMirroredStrategy, ``TF_CONFIG`` set), ``context.dataset(name)`` (this
        worker's LOCAL rows, zero-copy, the same steps per epoch on every trainer),
        ``context.distributed_dataset(name)`` (for ``strategy.run``),
        ``context.dataset_creator(name)`` (for ``model.fit``), ``rank``, ``world_size``,
        ``host``, ``gpus``, ``config``, ``report(metrics, checkpoint=...)``,
        ``checkpoint()`` and ``save_model(model, name)``. Build models and optimizers inside
        ``with context.strategy.scope():``.
    datasets : str, Dataset or dict
        A dataset (then named ``"train"``), or ``{name: dataset}``; the first is the primary:
        its workers run the trainers and its rows are split into the balanced steps. The
        others (a validation set) must be on the same workers.
    config : dict, optional
        Anything ``train_fn`` reads from ``context.config`` (learning rate, epochs...).
    sync : {"step", "none"}
        ``"step"``: a MultiWorkerMirroredStrategy over every trainer. ``"none"``: no strategy;
        each trainer runs on its own (a local-only loop).
    use_gpus : bool
        Give the trainers their worker's GPUs (refused when one has none).
    name : str, optional
        Names the run's checkpoints and lock (default: ``train_fn.__name__``); a rerun of the
        same name resumes (``context.checkpoint()``).
    batch_size : int
        The GLOBAL batch of one step, split over the trainers as ``fit`` splits it.
    seed, timeout : optional
        The shuffles' seed (config ``dvml.preprocess.seed``); seconds before the trainers are
        stopped (config ``dvml.train.trainer-timeout``).
    resume : bool
        Hand the last checkpoint of an interrupted run of the same name to ``train_fn``.
    progress : bool
        Print one line per report step.
    on_report : callable, optional
        Called on the client with each step's record once every trainer reported it.
    tensorboard_dir : str, optional
        Write the run's TensorBoard stream to ``tensorboard_dir/job``: per report step, each
        metric averaged over the trainers and every trainer's own value and elapsed seconds
        (``trainer/<worker>/...``).
    memory : int or str, optional
        Your estimate of what ``train_fn`` builds in each trainer (its model, optimizer state,
        other datasets), in bytes or as a size (``"300MiB"``). The run's memory plan counts it
        beside TensorFlow's runtime and the primary dataset's batches; without it the plan is
        a lower bound. Either way a run whose plan does not fit its hosts (alone, or beside
        the running jobs' reservations) is refused before any trainer starts.
    registry : Registry or str, optional
        Where ``context.save_model`` stores models (default: the configured registry).
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    RunResult
        ``value`` (what ``train_fn`` returned on the chief), ``history``, ``models``...

    Raises
    ------
    MemoryPlanError
        The run's memory plan does not fit its hosts, alone or beside the running jobs: no
        trainer was started (the message has the plan and its fixes).
    TrainerFailedError
        A trainer raised (its traceback is in the message), died, or its host left: every
        trainer is stopped.
    """
    name = _checked(train_fn, sync, name)
    client = current_client(client)
    setup = place_run(client, name, datasets, sync, use_gpus, batch_size, seed, memory)
    seed, named, workers, key = setup.seed, setup.named, setup.workers, setup.key
    timeout = float(settings.get("train.trainer-timeout", timeout))
    directory = checkpoint_dir(f"run-{name}", key)
    payload = pickle_by_value(train_fn)
    job_name = f"dvml.run {name!r}"
    with (
        holding([d.name for d in named.values()], job=job_name, client=client) as lease,
        holding_model(settings.state_dir(), f"run-{name}", key),
        reserved(client, setup.plan, job_name),  # beside the running jobs' reservations
    ):
        resumed = find_checkpoint(client, workers, directory, key) if resume else None
        job = _job(name, key, sync, seed, named, batch_size, setup.steps, directory, use_gpus,
                   config, resumed)  # fmt: skip
        job["sources"] = source_texts(train_fn)  # the trainers' tracebacks show the user's lines
        scalars = JobScalars(tensorboard_dir) if tensorboard_dir else None
        names = {w.address: w.name for w in workers}
        collector = _Reports(len(workers), name, on_report, progress, scalars, names)
        try:
            results = run_lockstep(
                client, workers, job, setup.per_worker, resumed[1] if resumed else None,
                collector, timeout, what="dvml.run", payload=payload,
            )  # fmt: skip
        finally:
            if scalars is not None:
                scalars.close()
        lease.check()  # a dataset dropped with force=True: fail, register nothing
        registered = _register(registry, results, setup.primary, name)
        log_models_saved(client, registered, f"dvml.run {name}")
        clear_checkpoints(client, workers, directory)
    value = None
    if results[0]["value"] is not None:
        import cloudpickle

        value = cloudpickle.loads(results[0]["value"])
    reports = [r for result in results for r in result["iterations"]]
    result = RunResult(
        name=name,
        value=value,
        history=_history(collector.records),
        reports=reports,
        models=[m for m, _ in registered],
        workers=[w.name for w in workers],
        resumed_from_step=resumed[0] - 1 if resumed else None,
        memory_plan=setup.plan,
        memory=memory_summary(setup.plan, collector.samples, float(settings.get("memory.margin"))),
    )
    if tracking_uri() is not None:  # the run in MLflow, when the user asked for it
        settings_used = {"sync": sync, "batch_size": batch_size, "seed": seed,
                         "use_gpus": use_gpus}  # fmt: skip
        _log_to_mlflow(result, settings_used, config, named, collector.records)
    return result


@dataclasses.dataclass(frozen=True)
class PlacedRun:
    """A run placed and planned: its datasets, trainers, batches, key and memory plan."""

    named: dict[str, Dataset]
    primary: Dataset
    workers: list[Any]
    per_worker: list[int]
    steps: int
    seed: int
    key: str
    plan: FitMemoryPlan


def place_run(
    client: Client,
    name: str,
    datasets: Any,
    sync: str,
    use_gpus: bool,
    batch_size: int,
    seed: int | None,
    memory: int | str | None,
    check: bool = True,
) -> PlacedRun:
    """Resolve the datasets, place the trainers and plan their memory; with ``check``, refuse
    a run whose plan does not fit its hosts (:class:`~dvml.exceptions.MemoryPlanError`)."""
    estimate = memory_estimate(memory)
    named = {k: resolve_dataset(v, client) for k, v in _named(datasets).items()}
    primary = next(iter(named.values()))
    workers = training_workers(client, primary, None, use_gpus)
    for key, ds in list(named.items())[1:]:
        check_colocated(ds, workers, f"Dataset {key!r}")
    per_worker, steps = batch_split(primary, workers, batch_size)
    seed = int(settings.get("preprocess.seed", seed))
    ids = {k: dataset_key(d) for k, d in named.items()}
    key = job_key("run", name, ids, [w.name for w in workers], batch_size, seed, sync)
    plan = run_memory_plan(client, workers, per_worker, primary.summary, estimate, use_gpus)
    if check:
        check_fit_fits(plan, name, batch_size, job=f"dvml.run {name!r}")
    return PlacedRun(named, primary, workers, per_worker, steps, seed, key, plan)


def _checked(train_fn: Any, sync: str, name: str | None) -> str:
    """``train_fn`` and ``sync`` checked; the run's name (default: the function's)."""
    if not callable(train_fn):
        raise ArgumentTypeError(
            f"train_fn must be a function taking the training context. Received: "
            f"{type(train_fn).__name__}. Write def train_fn(context): ... and pass it."
        )
    if sync not in SYNC_MODES:
        raise ArgumentError(
            f"sync must be one of {list(SYNC_MODES)}. Received: sync={sync!r}. 'step' gives "
            "train_fn a MultiWorkerMirroredStrategy; 'none' runs each trainer on its own."
        )
    if name is None:  # the function's name, as a valid dvml name ("_loop" -> "loop")
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", getattr(train_fn, "__name__", "")).lstrip("_.-")
        name = name[:128] or "run"
    check_name(name, "name")
    return name


def _log_to_mlflow(
    result: RunResult,
    settings_used: dict[str, Any],
    config: Mapping[str, Any] | None,
    named: dict[str, Dataset],
    records: list[dict[str, Any]],
) -> None:
    """The run, its settings and ``config`` as parameters, its reports as metrics."""
    params = {**settings_used, **{f"config.{k}": v for k, v in (config or {}).items()}}
    inputs = [_input(d, "training" if i == 0 else "validation")  # the first is the primary
              for i, d in enumerate(named.values())]  # fmt: skip
    summary = {"name": result.name, "workers": result.workers, "models": result.models,
               "resumed_from_step": result.resumed_from_step, "version": __version__}  # fmt: skip
    log_run(user_run(result.name, params, inputs, records, summary), "dvml.run")


def _input(dataset: Dataset, context: str) -> DatasetInput:
    """A dataset the run read, as MLflow's input (the dataset id before versions had digests)."""
    read = dataset_lineage(dataset.name, dataset.version, dataset.layout, dataset.versions)
    return dataset_input(dataset.name, dataset.version, read.get("content_digest"),
                         str(dataset.summary["dataset_id"]), context)  # fmt: skip


def _job(
    name: str,
    key: str,
    sync: str,
    seed: int,
    named: dict[str, Dataset],
    batch_size: int,
    steps: int,
    directory: str,
    use_gpus: bool,
    config: Mapping[str, Any] | None,
    resumed: tuple[int, bytes, list[dict[str, Any]]] | None,
) -> dict[str, Any]:
    """What every trainer of the run is told (the runtime adds each one's own part)."""

    return {
        "program": "user", "job_key": key, "name": name, "sync": sync, "seed": seed,
        "datasets": {k: d.name for k, d in named.items()}, "config": dict(config or {}),
        "global_batch_size": batch_size, "steps_per_epoch": steps,
        "checkpoint_dir": directory, "use_gpus": use_gpus,
        "resume": {"step": resumed[0] - 1, "history": resumed[2]} if resumed else None,
        **runtime_settings(),
    }  # fmt: skip


def _named(datasets: Any) -> dict[str, str | Dataset]:
    if isinstance(datasets, str | Dataset):
        return {"train": datasets}
    if isinstance(datasets, Mapping) and datasets:
        for k in datasets:
            check_name(k, "dataset key")
        return dict(datasets)
    raise ArgumentTypeError(
        "datasets must be a dataset name, a Dataset, or a non-empty dict {name: dataset}. "
        f"Received: {datasets!r:.120}. Pass datasets={{'train': 'digits', 'val': 'digits_val'}}."
    )


def _register(
    registry: Registry | str | None, results: list[dict[str, Any]], train: Dataset, run: str
) -> list[tuple[str, dict[str, Any]]]:
    """Store the models the chief saved (``context.save_model``), as fit stores its model;
    their names and summaries."""
    saved = results[0]["models"]
    if not saved:
        return []
    reg = open_registry(registry)
    at = now()
    for m in saved:
        weights = weights_from_bytes(m["weights"])
        arch_id = reg.add_architecture(m["model_json"], None, m["name"], m["description"])
        compile_params = parse_compile_params(m["compile_params"])
        summary = build_summary(
            training=train, validation=None, model=m["name"], arch_id=arch_id,
            compile_params=compile_params, fit_params={}, compile_text=m["compile_params"],
            fit_text="", num_iterations=len(results[0]["iterations"]),
            metrics_compute_frequency=1, name=run, description=m["description"], start=at,
            end=at, iterations=[], model_size_kb=weights_size_kb(weights),
            trainers=[r["worker"] for r in results], weights_identical=True,
            warm_start=False, version=__version__,
        )  # fmt: skip
        summary["trained_by"] = f"dvml.run {run}"
        reg.save_model(m["name"], arch_id, weights, summary, [], replace=True)
    return [(m["name"], reg.model_summary(m["name"])) for m in saved]


def _history(records: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(records, columns=["step", "elapsed_s", *_metric_names(records)])


def _metric_names(records: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for r in records:
        names += [k for k in r if k not in ("step", "elapsed_s") and k not in names]
    return names


class _Reports:
    """Collects the trainers' reports; one record per step once every trainer sent it."""

    def __init__(
        self,
        n_trainers: int,
        name: str,
        callback: Callable[[dict[str, Any]], None] | None,
        echo: bool,
        scalars: JobScalars | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.n, self.name, self.callback, self.echo = n_trainers, name, callback, echo
        self.scalars, self.names = scalars, dict(names or {})
        self.pending: dict[int, list[dict[str, Any]]] = {}
        self.records: list[dict[str, Any]] = []
        # (worker, resident bytes, zygote bytes) of the reports that carried a sample
        self.samples: list[tuple[str, int | None, int | None]] = []
        self.started = time.monotonic()

    def __call__(self, event: tuple[float, dict[str, Any]]) -> None:
        _, message = event
        if message.get("kind") != "report":
            return
        if message.get("resident_bytes") is not None:
            worker = str(message.get("worker"))
            self.samples.append((self.names.get(worker, worker), message["resident_bytes"],
                                 message.get("zygote_bytes")))  # fmt: skip
        bucket = self.pending.setdefault(int(message["step"]), [])
        bucket.append(message)
        if len(bucket) < self.n:
            return
        record: dict[str, Any] = {"step": int(message["step"]),
                                  "elapsed_s": max(m["elapsed"] for m in bucket)}  # fmt: skip
        for metric in bucket[0]["metrics"]:
            values = [m["metrics"][metric] for m in bucket if metric in m["metrics"]]
            record[metric] = sum(values) / len(values)
        self.records.append(record)
        if self.scalars is not None:
            # Dask's log_event sets "worker" to the address: the stream names the worker
            named = [{**m, "worker": self.names.get(str(m.get("worker")), m.get("worker"))}
                     for m in bucket]  # fmt: skip
            self.scalars.write(record["step"], report_scalars(record, named))
        if self.echo:
            shown = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in
                             ("step", "elapsed_s"))  # fmt: skip
            took = record["elapsed_s"]
            line = f"[dvml.run {self.name}] step {record['step']} {shown} ({took:.1f}s)"
            logger.info(line)
            print(line, flush=True)
        if self.callback is not None:
            self.callback(record)
