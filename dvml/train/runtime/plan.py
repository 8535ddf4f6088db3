"""What every training job decides before a trainer starts: arguments, datasets, trainers.

The one planner of where a job trains (:func:`place_job`): its common arguments checked, its
datasets resolved, the live workers that hold the training set (one trainer each) checked
against the validation set and the GPUs asked for, its seed and timeout; each model's
architecture and parameters (:func:`model_spec`); the rows each worker holds; job keys.
Schedulers (``fit``, ``fit_multiple``, model search) call these; nothing here starts a
process. The seed function of the trainers is :func:`dvml.train.runtime.seeds.shuffle_seed`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.cluster.workers import WorkerInfo
from dvml.configs import parse_compile_params, parse_fit_params
from dvml.exceptions import (
    ArgumentError,
    ModelMismatchError,
    PlacementError,
    RegistryNotFoundError,
    TrainingError,
)
from dvml.names import check_name
from dvml.resolve.batches import per_worker_batch_sizes, steps_covering, steps_per_epoch
from dvml.store.datasets import Dataset, buffer_workers, resolve_dataset
from dvml.train.runtime.augment import encode as encode_augment
from dvml.train.runtime.augment import job_key_part as augment_key_part
from dvml.train.summary import check_shapes

if TYPE_CHECKING:
    from distributed import Client

    from dvml.registry.database import Registry

logger = logging.getLogger("dvml.train")

__all__ = [
    "Job",
    "JobArgs",
    "ModelSpec",
    "batch_split",
    "check_colocated",
    "check_fit_args",
    "checkpoint_dir",
    "dataset_key",
    "job_key",
    "machine",
    "model_spec",
    "now",
    "place_job",
    "rows_per_worker",
    "runtime_settings",
    "trainer_workers",
    "training_workers",
    "utc_text",
    "warm_start_weights",
    "weight_shapes",
]


@dataclasses.dataclass(frozen=True)
class JobArgs:
    """The arguments every training scheduler takes, as the user gave them (MADlib's names).

    ``output`` is what the job registers: ``fit``'s ``model``, ``fit_multiple``'s
    ``model_output``.
    """

    output: str
    training_set: str | Dataset
    validation_set: str | Dataset | None
    num_iterations: int
    metrics_compute_frequency: int | None
    use_gpus: bool
    warm_start: bool
    custom_objects: list[str] | None
    seed: int | None
    timeout: float | None
    augment: Any = None  # a tf-keras layer or a function (dvml.train.runtime.augment)


@dataclasses.dataclass(frozen=True)
class Job:
    """A job's arguments, checked, with its datasets and trainers resolved (:func:`place_job`)."""

    args: JobArgs
    train: Dataset
    valid: Dataset | None
    workers: list[WorkerInfo]
    frequency: int  # metrics every this many iterations (and after the last)
    seed: int
    timeout: float
    custom_sources: dict[str, str]
    augment: dict[str, Any] | None  # its job-file form (dvml.train.runtime.augment.encode)

    @property
    def augment_key(self) -> list[Any]:
        """What of the augmentation goes into the job's key (:func:`job_key`): nothing
        without one, so the keys (and checkpoints) of jobs without one do not change."""
        return [] if self.augment is None else [augment_key_part(self.augment)]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model to train: its architecture, parsed parameters and starting weights."""

    arch_id: int
    arch: dict[str, Any]
    compile_params: dict[str, Any]
    fit_params: dict[str, Any]
    weights: Any  # None: the architecture's own seeded initialisation

    def config(self) -> dict[str, Any]:
        """What a trainer needs to build and compile the model."""
        return {
            "model_json": self.arch["model_json"],
            "compile_params": self.compile_params,
            "fit_params": self.fit_params,
        }


def model_spec(
    reg: Registry,
    arch_id: int,
    compile_params: str | dict[str, Any],
    fit_params: str | dict[str, Any] | None,
    train: Dataset,
    custom_names: list[str],
    warm_start_from: str | None = None,
) -> ModelSpec:
    """Parse and check one model's parameters against the registry and the training set;
    ``warm_start_from`` names the registered model whose weights it starts from."""
    # With the custom names, a loss or metric the trainers could not resolve is refused here.
    compile_parsed = parse_compile_params(compile_params, custom_names=custom_names)
    fit_parsed = parse_fit_params(fit_params)
    fit_parsed.setdefault("epochs", 1)
    fit_parsed.setdefault("batch_size", 32)
    arch = reg.get_architecture(arch_id)
    check_shapes(arch, train.summary, train.name)
    weights = arch["weights"]
    if warm_start_from is not None:
        weights = warm_start_weights(reg, warm_start_from, arch_id)
    return ModelSpec(arch_id, arch, compile_parsed, fit_parsed, weights)


def place_job(reg: Registry, client: Client, args: JobArgs) -> Job:
    """Check a job's common arguments and resolve its datasets, trainers, seed and timeout."""
    check_fit_args(args.output, args.num_iterations, args.metrics_compute_frequency)
    train = resolve_dataset(args.training_set, client)
    valid = None
    if args.validation_set is not None:
        valid = resolve_dataset(args.validation_set, client)
    return Job(
        args=args,
        train=train,
        valid=valid,
        workers=training_workers(client, train, valid, args.use_gpus),
        frequency=args.metrics_compute_frequency or args.num_iterations,
        seed=int(config.get("preprocess.seed", args.seed)),
        timeout=float(config.get("train.trainer-timeout", args.timeout)),
        custom_sources=reg.custom_function_sources(args.custom_objects or []),
        augment=encode_augment(args.augment),
    )


def trainer_workers(client: Client, dataset: Dataset) -> list[WorkerInfo]:
    """The live workers that hold buffers of ``dataset``, each once, in buffer order."""
    workers: list[WorkerInfo] = []
    for w in buffer_workers(client, dataset, TrainingError):
        if w not in workers:
            workers.append(w)
    return workers


def training_workers(
    client: Client, train: Dataset, valid: Dataset | None, use_gpus: bool
) -> list[WorkerInfo]:
    """The workers that hold ``train`` (one trainer each), checked against the validation set
    and, with ``use_gpus``, for a GPU on every one."""
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


def rows_per_worker(dataset: Dataset, workers: list[WorkerInfo]) -> dict[str, int]:
    """Rows of ``dataset`` each worker holds, by worker name."""
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
    check_colocated(valid, workers, "Validation set")


def check_colocated(dataset: Dataset, workers: list[WorkerInfo], what: str = "Dataset") -> None:
    """Refuse ``dataset`` when some of its buffers are on workers where no trainer runs."""
    trainer_instances = {w.vineyard_instance_id for w in workers}
    elsewhere = sorted(
        {
            b["worker_name"]
            for b in dataset.layout["buffers"]
            if b["instance_id"] not in trainer_instances
        }
    )
    if elsewhere:
        raise PlacementError(
            f"{what} {dataset.name!r} has buffers on {elsewhere}, where no trainer runs "
            f"(trainers: {[w.name for w in workers]}). Preprocess it with the training set's "
            "distribution rules (the default of dvml.validation_preprocessor)."
        )


def batch_split(
    train: Dataset, workers: list[WorkerInfo], global_batch: int
) -> tuple[list[int], int]:
    """Each trainer's share of the global batch, and the steps per epoch all of them run."""
    rows = rows_per_worker(train, workers)
    per_worker = per_worker_batch_sizes(global_batch, [rows[w.name] for w in workers])
    steps = steps_per_epoch([rows[w.name] for w in workers], per_worker)
    if len(set(per_worker)) > 1:
        logger.warning(
            "batch_size=%d does not divide evenly over %d trainers: per-trainer batches %s",
            global_batch,
            len(workers),
            dict(zip([w.name for w in workers], per_worker, strict=True)),
        )
    return per_worker, steps


def trainer_steps(
    train: Dataset, workers: list[WorkerInfo], per_worker: list[int], sync: str | int
) -> list[int] | None:
    """Each trainer's own steps per epoch where trainers do not meet at every step
    (``sync="iteration"``: they meet once per iteration, in the averaging), else None.

    Such a trainer runs the steps that cover its rows, the last batch short
    (:func:`~dvml.resolve.batches.steps_covering`), so every row is trained once per epoch.
    Trainers that meet at every step (``"step"``) or every ``k`` steps run the same number of
    full batches, :func:`~dvml.resolve.batches.steps_per_epoch`.
    """
    if sync != "iteration":
        return None
    rows = rows_per_worker(train, workers)
    return [steps_covering(rows[w.name], b) for w, b in zip(workers, per_worker, strict=True)]


def dataset_key(dataset: Any) -> list[Any] | None:
    """What a job key holds of a dataset: its ``dataset_id`` (new each time it is preprocessed)
    and the version it reads (an append keeps the id and adds rows): a rerun after an append
    trains on other rows, so it starts afresh rather than resuming. None for no dataset."""
    if dataset is None:
        return None
    return [dataset.summary["dataset_id"], int(getattr(dataset, "version", 1))]


def job_key(*parts: Any) -> str:
    """A short key that is the same for the same job (what a rerun resumes by)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def machine(worker: WorkerInfo) -> str:
    """The network host of a worker's address (``tcp://10.0.0.5:4242`` -> ``10.0.0.5``)."""
    return worker.address.split("://")[-1].rsplit(":", 1)[0]


def now() -> str:
    """The time now (UTC, ISO 8601, seconds), as summaries record it."""
    return utc_text(datetime.datetime.now(datetime.UTC).timestamp())


def utc_text(seconds: float) -> str:
    """A ``time.time()`` value as summaries record times: UTC, ISO 8601, whole seconds, with
    its ``+00:00`` offset (every summary's ``start_training_time``/``end_training_time``)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="seconds")


def check_fit_args(model: Any, num_iterations: Any, freq: Any) -> None:
    """Check a job's output name, ``num_iterations`` and ``metrics_compute_frequency``.

    Raises
    ------
    ArgumentError
        Naming the argument, the value received and what to pass instead.
    """
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


def warm_start_weights(reg: Registry, model: str, arch_id: int) -> Any:
    """The weights of the registered ``model`` to warm-start ``arch_id`` from.

    Raises
    ------
    TrainingError
        No such model.
    ModelMismatchError
        Its weights do not fit ``arch_id``.
    """
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


def runtime_settings() -> dict[str, Any]:
    """(Client side.) The runtime's settings every trainer job carries, read from dvml's
    configuration once per job: ``peer_timeout`` (``dvml.train.peer-timeout``),
    ``client_timeout`` (its ClientLease), ``threads`` (intra- and inter-op: None is the
    trainer's share of the host's cores, :func:`dvml.tf_runtime.thread_budget`) and
    ``standby`` (whether a standby trainer may take the job)."""
    return {
        "peer_timeout": config.get("train.peer-timeout"),
        "client_timeout": config.get("train.client-timeout"),
        "threads": [config.get("train.intra-op-threads"), config.get("train.inter-op-threads")],
        "standby": bool(config.get("train.standby-trainer")),
    }


def checkpoint_dir(*parts: str) -> str:
    """Where a job's checkpoints are kept on each worker, under dvml's state directory: one
    folder per job, named by ``parts`` joined with ``-`` (its output, its kind where the
    output's name does not say it, its key)."""
    return str(config.state_dir() / "checkpoints" / "-".join(parts))
