"""``dvml.fit_multiple``: train many configurations at once with Model Hopper Parallelism.

MADlib's ``madlib_keras_fit_multiple_model`` on dvml's pinned partitions, as a scheduler on
the trainer runtime (:class:`~dvml.train.runtime.hopper.ModelHopper`). The data stays in
each worker's vineyardd; the MODELS move. Every worker that holds training partitions runs
one long-lived serving trainer (TensorFlow imported once per worker and job, one plain Keras
model per configuration, no distribution strategy). An iteration is ``W`` rounds over the
``W`` workers (:func:`dvml.train.hop_schedule.hop_schedule`): in round ``r`` model ``m`` trains
its ``epochs`` on worker ``(m + r) mod W``'s local rows, then its weights AND optimizer
variables go to the next worker. This module only decides that schedule; its
:class:`~dvml.train.hop_job.HopJob` (shared with the searches) sets up the trainers, reads the
checkpoints back and builds MADlib's tables (:mod:`dvml.train.hop_tables`), and the runtime
moves the states, checkpoints them and watches the trainers. A worker that leaves the cluster
stops the job (the searches go on without it), unless ``elastic=True``: then its rows are
re-pinned onto the remaining workers and the job goes on there
(:mod:`dvml.train.hop_repin`).

After each iteration every model's state (weights and optimizer variables) is checkpointed on
the worker that holds it, with that iteration's records; a rerun of the same call resumes EACH
model from its own last checkpoint (the models do not wait for each other, so they may resume
from different iterations) and trains it on the workers an uninterrupted run would have.
The models and MADlib's info and summary tables are registered at the end, in one
transaction.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import pandas as pd

from dvml import config
from dvml.cluster.workers import current_client
from dvml.configs import ModelConfig, params_text
from dvml.exceptions import ArgumentError, RegistryError, TrainerFailedError
from dvml.names import check_suffixed_name
from dvml.registry.database import Registry, open_registry
from dvml.store.datasets import Dataset
from dvml.store.leases import holding
from dvml.tracking.mlflow_client import log_run, tracking_uri
from dvml.tracking.model_events import log_models_saved
from dvml.tracking.runs import selection_run
from dvml.train.departures import departure_fields, describe_repin
from dvml.train.elastic import elastic_key, rows_key
from dvml.train.hop_job import HopJob
from dvml.train.hop_loop import Evaluations, first_workers, run_iterations
from dvml.train.hop_repin import go_on_without, rows_per_epoch, workers_to_leave
from dvml.train.hop_schedule import model_histories, resumed_from
from dvml.train.hop_tables import Trained, build_tables, model_name
from dvml.train.hop_tables import run_summary as hop_run_summary
from dvml.train.memory_use import memory_summary
from dvml.train.model import Model
from dvml.train.model_lock import holding_output
from dvml.train.model_selection import checked_configs
from dvml.train.outputs import check_outputs_free, existing_outputs, model_exists
from dvml.train.runtime.checkpoints import resume_points
from dvml.train.runtime.hopper import ModelHopper
from dvml.train.runtime.model_state import state_bytes
from dvml.train.runtime.plan import Job, JobArgs, dataset_key, job_key, model_spec, now, place_job
from dvml.train.runtime.watcher import describe_departure
from dvml.train.stragglers import hop_timings
from dvml.train.stragglers import run_summary as straggler_summary

if TYPE_CHECKING:
    from distributed import Client

    from dvml.placement.fit_memory import FitMemoryPlan

__all__ = ["ModelSelection", "fit_multiple", "model_name"]

logger = logging.getLogger("dvml.train")


class ModelSelection:
    """The result of :func:`fit_multiple`: MADlib's info and summary tables and the models.

    Parameters
    ----------
    name : str
        The run's ``model_output``.
    registry : Registry
        The registry that holds it.
    """

    def __init__(self, name: str, registry: Registry) -> None:
        self.name, self.registry = name, registry

    @property
    def info(self) -> pd.DataFrame:
        """MADlib's ``<model_output>_info``: one row per configuration, by mst_key."""
        return pd.DataFrame(self.registry.model_selection_run(self.name)["info"])

    @property
    def summary(self) -> dict[str, Any]:
        """MADlib's ``<model_output>_summary`` (and dvml's own fields)."""
        return dict(self.registry.model_selection_run(self.name)["summary"])

    @property
    def mst_keys(self) -> list[int]:
        """The configurations' keys, in :attr:`info`'s order."""
        return [int(k) for k in self.info["mst_key"]]

    def model(self, mst_key: int) -> Model:
        """The registered model of one configuration (evaluate, predict, warm start by name).

        Parameters
        ----------
        mst_key : int
            The configuration's key.

        Returns
        -------
        Model
            Its model, ``f"{model_output}_{mst_key}"``.
        """
        if int(mst_key) not in self.mst_keys:
            raise ArgumentError(
                f"No configuration with mst_key={mst_key!r} in {self.name!r}. Received: "
                f"mst_key={mst_key!r}; this run has {self.mst_keys}."
            )
        return Model(model_name(self.name, mst_key), self.registry)

    def best(self, by: str = "validation_metrics_final", maximize: bool = True) -> Model:
        """The model whose ``by`` column of :attr:`info` is the highest (or lowest).

        Parameters
        ----------
        by : str
            A column of :attr:`info`.
        maximize : bool
            Take the highest value; False: the lowest (for a loss).

        Returns
        -------
        Model
            The best configuration's model.
        """
        info = self.info
        if by not in info or info[by].isna().all():
            raise ArgumentError(
                f"Cannot rank the models by {by!r}: the info table has no values in it. "
                f"Received: by={by!r}. Columns: {list(info.columns)}; pass a validation_set "
                "to rank by validation figures."
            )
        row = info.loc[info[by].idxmax() if maximize else info[by].idxmin()]
        return self.model(int(row["mst_key"]))

    def __repr__(self) -> str:
        return f"<dvml.ModelSelection {self.name!r} configurations={len(self.mst_keys)}>"


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything fit_multiple decided before any trainer starts."""

    job: Job  # the common arguments, datasets, trainers, seed and timeout
    model_output: str
    configs: list[ModelConfig]  # checked once, sorted by mst_key
    parsed: dict[int, dict[str, Any]]  # mst_key -> compile/fit params parsed, arch JSON
    initial: dict[int, bytes]  # mst_key -> starting state (weights, no optimizer state)
    key: str


def fit_multiple(
    training_set: str | Dataset,
    model_output: str,
    configs: Any,
    num_iterations: int,
    use_gpus: bool = False,
    validation_set: str | Dataset | None = None,
    metrics_compute_frequency: int | None = None,
    warm_start: bool = False,
    name: str | None = None,
    description: str | None = None,
    *,
    custom_objects: list[str] | None = None,
    resume: bool = True,
    seed: int | None = None,
    timeout: float | None = None,
    augment: Any = None,
    progress: bool = True,
    overwrite: bool = False,
    use_caching: bool | None = None,
    elastic: bool = False,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> ModelSelection:
    """Train every configuration of ``configs`` with Model Hopper Parallelism (MOP).

    MADlib's ``madlib_keras_fit_multiple_model``. Each worker that holds partitions of
    ``training_set`` runs one trainer for the whole job; in each iteration every model trains
    one sub-epoch (its ``epochs``) on every worker's LOCAL partition in turn, with its
    weights and optimizer state moving from worker to worker between sub-epochs (Cerebro's
    round-robin: model ``m`` on worker ``(m + round) mod W``). No gradients and no data cross
    the network, only model states, once per hop. With at least as many configurations as
    workers every worker is busy in every round; with fewer, ``W - M`` workers sit idle in
    each round (MADlib's rule: use at least as many configurations as segments).

    Parameters
    ----------
    training_set : str or Dataset
        Built by :func:`dvml.training_preprocessor`.
    model_output : str
        Name of the run. Configuration ``k``'s model is registered as
        ``f"{model_output}_{k}"`` (:func:`model_name`); MADlib's ``<model_output>_info`` and
        ``<model_output>_summary`` are stored under ``model_output``.
    configs : str, pandas.DataFrame or list of dict
        The name of a stored model selection table, or the table itself
        (:func:`dvml.model_configs`): ``mst_key``, ``model_id``
        (an architecture id), ``compile_params`` and ``fit_params`` (MADlib strings, parsed
        safely). ``batch_size`` is the batch of the single trainer that holds the model.
    num_iterations : int
        Iterations; in each, every model visits every partition once.
    use_gpus : bool
        Train on the workers' GPUs (refused when one has none).
    validation_set : str or Dataset, optional
        Built by :func:`dvml.validation_preprocessor` for this training set.
    metrics_compute_frequency : int, optional
        Compute training/validation metrics every this many iterations (and at the end).
    warm_start : bool
        Start configuration ``k`` from the registered model ``f"{model_output}_{k}"``.
    name, description : str, optional
        Free text stored in the summary.
    custom_objects : list of str, optional
        Custom losses/metrics registered with :func:`dvml.registry.register_custom_function`.
    resume : bool
        Resume from the checkpoints of an interrupted run of the same call.
    seed : int, optional
        Seeds the models' initial weights and the shuffles (config ``dvml.preprocess.seed``).
    timeout : float, optional
        Seconds one hop may take before its trainer is stopped (config
        ``dvml.train.trainer-timeout``).
    augment : tf-keras layer or function, optional
        Per-epoch augmentation of every model's training batches in the trainers, as in
        :func:`dvml.fit`.
    progress : bool
        Log one line per iteration.
    overwrite : bool
        Replace the run ``model_output`` and its models when they exist. By default they are
        refused, as MADlib refuses an output table that exists, unless ``warm_start``.
    use_caching : bool, optional
        MADlib's option to keep the training data in memory between iterations; accepted
        and ignored, since dvml always trains from the data kept in the workers' memory.
    elastic : bool
        Go on without a worker that leaves the cluster (its process or host gone), or
        whose trainer died while the worker stays (killed, out of memory): its
        buffers of the training and validation sets are copied from its vineyardd (which
        still runs when only the Dask worker process died) onto the remaining workers, the
        job's trainers restart there on the new layout, and each model resumes from its own
        last checkpoint kept there (else from its starting state), so it again trains every
        row once per iteration. When the vineyardd is gone too, the rows are left out and
        counted. The summary's ``departed``, ``departed_at_iterations``, ``repinned_rows``,
        ``repin_seconds``, ``rows_left_out``, ``rows_left_out_from_iteration`` and
        ``departures`` say what happened; each model's ``rows_per_epoch`` (``.info``) the
        rows it trained per epoch in each iteration. Default False: a departure stops the
        job and a rerun resumes (every model visits every partition in every iteration,
        MADlib's rule).
    registry : Registry or str, optional
        The model registry or its URL (default: config ``dvml.registry.url``).
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    ModelSelection
        ``.info`` (a DataFrame, one row per configuration), ``.summary``, ``.model(mst_key)``
        and ``.best()``.

    Raises
    ------
    TrainerFailedError
        A trainer or a worker failed during a hop, or a worker left the cluster (without
        ``elastic``, or when none is left): every trainer is stopped and nothing is
        registered; run the same call again to resume.
    FitRunningError
        Another ``fit_multiple`` or ``automl`` of ``model_output`` is running (in this or
        another process of this state directory); nothing was started.
    """
    del use_caching  # dvml always keeps the data in memory (MADlib's use_caching=TRUE)
    reg = open_registry(registry)
    if not (warm_start or overwrite):
        found = existing_outputs(reg, model_output, selection=False)
        check_outputs_free(reg, "dvml.fit_multiple", model_output, found,
                           "warm_start=True to train them on")  # fmt: skip
    client = current_client(client)
    # The datasets it reads are leased for the whole run: a drop or overwrite is refused.
    with holding(
        [training_set, validation_set], job=f"dvml.fit_multiple {model_output!r}", client=client
    ) as lease:
        args = JobArgs(
            model_output, training_set, validation_set, num_iterations, metrics_compute_frequency,
            use_gpus, warm_start, custom_objects, seed, timeout, augment,
        )  # fmt: skip
        plan = prepare(reg, client, args, configs, elastic)
        # One run per model_output at a time (with automl's): a second would share this one's
        # checkpoints. Held until the models are saved; refused with the running job's name.
        with holding_output(config.state_dir(), model_output,
                            f"dvml.fit_multiple {plan.key}", "dvml.fit_multiple"):  # fmt: skip
            start = now()
            started = time.time()
            hop = _hop_job(client, plan, started)
            with hop.hopper as hopper:
                if not resume:  # an earlier run's checkpoints must not seed a restart
                    hopper.clear_checkpoints()
                run = _run_elastic(hop, plan, resume, progress, elastic)
                weights = hop.final_weights()  # a departure now stops the job
            end = now()
            lease.check()  # a dataset dropped with force=True: fail, register nothing
            registered = _register(reg, run.plan, run.history, run.records, run.evals, weights,
                                   start, end, run.points, name, description, started,
                                   hop.memory, run.departures)  # fmt: skip
            log_models_saved(client, registered, f"dvml.fit_multiple {model_output}")
            hopper.clear_checkpoints()
    selection = ModelSelection(model_output, reg)
    track_selection("fit_multiple", selection)
    return selection


def prepare(
    reg: Registry, client: Client, args: JobArgs, configs: Any, elastic: bool = False
) -> _Plan:
    """Check every argument and configuration up front (no trainer starts before this): the
    placed job and each configuration parsed (``.job``, ``.parsed``), what ``dvml.plan``
    plans from; its key by :func:`selection_key`."""
    # A stored table's name, or rows given here: checked once, against the registry too.
    checked, attrs = checked_configs(configs, reg, args.custom_objects)
    custom = args.custom_objects or list(attrs.get("custom_objects") or [])
    args = dataclasses.replace(args, custom_objects=custom)
    check_suffixed_name(args.output, [f"_{c.mst_key}" for c in checked], "model_output")
    job = place_job(reg, client, args)
    parsed: dict[int, dict[str, Any]] = {}
    initial: dict[int, bytes] = {}
    for c in checked:
        k = c.mst_key
        # MADlib trains an mst_key the earlier run did not have from scratch.
        warm = args.warm_start and model_exists(reg, model_name(args.output, k))
        warm_from = model_name(args.output, k) if warm else None
        spec = model_spec(
            reg, c.model_id, c.compile_params, c.fit_params, job.train, custom, warm_from
        )
        parsed[k] = spec.config()
        initial[k] = state_bytes(list(spec.weights) if spec.weights is not None else [])
    models = [(c.mst_key, c.model_id, parsed[c.mst_key]) for c in checked]
    key = selection_key(job, models, elastic)
    return _Plan(
        job=job,
        model_output=args.output,
        configs=checked,
        parsed=parsed,
        initial=initial,
        key=key,
    )


def selection_key(job: Job, models: list[Any], elastic: bool) -> str:
    """A ``fit_multiple``'s key: what a rerun resumes its models' checkpoints by. Pure.

    A fixed job's names its data by version and its workers. An elastic job's names its data
    by content (:func:`dvml.train.elastic.rows_key`, which a re-pin keeps) and leaves the
    workers out, so a rerun after a re-pin (the datasets' next versions, fewer workers) still
    resumes each model from its own last checkpoint; ``models`` are the configurations'
    ``(mst_key, model_id, parsed)``.
    """
    args = job.args
    if elastic:
        parts = [args.output, rows_key(job.train), rows_key(job.valid), models,
                 args.num_iterations, job.frequency, job.seed, args.warm_start]  # fmt: skip
        return job_key("fit_multiple", *elastic_key(parts), *job.augment_key)
    return job_key("fit_multiple", args.output, dataset_key(job.train), dataset_key(job.valid),
                   models, args.num_iterations, job.frequency, job.seed, args.warm_start,
                   [w.name for w in job.workers], *job.augment_key)  # fmt: skip


def _hop_job(client: Client, plan: _Plan, started: float) -> HopJob:
    """The model-hopper job: the runtime's serving trainers (one per worker holding data).

    A worker that departs stops the job unless ``elastic`` (:class:`HopJob`'s documented
    choice for ``fit_multiple``); the same call run again resumes from the models'
    checkpoints.
    """
    return HopJob(client, plan.job, plan.model_output, kind="mop", key=plan.key,
                  started_at=started, configs=list(plan.parsed.values()))  # fmt: skip


def _resume(
    hop: HopJob, plan: _Plan, resume: bool
) -> tuple[dict[int, int], dict[int, Any], list[dict[str, Any]]]:
    """Each model's resume point (0: afresh), its starting state (future or bytes), and the
    history up to its resume point.

    Each model resumes from its OWN last checkpoint (:func:`resume_points`: its last iteration
    whose state is kept and whose records, and those of every iteration before it, are kept).
    The models do not wait for each other (checkpoints come in bursts, one model can be two
    iterations ahead of another), and a checkpoint keeps only a model's last two states: a
    rule that needed one iteration every model still has a state of could find none, and
    start every model over.
    """
    keys = [c.mst_key for c in plan.configs]
    points = dict.fromkeys(keys, 0)
    if not resume:
        return points, dict(plan.initial), []
    found = hop.checkpoints()
    points = resume_points({k: found.iterations(k) for k in keys}, found.has_state)
    if any(points.values()):
        logger.warning("resuming %s: models from iterations %s", plan.model_output, points)
    states = {
        k: hop.hopper.load(k, points[k], found.holders[k][points[k]])
        if points[k]
        else plan.initial[k]
        for k in keys
    }
    kept = [h for (k, i), h in sorted(found.records.items()) if k in points and i <= points[k]]
    return points, states, kept


@dataclasses.dataclass
class _Run:
    """What the MOP loop trained: the plan it ended on (its remaining workers), each model's
    resume point, the history before them, the hops' records and evaluations, and one
    record per departure (:func:`dvml.train.hop_repin.go_on_without`'s, with
    ``at_iteration``: the first iteration trained without the departed workers)."""

    plan: _Plan
    points: dict[int, int]
    history: list[dict[str, Any]]
    records: list[dict[str, Any]]
    evals: Evaluations
    departures: list[dict[str, Any]]


def _run_elastic(hop: HopJob, plan: _Plan, resume: bool, progress: bool, elastic: bool) -> _Run:
    """Resume, then run the MOP loop; with ``elastic``, a departed worker (or one whose
    trainer died: :func:`~dvml.train.hop_repin.workers_to_leave`) is left out, its rows
    re-pinned onto the remaining workers whose trainers restart on the new layout
    (:func:`~dvml.train.hop_repin.go_on_without`), and the loop runs again on them, each
    model from its own last checkpoint kept there (the rerun rule, :func:`_resume`)."""
    departures: list[dict[str, Any]] = []
    points, states, history = _resume(hop, plan, resume)
    while True:
        try:
            records, evals = _run(hop.hopper, plan, points, states, progress)
            return _Run(plan, points, history, records, evals, departures)
        except TrainerFailedError:
            gone, why = workers_to_leave(hop) if elastic else ([], "")
            if not gone:
                raise
        remaining = [w for w in hop.hopper.workers if w not in gone]
        rerun = "Bring the workers back and run the same call again."
        hop.lose(gone, remaining, rerun)
        hop.hopper.forget(list(hop.hopper.states))  # mid-iteration states: from checkpoints
        departure = go_on_without(hop, gone, remaining, rerun)
        plan = dataclasses.replace(plan, job=dataclasses.replace(plan.job, workers=remaining))
        points, states, history = _resume(hop, plan, True)
        first = departure["at_iteration"] = min(points.values()) + 1
        departures.append(departure)
        line = (f"[dvml.fit_multiple {plan.model_output}] {why or describe_departure(gone)}: "
                f"going on without it from iteration {first} (elastic=True): "
                f"{describe_repin(departure)}")  # fmt: skip
        logger.warning(line)
        if progress:
            print(line, flush=True)


def _run(
    hopper: ModelHopper,
    plan: _Plan,
    points: dict[int, int],
    states: dict[int, Any],
    progress: bool,
) -> tuple[list[dict[str, Any]], Evaluations]:
    """Add every model on the worker of its first hop (a resumed one: where its checkpoint
    is), run every remaining iteration of each model from its own resume point (the shared
    MOP loop), and return the hops' records and the evaluations."""
    keys = [c.mst_key for c in plan.configs]
    for k, worker in first_workers(keys, plan.job.workers).items():
        hopper.add(k, plan.parsed[k], states[k], worker)
    return run_iterations(
        hopper,
        keys,
        range(min(points.values()) + 1, plan.job.args.num_iterations + 1),
        plan.job.frequency,
        label=f"dvml.fit_multiple {plan.model_output}" if progress else None,
        starts={k: points[k] + 1 for k in keys},
    )


def _register(
    reg: Registry,
    plan: _Plan,
    history: list[dict[str, Any]],
    records: list[dict[str, Any]],
    evals: dict[tuple[int, int], list[dict[str, Any]]],
    weights: dict[int, bytes],
    start: str,
    end: str,
    points: dict[int, int],
    name: str | None,
    description: str | None,
    started: float,
    memory: FitMemoryPlan | None,
    departures: list[dict[str, Any]],
) -> list[tuple[str, dict[str, Any]]]:
    """Build every model's summary and the info/summary tables; register all in one go.
    Returns each model's name and summary."""
    keys = [c.mst_key for c in plan.configs]
    times = {"start": start, "end": end, "name": name, "description": description}
    per_model = model_histories(keys, history, records, evals)
    # the rows each model trained per epoch, by iteration (MADlib's rule: all of them)
    rows = {k: rows_per_epoch(per_model[k]) for k in keys}
    trained = [
        Trained(
            c.mst_key, c.model_id, plan.parsed[c.mst_key], plan.job.args.num_iterations,
            summary={"resumed_from_iteration": points[c.mst_key] or None,
                     "rows_per_epoch": rows[c.mst_key]},
            info={"rows_per_epoch": rows[c.mst_key]},
            texts=(params_text(c.compile_params, plan.parsed[c.mst_key]["compile_params"]),
                   params_text(c.fit_params, plan.parsed[c.mst_key]["fit_params"])),
            warm_start=plan.job.args.warm_start,
        )
        for c in plan.configs
    ]  # fmt: skip
    tables = build_tables(plan.job, plan.model_output, trained, per_model, weights, times)
    names = {k: model_name(plan.model_output, k) for k in keys}
    run_summary = _run_summary(plan, records, names, tables.summaries[keys[0]]["metrics_iters"],
                               times, resumed_from(points), started)  # fmt: skip
    run_summary["resumed_from_iterations"] = [points[k] for k in keys]
    run_summary.update(departure_fields(departures))  # elastic=True: went on without them
    # each trainer's and host's planned resident bytes and their peaks at the hops' ends
    samples = ((r["worker"], r.get("resident_bytes"), r.get("zygote_bytes")) for r in records)
    run_summary.update(memory_summary(memory, samples, float(config.get("memory.margin"))))
    run_summary.update(straggler_summary(hop_timings(records)))  # the worker that held it back
    try:
        reg.save_model_selection_run(plan.model_output, tables.models, tables.info, run_summary)
    except RegistryError as exc:  # a full disk, a lock: the training itself is not lost
        raise RegistryError(
            f"{exc} Every model's checkpoint is kept on the workers: once the registry can be "
            "written, run the same fit_multiple again and it resumes from its last iteration."
        ) from exc
    return [(names[k], tables.summaries[k]) for k in keys]


def _run_summary(
    plan: _Plan,
    hops: list[dict[str, Any]],
    names: dict[int, str],
    metrics_iters: Any,
    times: dict[str, Any],
    resumed: int | None,
    started: float,
) -> dict[str, Any]:
    """MADlib's ``<model_output>_summary`` row, and dvml's own fields about the hops."""
    return {
        **hop_run_summary(plan.job, times, plan.job.frequency),
        "model": plan.model_output,
        "model_info": f"{plan.model_output}_info",
        "model_selection_table": "model_configs",
        "num_iterations": plan.job.args.num_iterations,
        "warm_start": plan.job.args.warm_start,
        "start_training_time": times["start"],
        "end_training_time": times["end"],
        "metrics_iters": metrics_iters,
        # dvml's own fields
        "mst_keys": [c.mst_key for c in plan.configs],
        "model_names": [names[c.mst_key] for c in plan.configs],
        "rounds_per_iteration": len(plan.job.workers),
        "hops": len(hops),
        "hop_workers": sorted({(r["mst_key"], r["iteration"], r["worker"]) for r in hops}),
        "training_seconds": sum(r["train_s"] for r in hops),
        "moving_seconds": sum(r["moving_s"] for r in hops),
        "transfer_seconds": sum(r["transfer_s"] for r in hops),
        "moved_bytes": sum(r["bytes"] for r in hops),
        "wall_seconds": time.time() - started,
        "resumed_from_iteration": resumed,
    }


def track_selection(kind: str, selection: ModelSelection) -> None:
    """Log a finished fit_multiple or automl run to MLflow, when the user asked for it."""
    if tracking_uri() is None:
        return
    import json

    rows = json.loads(selection.info.to_json(orient="records"))  # plain values, NaN as None
    log_run(selection_run(kind, selection.name, selection.summary, rows), f"dvml.{kind}")
