"""``dvml.fit``: MultiWorkerMirroredStrategy training on the workers that hold the data."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml._version import __version__
from dvml.cluster.workers import WorkerInfo, current_client
from dvml.exceptions import (
    ArgumentError,
    ModelMismatchError,
    PlacementError,
    RegistryNotFoundError,
    TrainerFailedError,
    TrainingError,
)
from dvml.names import check_name
from dvml.registry.database import Registry, open_registry
from dvml.registry.weights import weights_from_bytes, weights_to_bytes
from dvml.resolve.batches import per_worker_batch_sizes, steps_per_epoch
from dvml.store.datasets import Dataset, buffer_workers, resolve_dataset
from dvml.store.leases import holding
from dvml.train import launch
from dvml.train.exits import KILLED_BY
from dvml.train.model import Model
from dvml.train.model_lock import holding_model
from dvml.train.params import format_params, parse_compile_params, parse_fit_params
from dvml.train.summary import build_summary, check_shapes, iteration_record, weights_size_kb
from dvml.train.sync import check_sync, choose_sync

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["fit", "trainer_workers"]

logger = logging.getLogger("dvml.train")


def trainer_workers(client: Client, dataset: Dataset) -> list[WorkerInfo]:
    """The live workers that hold buffers of ``dataset``, each once, in buffer order."""
    workers: list[WorkerInfo] = []
    for w in buffer_workers(client, dataset, TrainingError):
        if w not in workers:
            workers.append(w)
    return workers


def _rows_per_worker(dataset: Dataset, workers: list[WorkerInfo]) -> dict[str, int]:
    rows = {w.name: 0 for w in workers}
    by_instance = {w.vineyard_instance_id: w.name for w in workers}
    for b in dataset.layout["buffers"]:
        rows[by_instance[b["instance_id"]]] += b["rows"]
    return rows


def _trainers(
    client: Client, train: Dataset, valid: Dataset | None, use_gpus: bool
) -> list[WorkerInfo]:
    """The workers that hold ``train`` (one trainer each), checked against the validation set
    and, with ``use_gpus``, for a GPU on every one (shared by fit and fit_multiple)."""
    workers = trainer_workers(client, train)
    if valid is not None:
        _check_validation(train, valid, workers)
    if use_gpus:
        without = [w.name for w in workers if not w.gpus]
        if without:
            raise TrainingError(
                f"use_gpus=True but trainers {without} have no GPU. Received: trainers "
                f"{[w.name for w in workers]}. Preprocess with distribution_rules='gpu_workers' "
                "or train with use_gpus=False."
            )
    return workers


def _check_validation(train: Dataset, valid: Dataset, workers: list[WorkerInfo]) -> None:
    origin = valid.summary.get("training_dataset")
    if origin is not None and origin["dataset_id"] != train.summary["dataset_id"]:
        raise ModelMismatchError(
            f"Validation set {valid.name!r} was preprocessed for training set "
            f"{origin['name']!r}, not for {train.name!r} (or {train.name!r} was replaced since). "
            f"Run dvml.validation_preprocessor(..., training={train.name!r}) again."
        )
    same = (
        valid.summary["class_values"] == train.summary["class_values"]
        and valid.summary["normalizing_const"] == train.summary["normalizing_const"]
        and valid.summary["x_shapes"] == train.summary["x_shapes"]
    )
    if not same:
        raise ModelMismatchError(
            f"Validation set {valid.name!r} differs from training set {train.name!r} in class "
            "values, normalizing_const or x shapes. Build it with dvml.validation_preprocessor("
            f"..., training={train.name!r})."
        )
    trainer_instances = {w.vineyard_instance_id for w in workers}
    elsewhere = sorted(
        {
            b["worker_name"]
            for b in valid.layout["buffers"]
            if b["instance_id"] not in trainer_instances
        }
    )
    if elsewhere:
        raise PlacementError(
            f"Validation set {valid.name!r} has buffers on {elsewhere}, where no trainer runs "
            f"(trainers: {[w.name for w in workers]}). Preprocess it with the training set's "
            "distribution rules (the default of dvml.validation_preprocessor)."
        )


def _job_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


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
    sync: str | int | None = None,
    resume: bool = True,
    seed: int | None = None,
    timeout: float | None = None,
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
        Name of the output model in the registry (replaced when it exists).
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
    sync : {"step", "iteration"} or int, optional
        How the trainers synchronise. ``"step"``: MultiWorkerMirroredStrategy all-reduces the
        gradients at every step. ``"iteration"``: MADlib's model averaging; each trainer fits
        its local rows with its own optimizer for the iteration's epochs, then all weights
        are averaged, weighted by the trainers' row counts. An int ``k``: average every ``k``
        steps (local SGD). Default (config ``dvml.train.sync``, null = automatic): ``"step"``
        when ``use_gpus=True`` and every trainer has a GPU, else ``"iteration"``.
    resume : bool
        Resume from the checkpoint of an interrupted run of the same job, if there is one.
    timeout : float, optional
        Seconds before the trainers are stopped (config ``dvml.train.trainer-timeout``).
    on_iteration : callable, optional
        Called on the client with each iteration's aggregated record while training runs.
    progress : bool
        Log one line per iteration (logger ``dvml.train``, and printed).

    Returns
    -------
    dvml.Model
        The registered model: ``.summary`` has every field of MADlib's fit summary.
    """
    requested_sync = check_sync(config.get("train.sync", check_sync(sync)))
    client = current_client(client)
    reg = open_registry(registry)
    # The datasets it reads are leased for the whole fit: a drop or overwrite is refused.
    with holding([training_set, validation_set], job=f"dvml.fit of model {model!r}"):
        plan = _plan(
            reg, client, training_set, model=model, arch_id=arch_id,
            compile_params=compile_params, fit_params=fit_params,
            num_iterations=num_iterations, use_gpus=use_gpus, validation_set=validation_set,
            metrics_compute_frequency=metrics_compute_frequency, warm_start=warm_start,
            custom_objects=custom_objects, tensorboard_dir=tensorboard_dir, seed=seed,
            timeout=timeout, sync=requested_sync,
        )  # fmt: skip
        # One fit per model at a time: a second one would share (and resume from) this one's
        # checkpoints. Held until the model is saved; refused with the running job's name.
        with holding_model(config.state_dir(), model, plan.key):
            start_iteration, weights_blob, history = _resume(client, plan, resume)
            endpoints = _reserve_ports(client, plan.workers)
            collector = _Progress(len(plan.workers), model, num_iterations, on_iteration, progress)
            start = _now()
            results = _run_trainers(
                client,
                plan,
                _job(plan, start_iteration, history),
                endpoints,
                weights_blob,
                collector,
            )
            end = _now()
            iterations = _aggregate(history, results)
            summary = _summary(
                plan, results, iterations, start, end, start_iteration, name, description
            )
            _save(reg, plan, results, summary, iterations)
            _clear_checkpoints(client, plan)
    return Model(model, reg)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything fit decided before any trainer starts: checked arguments and placement."""

    model: str
    arch_id: int
    arch: dict[str, Any]
    train: Dataset
    valid: Dataset | None
    workers: list[WorkerInfo]
    compile_params: dict[str, Any]
    fit_params: dict[str, Any]
    num_iterations: int
    frequency: int
    per_worker_batch: list[int]  # one per trainer, in workers' order
    steps_per_epoch: int
    custom_sources: dict[str, str]
    weights: Any
    warm_start: bool
    use_gpus: bool
    tensorboard_dir: str | None
    seed: int
    timeout: float
    sync: str | int
    key: str
    checkpoint_dir: str


def _plan(
    reg: Registry,
    client: Client,
    training_set: str | Dataset,
    *,
    model: str,
    arch_id: int,
    compile_params: str | dict[str, Any],
    fit_params: str | dict[str, Any] | None,
    num_iterations: int,
    use_gpus: bool,
    validation_set: str | Dataset | None,
    metrics_compute_frequency: int | None,
    warm_start: bool,
    custom_objects: list[str] | None,
    tensorboard_dir: str | None,
    seed: int | None,
    timeout: float | None,
    sync: str | int | None,
) -> _Plan:
    """Check every argument and decide the trainers, batches and job key (starts nothing)."""
    _check_fit_args(model, num_iterations, metrics_compute_frequency)
    freq = metrics_compute_frequency or num_iterations
    # With the custom names, a loss or metric the trainers could not resolve is refused here.
    compile_parsed = parse_compile_params(compile_params, custom_names=custom_objects or [])
    fit_parsed = parse_fit_params(fit_params)
    fit_parsed.setdefault("epochs", 1)
    global_batch = int(fit_parsed.setdefault("batch_size", 32))

    train = resolve_dataset(training_set, client)
    valid = resolve_dataset(validation_set, client) if validation_set is not None else None
    arch = reg.get_architecture(arch_id)
    check_shapes(arch, train.summary, train.name)
    weights = arch["weights"]
    if warm_start:
        weights = _warm_start_weights(reg, model, arch_id)
    workers = _trainers(client, train, valid, use_gpus)
    sync_mode, sync_reason = choose_sync(sync, use_gpus, [w.gpus for w in workers])
    logger.info("training %s with sync=%r: %s", model, sync_mode, sync_reason)
    rows = _rows_per_worker(train, workers)
    per_worker = per_worker_batch_sizes(global_batch, [rows[w.name] for w in workers])
    steps = steps_per_epoch([rows[w.name] for w in workers], per_worker)
    if len(set(per_worker)) > 1:
        logger.warning(
            "batch_size=%d does not divide evenly over %d trainers: per-trainer batches %s",
            global_batch,
            len(workers),
            dict(zip([w.name for w in workers], per_worker, strict=True)),
        )
    custom_sources = reg.custom_function_sources(custom_objects or [])
    if tensorboard_dir is not None:
        _check_tensorboard()
    seed = int(config.get("preprocess.seed", seed))
    timeout = float(config.get("train.trainer-timeout", timeout))
    key = _job_key(
        train.summary["dataset_id"],
        valid.summary["dataset_id"] if valid else None,
        arch_id,
        compile_parsed,
        fit_parsed,
        num_iterations,
        freq,
        seed,
        warm_start,
        len(workers),
        sync_mode,
    )
    return _Plan(
        model=model,
        arch_id=arch_id,
        arch=arch,
        train=train,
        valid=valid,
        workers=workers,
        compile_params=compile_parsed,
        fit_params=fit_parsed,
        num_iterations=num_iterations,
        frequency=freq,
        per_worker_batch=per_worker,
        steps_per_epoch=steps,
        custom_sources=custom_sources,
        weights=weights,
        warm_start=warm_start,
        use_gpus=use_gpus,
        tensorboard_dir=tensorboard_dir,
        seed=seed,
        timeout=timeout,
        sync=sync_mode,
        key=key,
        checkpoint_dir=str(config.state_dir() / "checkpoints" / f"{model}-{key}"),
    )


def _resume(
    client: Client, plan: _Plan, resume: bool
) -> tuple[int, bytes | None, list[dict[str, Any]]]:
    """The first iteration to run, the weights to start from and the history so far."""
    start_iteration, weights_blob, history = 1, None, list[dict[str, Any]]()
    if resume:
        resumed = _find_checkpoint(client, plan.workers, plan.checkpoint_dir, plan.key)
        if resumed is not None:
            start_iteration, weights_blob, history = resumed
            logger.warning("resuming %s from iteration %d", plan.model, start_iteration - 1)
    if start_iteration == 1:
        weights_blob = weights_to_bytes(plan.weights) if plan.weights is not None else None
    return start_iteration, weights_blob, history


def _reserve_ports(client: Client, workers: list[WorkerInfo]) -> list[str]:
    """One free ``host:port`` per trainer, reserved on its own worker (the TF_CONFIG peers)."""
    addresses = [
        client.submit(
            launch.reserve_port, workers=[w.address], allow_other_workers=False, pure=False
        )
        for w in workers
    ]
    return [f"{h}:{p}" for h, p in client.gather(addresses)]


def _job(plan: _Plan, start_iteration: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    """What every trainer is told (each adds its own ``tf_config``)."""
    return {
        "job_key": plan.key,
        "model": plan.model,  # names the job in its trainers' job files
        "model_json": plan.arch["model_json"],
        "compile_params": plan.compile_params,
        "fit_params": plan.fit_params,
        "num_iterations": plan.num_iterations,
        "start_iteration": start_iteration,
        "history": history,
        "metrics_compute_frequency": plan.frequency,
        "training": plan.train.name,
        "validation": plan.valid.name if plan.valid else None,
        "steps_per_epoch": plan.steps_per_epoch,
        "seed": plan.seed,
        "custom_objects": plan.custom_sources,
        "checkpoint_dir": plan.checkpoint_dir,
        "tensorboard_dir": plan.tensorboard_dir,
        "use_gpus": plan.use_gpus,
        "sync": plan.sync,
        "peer_timeout": config.get("train.peer-timeout"),
        # Launchers stop their trainers when this client is gone this long (dvml.train.launch).
        "client_timeout": config.get("train.client-timeout"),
        # Thread budget (dvml.tf_runtime.thread_budget): None = share of the host's cores.
        "threads": [config.get("train.intra-op-threads"), config.get("train.inter-op-threads")],
        "standby": bool(config.get("train.standby-trainer")),
    }


def _run_trainers(
    client: Client,
    plan: _Plan,
    base_job: dict[str, Any],
    endpoints: list[str],
    weights_blob: bytes | None,
    collector: _Progress,
) -> list[dict[str, Any]]:
    """Launch one trainer per worker and wait for all; progress events go to ``collector``."""
    from distributed import Event

    job_id = uuid.uuid4().hex[:12]
    topic, abort_name = f"dvml-fit-{job_id}", f"dvml-fit-abort-{job_id}"
    client.subscribe_topic(topic, collector)
    abort = Event(abort_name, client=client)
    futures = []
    for i, w in enumerate(plan.workers):
        job = {
            **base_job,
            # Each trainer's own share of the global batch (they differ by at most one row).
            "per_worker_batch": plan.per_worker_batch[i],
            "tf_config": {"cluster": {"worker": endpoints}, "task": {"type": "worker", "index": i}},
            # Trainers that share this machine's cores: its network address, not DVML_HOST
            # (a LocalCluster's simulated hosts are one machine).
            "trainers_on_host": sum(1 for o in plan.workers if _machine(o) == _machine(w)),
        }
        futures.append(
            client.submit(
                launch.run_trainer,
                job,
                weights_blob,
                topic,
                abort_name,
                plan.timeout,
                workers=[w.address],
                allow_other_workers=False,
                pure=False,
                retries=0,
                key=f"dvml-trainer-{job_id}-{w.name}",
            )
        )
    try:
        return _wait_trainers(client, futures, plan.workers, abort)
    finally:
        client.unsubscribe_topic(topic)


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
        training=plan.train,
        validation=plan.valid,
        model=plan.model,
        arch_id=plan.arch_id,
        compile_params=plan.compile_params,
        fit_params=plan.fit_params,
        compile_text=format_params(plan.compile_params),
        fit_text=format_params(plan.fit_params),
        num_iterations=plan.num_iterations,
        metrics_compute_frequency=plan.frequency,
        name=name,
        description=description,
        start=start,
        end=end,
        iterations=iterations,
        model_size_kb=weights_size_kb(weights_from_bytes(final_blob)),
        trainers=[w.name for w in plan.workers],
        weights_identical=len(shas) == 1,
        warm_start=plan.warm_start,
        version=__version__,
    )
    summary["custom_objects"] = sorted(plan.custom_sources)
    summary["sync"] = plan.sync
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
    return summary


def _save(
    reg: Registry,
    plan: _Plan,
    results: list[dict[str, Any]],
    summary: dict[str, Any],
    iterations: list[dict[str, Any]],
) -> None:
    """Register the trained model (replacing one of the same name) with its history."""
    final_blob = next(r["weights"] for r in results if r["weights"] is not None)
    reg.save_model(
        plan.model, plan.arch_id, weights_from_bytes(final_blob), summary, iterations, replace=True
    )


def _clear_checkpoints(client: Client, plan: _Plan) -> None:
    """The model is saved: its checkpoints on every trainer's worker are no longer needed."""
    client.gather(
        [
            client.submit(
                launch.clear_checkpoint, plan.checkpoint_dir, workers=[w.address], pure=False
            )
            for w in plan.workers
        ]
    )


