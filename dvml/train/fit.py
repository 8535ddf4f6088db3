"""``dvml.fit``: MultiWorkerMirroredStrategy training on the workers that hold the data."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml._version import __version__
from dvml.cluster.workers import current_client
from dvml.configs import params_text
from dvml.exceptions import ArgumentTypeError, RegistryError, TrainingError
from dvml.placement.fit_memory import FitMemoryPlan
from dvml.registry.database import Registry, open_registry
from dvml.registry.weights import weights_from_bytes, weights_to_bytes
from dvml.store.datasets import Dataset
from dvml.store.leases import holding
from dvml.tracking.mlflow_client import log_run, tracking_uri
from dvml.tracking.model_events import log_models_saved
from dvml.tracking.runs import fit_run
from dvml.train.elastic import (
    ElasticJob,
    ElasticRun,
    elastic_summary,
    find_elastic_checkpoint,
    fit_key,
    run_elastic,
)
from dvml.train.fit_admission import admitted
from dvml.train.fit_progress import FitProgress
from dvml.train.job_scalars import JobScalars
from dvml.train.memory_use import memory_summary
from dvml.train.model import Model
from dvml.train.model_lock import holding_model
from dvml.train.outputs import check_outputs_free, model_exists
from dvml.train.runtime.augment import describe as describe_augment
from dvml.train.runtime.lockstep import clear_checkpoints, find_checkpoint, run_lockstep
from dvml.train.runtime.plan import (
    Job,
    JobArgs,
    batch_split,
    checkpoint_dir,
    model_spec,
    now,
    place_job,
    runtime_settings,
    trainer_steps,
)
from dvml.train.stragglers import (
    by_iteration,
    run_summary,
)
from dvml.train.summary import build_summary, iteration_record, weights_size_kb
from dvml.train.sync import check_sync, choose_sync
from dvml.train.trainer_memory import fit_memory_plan

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["fit"]

logger = logging.getLogger("dvml.train")


def fit(
    training_set: str | Dataset,
    model: str,
    arch_id: int,
    compile_params: str | dict[str, Any],
    fit_params: str | dict[str, Any] | None = None,
    num_iterations: int = 1,
    use_gpus: bool = False,
    validation_set: str | Dataset | None = None,
    metrics_compute_frequency: int | None = None,
    warm_start: bool = False,
    name: str | None = None,
    description: str | None = None,
    custom_objects: list[str] | None = None,
    *,
    tensorboard_dir: str | None = None,
    augment: Any = None,
    sync: str | int | None = None,
    elastic: bool = False,
    resume: bool = True,
    seed: int | None = None,
    timeout: float | None = None,
    overwrite: bool = False,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> Model:
    """Train ``arch_id`` on ``training_set`` with one trainer per worker that holds data.

    Parameters
    ----------
    training_set : str or Dataset
        A dataset (or feature cache) built by :func:`dvml.training_preprocessor`.
    model : str
        Name of the output model in the registry. A model of that name is refused (MADlib's
        "output table already exists") unless ``warm_start`` or ``overwrite`` is given.
    arch_id : int
        Architecture id from :func:`dvml.load_keras_model`. Its stored weights, if any, are
        the starting point (transfer learning; layers saved with ``trainable=False`` stay
        frozen).
    compile_params, fit_params : str or dict
        MADlib-style strings (``"loss='categorical_crossentropy', optimizer='adam',
        metrics=['accuracy']"``) or dicts, parsed safely; the loss, metrics and optimizer may
        be tf-keras classes with literal arguments (``loss=CategoricalCrossentropy(
        label_smoothing=0.1)``), checked here before any trainer starts, as are loss and
        metric names (tf-keras' own or ``custom_objects``). ``batch_size`` is the GLOBAL batch,
        split as evenly as possible over the trainers (any ``batch_size`` >= the number of
        trainers; some trainers take one row more per batch when it does not divide evenly,
        with a warning); ``epochs`` are run per iteration.
    num_iterations : int
        Iterations; each runs ``fit_params`` on every trainer in lock-step.
    use_gpus : bool
        Train on the trainers' GPUs (refused when one has none); False hides GPUs.
    validation_set : str or Dataset, optional
        Built by :func:`dvml.validation_preprocessor` for this training set.
    metrics_compute_frequency : int, optional
        Compute training/validation metrics every this many iterations (and at the end).
        Default: only at the end.
    warm_start : bool
        Start from the weights of the existing model named ``model``.
    name, description : str, optional
        Free text stored in the summary.
    custom_objects : list of str, optional
        Names of custom losses/metrics registered with
        :func:`dvml.registry.register_custom_function`.
    tensorboard_dir : str, optional
        Write TensorBoard logs there (one sub-directory per trainer).
    augment : tf-keras layer or function, optional
        Per-epoch data augmentation of the TRAINING batches, in the trainers' input pipeline
        (validation and metrics read the rows as stored): a tf-keras layer or model (shipped as
        its config, called with ``training=True``), e.g. ``tf_keras.Sequential([
        tf_keras.layers.RandomFlip("horizontal"), tf_keras.layers.RandomRotation(0.1)])``, or a
        function of one batch of inputs made of TensorFlow ops (shipped as code). It sees the
        inputs as the model does: float32, normalised.
    sync : {"step", "iteration"} or int, optional
        How the trainers synchronise. ``"step"``: MultiWorkerMirroredStrategy all-reduces the
        gradients at every step. ``"iteration"``: MADlib's model averaging; each trainer fits
        its local rows with its own optimizer for the iteration's epochs, then all weights
        are averaged, weighted by the trainers' row counts. An int ``k``: average every ``k``
        steps (local SGD). Default (config ``dvml.train.sync``, null = automatic): ``"step"``
        when ``use_gpus=True`` and every trainer has a GPU, else ``"iteration"``.
    elastic : bool
        Go on without a worker that leaves during the fit (its process or host dies), in any
        sync mode: its buffers are copied from its vineyardd (still running when only the
        worker process died) onto the other trainers, which resume from the last iteration
        they all checkpointed and train every row once per epoch to ``num_iterations``
        (:mod:`dvml.train.elastic`). Rows whose vineyardd is gone too are left out and counted.
        The summary says what happened: ``departed``, ``departed_at_iterations``,
        ``repinned_rows``, ``repin_seconds``, ``rows_left_out``, ``rows_per_epoch``,
        ``departures``. Workers that join are trained on from the next iteration, and rows
        move off a straggler when it pays (``sync="iteration"``/``k``; config
        ``dvml.train.elastic-balance``): :mod:`dvml.train.row_map_change`, ``joined``,
        ``rebalanced_at_iterations``, ``moved_rows``. A trainer that fails while no worker
        left (killed, a collective broken) is gone on from too, from the last checkpoint
        with the same workers, up to ``dvml.train.elastic-max-failures`` times (2):
        ``trainer_failures``. Default False: the fit fails naming the worker, and the same
        call resumes from its last iteration.
    resume : bool
        Resume from the checkpoint of an interrupted run of the same job, if there is one.
    seed : int, optional
        The shuffles' seed (config ``dvml.preprocess.seed``): the same seed, data and
        arguments give the same batches in the same order.
    timeout : float, optional
        Seconds before the trainers are stopped (config ``dvml.train.trainer-timeout``).
    overwrite : bool
        Replace a model named ``model`` that exists (refused by default, as in MADlib).
    on_iteration : callable, optional
        Called on the client with each iteration's aggregated record while training runs.
    progress : bool
        Log one line per iteration (logger ``dvml.train``, and printed).
    registry : Registry or str, optional
        Where the architecture is read and the model registered (default: the configured
        registry, ``dvml.registry.url``).
    client : distributed.Client, optional
        The cluster's client (default: the current one).

    Returns
    -------
    dvml.Model
        The registered model: ``.summary`` has every field of MADlib's fit summary.
    """
    requested_sync = check_sync(config.get("train.sync", check_sync(sync)))
    if not isinstance(elastic, bool):
        raise ArgumentTypeError(f"elastic must be True or False. Received: elastic={elastic!r}.")
    reg = open_registry(registry)
    if not (warm_start or overwrite) and model_exists(reg, model):
        check_outputs_free(reg, "dvml.fit", model,
                           [f"the model {model!r} (dvml.drop_model({model!r}))"],
                           "warm_start=True to train it on")  # fmt: skip
    client = current_client(client)
    # The datasets it reads are leased for the whole fit: a drop or overwrite is refused.
    with holding(
        [training_set, validation_set], job=f"dvml.fit of model {model!r}", client=client
    ) as lease:
        args = JobArgs(
            model, training_set, validation_set, num_iterations, metrics_compute_frequency,
            use_gpus, warm_start, custom_objects, seed, timeout, augment,
        )  # fmt: skip
        plan = _plan(
            reg, client, args, arch_id=arch_id, compile_params=compile_params,
            fit_params=fit_params, tensorboard_dir=tensorboard_dir, sync=requested_sync,
            elastic=elastic,
        )  # fmt: skip
        # Refused before any trainer starts when the trainers do not fit their hosts, alone or
        # beside the running jobs (whose memory reservations it then shares). One fit per model
        # at a time: a second one would share (and resume from) this one's checkpoints. Both
        # held until the model is saved; refused with the running job's name.
        lock = holding_model(config.state_dir(), model, plan.key)
        with admitted(client, plan.memory, model, int(plan.fit_params["batch_size"])), lock:
            _train(client, reg, plan, resume, (on_iteration, progress), (name, description), lease)
    trained = Model(model, reg)
    log_models_saved(client, [(model, trained.summary)], "dvml.fit")
    if tracking_uri() is not None:  # the run in MLflow, when the user asked for it
        log_run(fit_run(trained.summary), "dvml.fit")
    return trained


def _train(
    client: Client,
    reg: Registry,
    plan: _Plan,
    resume: bool,
    reporting: tuple[Callable[[dict[str, Any]], None] | None, bool],
    text: tuple[str | None, str | None],
    lease: Any,
) -> None:
    """Resume, run the trainers (elastic or not), register the model, clear the checkpoints."""
    start_iteration, weights_blob, history = _resume(client, plan, resume)
    scalars = JobScalars(plan.tensorboard_dir) if plan.tensorboard_dir else None
    collector = FitProgress(
        {w.address: w.name for w in plan.job.workers}, plan.model, plan.job.args.num_iterations,
        reporting[0], reporting[1], scalars, _planned(plan),
    )  # fmt: skip
    start = now()
    try:
        run = _run(client, plan, start_iteration, weights_blob, history, collector)
    finally:
        if scalars is not None:
            scalars.close()
    end = now()
    iterations = _aggregate(run.history, run.results)
    summary = _summary(plan, run.results, iterations, start, end, start_iteration, *text)
    if plan.elastic:
        summary.update(elastic_summary(run))
    lease.check()  # a dataset dropped with force=True: fail, register nothing
    _save(reg, plan, run.results, summary, iterations)
    clear_checkpoints(client, run.workers, plan.checkpoint_dir)


def _run(
    client: Client,
    plan: _Plan,
    start_iteration: int,
    weights_blob: bytes | None,
    history: list[dict[str, Any]],
    collector: FitProgress,
) -> ElasticRun:
    """The trainers' run: one lock-step run, or an elastic one (dvml.train.elastic)."""
    if not plan.elastic:
        results = run_lockstep(
            client, plan.job.workers, _job(plan, start_iteration, history),
            plan.per_worker_batch, weights_blob, collector, plan.job.timeout,
            per_worker_steps=plan.trainer_steps,
        )  # fmt: skip
        return ElasticRun(results, history, plan.job.workers, [], {})
    job = ElasticJob(
        workers=plan.job.workers,
        job=lambda start, hist: _job(plan, start, hist),
        per_worker_batch=plan.per_worker_batch,
        steps_per_epoch=plan.steps_per_epoch,
        trainer_steps=plan.trainer_steps,
        global_batch=int(plan.fit_params["batch_size"]),
        timeout=plan.job.timeout,
        training=plan.job.train.name,
        validation=plan.job.valid.name if plan.job.valid else None,
        checkpoint_dir=plan.checkpoint_dir,
        key=plan.key,
        sync=plan.sync,
        last_iteration=plan.job.args.num_iterations,
        balance=bool(config.get("train.elastic-balance")),
        max_failures=int(config.get("train.elastic-max-failures")),
    )
    return run_elastic(
        client, job, start_iteration, weights_blob, history, collector, collector.regroup
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything fit decided before any trainer starts: checked arguments and placement."""

    job: Job  # the common arguments, datasets, trainers, seed and timeout
    model: str
    arch_id: int
    arch: dict[str, Any]
    compile_params: dict[str, Any]
    fit_params: dict[str, Any]
    per_worker_batch: list[int]  # one per trainer, in workers' order
    steps_per_epoch: int
    trainer_steps: list[int] | None  # each trainer's own (sync="iteration"), else None
    weights: Any
    tensorboard_dir: str | None
    sync: str | int
    key: str
    memory: FitMemoryPlan  # the trainers' bytes per host (dvml.train.trainer_memory)
    checkpoint_dir: str
    compile_text: str  # the parameters as the user wrote them (MADlib keeps the text)
    fit_text: str
    elastic: bool = False  # goes on without workers that leave (dvml.train.elastic)


def _plan(
    reg: Registry,
    client: Client,
    args: JobArgs,
    *,
    arch_id: int,
    compile_params: str | dict[str, Any],
    fit_params: str | dict[str, Any] | None,
    tensorboard_dir: str | None,
    sync: str | int | None,
    elastic: bool = False,
) -> _Plan:
    """Check every argument and decide the trainers, batches and job key (starts nothing)."""
    job = place_job(reg, client, args)
    warm_from = args.output if args.warm_start else None
    spec = model_spec(
        reg, arch_id, compile_params, fit_params, job.train, args.custom_objects or [], warm_from
    )
    workers = job.workers
    sync_mode, sync_reason = choose_sync(sync, args.use_gpus, [w.gpus for w in workers])
    logger.info("training %s with sync=%r: %s", args.output, sync_mode, sync_reason)
    per_worker, steps = batch_split(job.train, workers, int(spec.fit_params["batch_size"]))
    _check_tensorboard(tensorboard_dir)
    memory = fit_memory_plan(
        client, workers, per_worker, job.train.summary, spec.arch, spec.compile_params,
        spec.weights, use_gpus=args.use_gpus,
    )  # fmt: skip
    key = fit_key(job, spec, sync_mode, elastic)
    return _Plan(
        job=job,
        model=args.output,
        arch_id=arch_id,
        arch=spec.arch,
        compile_params=spec.compile_params,
        fit_params=spec.fit_params,
        per_worker_batch=per_worker,
        steps_per_epoch=steps,
        trainer_steps=trainer_steps(job.train, workers, per_worker, sync_mode),
        weights=spec.weights,
        tensorboard_dir=tensorboard_dir,
        sync=sync_mode,
        key=key,
        memory=memory,
        checkpoint_dir=checkpoint_dir(args.output, key),
        compile_text=params_text(compile_params, spec.compile_params),
        fit_text=params_text(fit_params, spec.fit_params),
        elastic=elastic,
    )


def _resume(
    client: Client, plan: _Plan, resume: bool
) -> tuple[int, bytes | None, list[dict[str, Any]]]:
    """The first iteration to run, the weights to start from and the history so far."""
    start_iteration, weights_blob, history = 1, None, list[dict[str, Any]]()
    if resume:
        find = find_elastic_checkpoint if plan.elastic else find_checkpoint
        resumed = find(client, plan.job.workers, plan.checkpoint_dir, plan.key)
        if resumed is not None:
            start_iteration, weights_blob, history = resumed
            logger.warning("resuming %s from iteration %d", plan.model, start_iteration - 1)
    if start_iteration == 1:
        weights_blob = weights_to_bytes(plan.weights) if plan.weights is not None else None
    return start_iteration, weights_blob, history


def _job(plan: _Plan, start_iteration: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    """What every trainer is told (each adds its own ``tf_config``)."""
    return {
        "program": "fit",
        "job_key": plan.key,
        "model": plan.model,  # names the job in its trainers' job files
        "model_json": plan.arch["model_json"],
        "compile_params": plan.compile_params,
        "fit_params": plan.fit_params,
        "num_iterations": plan.job.args.num_iterations,
        "start_iteration": start_iteration,
        "history": history,
        "metrics_compute_frequency": plan.job.frequency,
        "training": plan.job.train.name,
        "validation": plan.job.valid.name if plan.job.valid else None,
        "steps_per_epoch": plan.steps_per_epoch,
        "seed": plan.job.seed,
        "custom_objects": plan.job.custom_sources,
        "checkpoint_dir": plan.checkpoint_dir,
        "tensorboard_dir": plan.tensorboard_dir,
        "use_gpus": plan.job.args.use_gpus,
        "sync": plan.sync,
        "augment": plan.job.augment,
        **runtime_settings(),
    }


def _aggregate(
    history: list[dict[str, Any]], results: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One record per iteration: the resumed history, then every trainer's reports merged."""
    per_iteration: dict[int, list[dict[str, Any]]] = {r["iteration"]: [r] for r in history}
    for result in results:
        for r in result["iterations"]:
            per_iteration.setdefault(r["iteration"], []).append(r)
    return [iteration_record(per_iteration[i]) for i in sorted(per_iteration)]


def _summary(
    plan: _Plan,
    results: list[dict[str, Any]],
    iterations: list[dict[str, Any]],
    start: str,
    end: str,
    start_iteration: int,
    name: str | None,
    description: str | None,
) -> dict[str, Any]:
    """MADlib's fit summary, plus what each trainer read and where the run resumed."""
    shas = {r["weights_sha256"] for r in results}
    final_blob = next(r["weights"] for r in results if r["weights"] is not None)
    summary = build_summary(
        training=plan.job.train,
        validation=plan.job.valid,
        model=plan.model,
        arch_id=plan.arch_id,
        compile_params=plan.compile_params,
        fit_params=plan.fit_params,
        compile_text=plan.compile_text,
        fit_text=plan.fit_text,
        num_iterations=plan.job.args.num_iterations,
        metrics_compute_frequency=plan.job.frequency,
        name=name,
        description=description,
        start=start,
        end=end,
        iterations=iterations,
        model_size_kb=weights_size_kb(weights_from_bytes(final_blob)),
        trainers=[w.name for w in plan.job.workers],
        weights_identical=len(shas) == 1,
        warm_start=plan.job.args.warm_start,
        version=__version__,
        custom_objects=sorted(plan.job.custom_sources),
    )
    summary["custom_objects"] = sorted(plan.job.custom_sources)
    summary["model_arch"] = plan.arch["model_json"]  # the model stands on its own (MADlib)
    summary["sync"] = plan.sync
    summary["augment"] = describe_augment(plan.job.augment)
    summary["resumed_from_iteration"] = start_iteration - 1 if start_iteration > 1 else None
    # What each trainer read: its vineyard instance and the buffers it resolved locally.
    summary["trainer_partitions"] = {
        r["worker"]: {
            "instance_id": r["resolved"].get("instance_id"),
            "buffers": r["resolved"].get("buffers"),
            "rows": r["local_rows"],
        }
        for r in results
    }
    # Where each trainer's seconds before its first step went (and its thread budget).
    summary["trainer_startup"] = {r["worker"]: r.get("startup") for r in results}
    # The trainer that held the others back, if one did (dvml.train.stragglers): this run's
    # iterations only (a resumed run's earlier ones ran on trainers that are gone).
    summary.update(run_summary(by_iteration(m for r in results for m in r["iterations"])))
    # each trainer's and host's planned resident bytes and their peaks (dvml.train.memory_use)
    samples = ((r["worker"], m.get("resident_bytes"), m.get("zygote_bytes"))
               for r in results for m in r["iterations"])  # fmt: skip
    summary.update(memory_summary(plan.memory, samples, float(config.get("memory.margin"))))
    return summary


def _planned(plan: _Plan) -> dict[str, int]:
    """Each trainer's planned resident bytes, by worker name."""
    return {t.worker: t.total for t in plan.memory.trainers}


def _save(
    reg: Registry,
    plan: _Plan,
    results: list[dict[str, Any]],
    summary: dict[str, Any],
    iterations: list[dict[str, Any]],
) -> None:
    """Register the trained model (replacing one of the same name) with its history."""
    final_blob = next(r["weights"] for r in results if r["weights"] is not None)
    weights = weights_from_bytes(final_blob)
    try:
        reg.save_model(plan.model, plan.arch_id, weights, summary, iterations, replace=True)
    except RegistryError as exc:  # a full disk, a lock: the training itself is not lost
        raise RegistryError(
            f"{exc} The trained weights' checkpoints are kept on the workers: once the registry "
            "can be written, run the same fit again and it resumes from its last iteration."
        ) from exc


def _check_tensorboard(tensorboard_dir: str | None) -> None:
    import importlib.util

    if tensorboard_dir is not None and importlib.util.find_spec("tensorboard") is None:
        raise TrainingError(
            "tensorboard_dir was given but TensorBoard is not installed. Install it with "
            "`pip install tensorboard` (a dvml dependency), or leave tensorboard_dir out."
        )
