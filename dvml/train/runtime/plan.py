"""What every training job decides before a trainer starts: trainers, rows, seeds, job keys.

The one planner of where a job trains: the live workers that hold the training set (one
trainer each), checked against the validation set and the GPUs asked for; the rows each one
holds; and the one seed function (:func:`shuffle_seed`) every trainer derives its shuffles and
initialisations from. Schedulers (``fit``, ``fit_multiple``, model search) call these; nothing
here starts a process.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import (
    ArgumentError,
    ModelMismatchError,
    PlacementError,
    RegistryNotFoundError,
    TrainingError,
)
from dvml.names import check_name
from dvml.store.datasets import Dataset, buffer_workers

if TYPE_CHECKING:
    from distributed import Client

    from dvml.registry.database import Registry

__all__ = [
    "check_fit_args",
    "job_key",
    "machine",
    "now",
    "rows_per_worker",
    "shuffle_seed",
    "trainer_workers",
    "training_workers",
    "warm_start_weights",
    "weight_shapes",
]


def shuffle_seed(seed: int, *, iteration: int = 0, model: int = 0, worker: int = 0) -> int:
    """The seed of one shuffle (or initialisation): of ``model`` on ``worker`` in ``iteration``.

    Independent streams for every combination, from the job's ``seed``
    (:class:`numpy.random.SeedSequence`, as :func:`dvml.placement.planner.partition_seed` does
    for the partitions), so no two trainers or models shuffle alike.
    """
    spawn_key = (int(iteration), int(model), int(worker))
    return int(np.random.SeedSequence(int(seed), spawn_key=spawn_key).generate_state(1)[0])


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


def job_key(*parts: Any) -> str:
    """A short key that is the same for the same job (what a rerun resumes by)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def machine(worker: WorkerInfo) -> str:
    """The network host of a worker's address (``tcp://10.0.0.5:4242`` -> ``10.0.0.5``)."""
    return worker.address.split("://")[-1].rsplit(":", 1)[0]


def now() -> str:
    """The time now (UTC, ISO 8601, seconds), as summaries record it."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


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