def _machine(worker: WorkerInfo) -> str:
    """The network host of a worker's address (``tcp://10.0.0.5:4242`` -> ``10.0.0.5``)."""
    return worker.address.split("://")[-1].rsplit(":", 1)[0]


def _check_tensorboard() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise TrainingError(
            "tensorboard_dir was given but TensorBoard is not installed. Install it with "
            "`pip install tensorboard` (a dvml dependency), or leave tensorboard_dir out."
        )


def _check_fit_args(model: Any, num_iterations: Any, freq: Any) -> None:
    check_name(model, "model")
    if (
        isinstance(num_iterations, bool)
        or not isinstance(num_iterations, int)
        or num_iterations < 1
    ):
        raise ArgumentError(
            f"num_iterations must be a positive int. Received: num_iterations={num_iterations!r}. "
            "Pass the number of training iterations, for example num_iterations=10."
        )
    if freq is not None and (isinstance(freq, bool) or not isinstance(freq, int) or freq < 1):
        raise ArgumentError(
            f"metrics_compute_frequency must be a positive int or None. Received: "
            f"metrics_compute_frequency={freq!r}. None computes metrics after the last iteration."
        )


def _warm_start_weights(reg: Registry, model: str, arch_id: int) -> Any:
    try:
        existing = reg.get_model(model)
    except RegistryNotFoundError:
        raise TrainingError(
            f"warm_start=True but no model named {model!r} exists to start from. Train it once "
            "with warm_start=False, or check the name with dvml.list_models()."
        ) from None
    if existing["arch_id"] != arch_id:
        # Same input/output shapes are not enough: every weight must fit its variable.
        expected = weight_shapes(reg.get_architecture(arch_id)["model_json"])
        found = [list(w.shape) for w in existing["weights"]]
        if expected != found:
            raise ModelMismatchError(
                f"warm_start=True but the weights of model {model!r} (architecture "
                f"{existing['arch_id']}) do not fit architecture {arch_id}. Received weight "
                f"shapes {found}, expected {expected}. Warm-start with the model's own "
                "architecture, or train from scratch."
            )
    return existing["weights"]


