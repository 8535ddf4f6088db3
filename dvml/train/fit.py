"""``dvml.fit``: MultiWorkerMirroredStrategy training on the workers that hold the data."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.cluster.attach import current_client
from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import (
    ModelMismatchError,
    PlacementError,
    RegistryNotFoundError,
    TrainerFailedError,
    TrainingError,
)
from dvml.resolve.batches import per_worker_batch_size, steps_per_epoch
from dvml.store.datasets import Dataset, describe, vineyard_workers
from dvml.train import launch
from dvml.train.params import format_params, parse_compile_params, parse_fit_params
from dvml.train.summary import build_summary, check_shapes, iteration_record

if TYPE_CHECKING:
    from distributed import Client

    from dvml.registry import Registry

__all__ = ["fit", "open_registry", "resolve_dataset", "trainer_workers"]

logger = logging.getLogger("dvml.train")


def open_registry(registry: Registry | str | None) -> Registry:
    from dvml.registry import Registry

    return registry if isinstance(registry, Registry) else Registry(registry)


def resolve_dataset(value: str | Dataset, client: Client) -> Dataset:
    return value if isinstance(value, Dataset) else describe(value, client)


def trainer_workers(client: Client, dataset: Dataset) -> list[WorkerInfo]:
    """The live workers that hold buffers of ``dataset``, in buffer order."""
    by_instance = vineyard_workers(client)
    workers: list[WorkerInfo] = []
    for b in dataset.layout["buffers"]:
        w = by_instance.get(b["instance_id"])
        if w is None:
            raise TrainingError(
                f"Buffer {b['index']} of {dataset.name!r} lives on vineyard instance "
                f"{b['instance_id']} (worker {b['worker_name']}), which no live worker serves. "
                "Its data is lost with its daemon: preprocess the dataset again."
            )
        if w not in workers:
            workers.append(w)
    return workers


def _rows_per_worker(dataset: Dataset, workers: list[WorkerInfo]) -> dict[str, int]:
    rows = {w.name: 0 for w in workers}
    by_instance = {w.vineyard_instance_id: w.name for w in workers}
    for b in dataset.layout["buffers"]:
        rows[by_instance[b["instance_id"]]] += b["rows"]
    return rows


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
    resume: bool = True,
    seed: int | None = None,
    timeout: float | None = None,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> Any:
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
        metrics=['accuracy']"``) or dicts, parsed safely. ``batch_size`` is the GLOBAL batch,
        split evenly over the trainers; ``epochs`` are run per iteration.
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
    from distributed import Event

    from dvml.train.model import Model

    client = current_client(client)
    reg = open_registry(registry)
    _check_fit_args(model, num_iterations, metrics_compute_frequency)
    freq = metrics_compute_frequency or num_iterations
    compile_parsed = parse_compile_params(compile_params)
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
    per_worker = per_worker_batch_size(global_batch, len(workers))
    rows = _rows_per_worker(train, workers)
    steps = steps_per_epoch(list(rows.values()), per_worker)
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
    )
    ckpt_dir = str(config.state_dir() / "checkpoints" / f"{model}-{key}")
    start_iteration, history = 1, list[dict[str, Any]]()
    weights_blob: bytes | None = None
    if resume:
        resumed = _find_checkpoint(client, workers, ckpt_dir, key)
        if resumed is not None:
            start_iteration, weights_blob, history = resumed
            logger.warning("resuming %s from iteration %d", model, start_iteration - 1)
    from dvml.registry.weights import weights_to_bytes

    if start_iteration == 1:
        weights_blob = weights_to_bytes(weights) if weights is not None else None

    addresses = [
        client.submit(
            launch.reserve_port, workers=[w.address], allow_other_workers=False, pure=False
        )
        for w in workers
    ]
    endpoints = [f"{h}:{p}" for h, p in client.gather(addresses)]
    job_id = uuid.uuid4().hex[:12]
    topic, abort_name = f"dvml-fit-{job_id}", f"dvml-fit-abort-{job_id}"
    base_job = {
        "job_key": key,
        "model_json": arch["model_json"],
        "compile_params": compile_parsed,
        "fit_params": fit_parsed,
        "num_iterations": num_iterations,
        "start_iteration": start_iteration,
        "history": history,
        "metrics_compute_frequency": freq,
        "training": train.name,
        "validation": valid.name if valid else None,
        "per_worker_batch": per_worker,
        "steps_per_epoch": steps,
        "seed": seed,
        "custom_objects": custom_sources,
        "checkpoint_dir": ckpt_dir,
        "tensorboard_dir": tensorboard_dir,
        "use_gpus": use_gpus,
        "peer_timeout": config.get("train.peer-timeout"),
    }
    collector = _Progress(len(workers), model, num_iterations, on_iteration, progress)
    client.subscribe_topic(topic, collector)
    abort = Event(abort_name, client=client)
    start = _now()
    futures = []
    for i, w in enumerate(workers):
        job = {
            **base_job,
            "tf_config": {"cluster": {"worker": endpoints}, "task": {"type": "worker", "index": i}},
        }
        futures.append(
            client.submit(
                launch.run_trainer,
                job,
                weights_blob,
                topic,
                abort_name,
                timeout,
                workers=[w.address],
                allow_other_workers=False,
                pure=False,
                retries=0,
                key=f"dvml-trainer-{job_id}-{w.name}",
            )
        )
    try:
        results = _wait_trainers(client, futures, workers, abort)
    finally:
        client.unsubscribe_topic(topic)
    end = _now()

    per_iteration: dict[int, list[dict[str, Any]]] = {r["iteration"]: [r] for r in history}
    for result in results:
        for r in result["iterations"]:
            per_iteration.setdefault(r["iteration"], []).append(r)
    iterations = [iteration_record(per_iteration[i]) for i in sorted(per_iteration)]
    shas = {r["weights_sha256"] for r in results}
    final_blob = next(r["weights"] for r in results if r["weights"] is not None)
    from dvml.registry.weights import weights_from_bytes

    summary = build_summary(
        training=train,
        validation=valid,
        model=model,
        arch_id=arch_id,
        compile_params=compile_parsed,
        fit_params=fit_parsed,
        compile_text=format_params(compile_parsed),
        fit_text=format_params(fit_parsed),
        num_iterations=num_iterations,
        metrics_compute_frequency=freq,
        name=name,
        description=description,
        start=start,
        end=end,
        iterations=iterations,
        model_size_kb=len(final_blob) / 1024,
        trainers=[w.name for w in workers],
        weights_identical=len(shas) == 1,
        warm_start=warm_start,
        version=_version(),
    )
    summary["custom_objects"] = sorted(custom_sources)
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
    reg.save_model(
        model, arch_id, weights_from_bytes(final_blob), summary, iterations, replace=True
    )
    client.gather(
        [
            client.submit(launch.clear_checkpoint, ckpt_dir, workers=[w.address], pure=False)
            for w in workers
        ]
    )
    return Model(model, reg)


def _check_tensorboard() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise TrainingError(
            "tensorboard_dir was given but TensorBoard is not installed. Install it with "
            "`pip install tensorboard` (a dvml dependency), or leave tensorboard_dir out."
        )


def _check_fit_args(model: Any, num_iterations: Any, freq: Any) -> None:
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty name. Received: model={model!r}.")
    if (
        isinstance(num_iterations, bool)
        or not isinstance(num_iterations, int)
        or num_iterations < 1
    ):
        raise ValueError(f"num_iterations must be a positive int. Received: {num_iterations!r}.")
    if freq is not None and (isinstance(freq, bool) or not isinstance(freq, int) or freq < 1):
        raise ValueError(
            f"metrics_compute_frequency must be a positive int or None. Received: {freq!r}."
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
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    model = keras.models.model_from_json(model_json)
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


def _raise_if_a_peer_left(
    client: Client, futures: list[Any], workers: list[WorkerInfo], exc: Any
) -> None:
    """A surviving trainer's collective error hides the host that went away: name that host."""
    from dvml.train.peers import departed_workers, describe_departure, looks_like_peer_failure

    text = f"{type(exc).__name__}: {exc}"
    if not looks_like_peer_failure(text):
        return
    gone = departed_workers(client, workers)
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


def _version() -> str:
    import dvml

    return dvml.__version__