def weight_shapes(model_json: str) -> list[list[int]]:
    """Shapes of a Keras model's weights, built from its JSON (loads TensorFlow)."""
    from dvml import tf_runtime

    model = tf_runtime.keras().models.model_from_json(model_json)
    return [list(w.shape) for w in model.get_weights()]


def _find_checkpoint(
    client: Client, workers: list[WorkerInfo], directory: str, key: str
) -> tuple[int, bytes, list[dict[str, Any]]] | None:
    """The last iteration every trainer checkpointed for this job, with its weights."""
    states = client.gather(
        [
            client.submit(
                launch.checkpoint_state,
                directory,
                w.name,
                workers=[w.address],
                allow_other_workers=False,
                pure=False,
            )
            for w in workers
        ]
    )
    if any(s is None or s.get("job_id") != key for s in states):
        return None
    done = min(s["iteration"] for s in states)
    state = next(s for s in states if s["iteration"] == done)
    history = [r for r in state["history"] if r["iteration"] <= done]
    return done + 1, state["weights"], history


def _wait_trainers(
    client: Client, futures: list[Any], workers: list[WorkerInfo], abort: Any
) -> list[dict[str, Any]]:
    """Wait for every trainer; on the first failure (or an interrupt here) stop them all."""
    from distributed import as_completed

    try:
        for future in as_completed(futures, loop=client.loop):
            if future.status == "error":
                # The first error to arrive is often a survivor's "peer went away": blame the
                # trainer that died first when it reports within a few seconds.
                future = _first_cause(futures, future)
                worker = workers[futures.index(future)].name
                exc = future.exception()
                _raise_if_a_peer_left(client, futures, workers, exc)
                if isinstance(exc, TrainerFailedError):
                    raise exc
                raise TrainerFailedError(
                    f"The trainer on worker {worker} failed: {type(exc).__name__}: {exc}. If "
                    "the worker died, run fit again: it resumes from the last completed "
                    "iteration."
                ) from exc
        return [f.result() for f in futures]
    except BaseException:
        # The others would block in collectives until the peer timeout: stop them now. Each
        # launcher polls the abort event and kills its trainer process within a second.
        abort.set()
        _settle(futures, timeout=120)
        raise


def _first_cause(futures: list[Any], failed: Any, wait: float = 5.0) -> Any:
    """The failed trainer to blame: ``failed``, unless its error is what a lost peer causes
    and another trainer fails within ``wait`` seconds for a reason of its own (killed by a
    signal, an error in the model): then that one."""
    from dvml.train.peers import looks_like_peer_failure

    def own_failure(future: Any) -> bool:
        text = f"{type(exc := future.exception()).__name__}: {exc}"
        # A killed trainer's last lines may mention connections: its signal decides.
        return KILLED_BY in text or not looks_like_peer_failure(text)

    if own_failure(failed):
        return failed
    deadline = time.monotonic() + wait
    while True:
        for future in futures:
            if future is not failed and future.status == "error" and own_failure(future):
                return future
        pending = [f for f in futures if f.status == "pending"]
        if not pending or time.monotonic() >= deadline:
            return failed
        time.sleep(0.25)


def _raise_if_a_peer_left(
    client: Client, futures: list[Any], workers: list[WorkerInfo], exc: Any
) -> None:
    """A surviving trainer's collective error hides the host that went away: name that host.

    Asked whatever the error says: what a survivor reports when its peer's host dies depends
    on where in a step it was (and on the load), and a departed worker is the cause in any
    case. Only an error that looks like a lost peer waits for the scheduler to notice.
    """
    from dvml.train.peers import departed_workers, describe_departure, looks_like_peer_failure

    text = f"{type(exc).__name__}: {exc}"
    gone = departed_workers(client, workers, wait=5.0 if looks_like_peer_failure(text) else 0.0)
    if gone:
        # Their trainers' tasks would keep the clean-up waiting until the scheduler gives
        # up on the workers: stop waiting for them now.
        client.cancel([f for f, w in zip(futures, workers, strict=True) if w in gone])
        raise TrainerFailedError(
            f"{describe_departure(gone)}. The other trainers then failed ({text[:300]}). Bring "
            "the host back (or preprocess onto the remaining workers) and run fit again: it "
            "resumes from the last completed iteration when the data is still in place."
        ) from exc


def _settle(futures: list[Any], timeout: float) -> None:
    """Wait (bounded) until every future is done, ignoring its outcome."""
    for future in futures:
        try:
            future.result(timeout=timeout)
        except BaseException:
            pass


class _Progress:
    """Collects trainers' progress events; reports each iteration once all trainers sent it."""

    def __init__(
        self,
        n_trainers: int,
        model: str,
        total: int,
        callback: Callable[[dict[str, Any]], None] | None,
        echo: bool,
    ) -> None:
        self.n, self.model, self.total = n_trainers, model, total
        self.callback, self.echo = callback, echo
        self.pending: dict[int, list[dict[str, Any]]] = {}

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
            logger.info(line)
            print(line, flush=True)
        if self.callback is not None:
            self.callback(record)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
