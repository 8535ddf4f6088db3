"""The serving program of a trainer process: train or evaluate any model it is sent.

Run inside ``python -m dvml.train.runtime.trainer`` for a job whose ``program`` is
``"serve"`` (:mod:`dvml.train.runtime.sessions` starts it, one per worker and job). It
imports TensorFlow once, opens the worker's LOCAL partitions once (shared-memory views), and
then serves commands (:mod:`dvml.train.runtime.protocol`), one line each on stdin:

- :class:`~dvml.train.runtime.protocol.Train`: load the model state that arrived (weights and
  optimizer variables), train the model's ``epochs`` on the local rows with a plain Keras model
  (single process, no distribution strategy), write the new state; answer
  :class:`~dvml.train.runtime.protocol.Trained`, with the digest of the weights it started
  from (what a parked model resumed from);
- :class:`~dvml.train.runtime.protocol.Evaluate`: loss and metrics of a state on the local
  training (and validation) rows;
- :class:`~dvml.train.runtime.protocol.Score` and :class:`~dvml.train.runtime.protocol.Predict`:
  ``dvml.evaluate`` and ``dvml.predict`` of a registered model
  (:mod:`dvml.train.runtime.served`), so that no Dask worker imports TensorFlow. An *inference
  session* (a job without ``training``) serves only these two.

A command for a model the trainer has not seen brings its configuration, so models join a
running job. One compiled Keras model per model key is kept across commands, so a command costs
only the state's load and save, not a rebuild. The process exits when stdin closes.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.exceptions import TrainingError
from dvml.resolve.batches import steps_covering
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import training_dataset
from dvml.train.runtime import memory_sample
from dvml.train.runtime.augment import decode as decode_augment
from dvml.train.runtime.local_model import compile_model, fit_callbacks, fit_kwargs, local_metrics
from dvml.train.runtime.model_state import read_state, weights_digest, write_state
from dvml.train.runtime.protocol import (
    Evaluate,
    Evaluated,
    Failed,
    Predict,
    Ready,
    Score,
    Train,
    Trained,
    emit,
    parse,
)
from dvml.train.runtime.seeds import shuffle_seed
from dvml.train.runtime.served import ServedModels

__all__ = ["Models", "load_state", "optimizer_variables", "save_state", "serve"]


class Models:
    """One compiled Keras model per model key, built on first use from its configuration."""

    def __init__(self, job: dict[str, Any]) -> None:
        from dvml.registry.custom import custom_objects_from_sources

        self.job = job
        self.custom = custom_objects_from_sources(job.get("custom_objects", {}))
        self.configs: dict[int, dict[str, Any]] = {
            int(k): v for k, v in job.get("configs", {}).items()
        }
        self.models: dict[int, Any] = {}

    def add(self, mst_key: int, config: dict[str, Any] | None) -> None:
        """Learn model ``mst_key``'s configuration (model JSON, parsed params)."""
        if config is not None:
            self.configs[mst_key] = config

    def config(self, mst_key: int) -> dict[str, Any]:
        if mst_key not in self.configs:
            raise TrainingError(
                f"No configuration for model {mst_key} reached this trainer. Received models "
                f"{sorted(self.configs)}. The first command for a model must bring its config."
            )
        return self.configs[mst_key]

    def get(self, mst_key: int) -> Any:
        if mst_key not in self.models:
            config = self.config(mst_key)
            # tf-keras draws an unseeded initializer's seed from Python's `random`: seeding TF
            # alone gave each run its own initial weights, so a model that a rerun starts
            # afresh did not start where the interrupted run's did. set_random_seed seeds
            # Python, NumPy and TF.
            seed = shuffle_seed(int(self.job["seed"]), model=mst_key)
            tf_runtime.keras().utils.set_random_seed(seed)
            model = tf_runtime.build_model(config["model_json"], None, self.custom)
            compile_model(model, config["compile_params"], self.custom)
            # Build the optimizer's variables now, so that a state that arrives with them
            # can be assigned before the first step.
            model.optimizer.build(model.trainable_variables)
            self.models[mst_key] = model
        return self.models[mst_key]


def optimizer_variables(model: Any) -> list[Any]:
    """The optimizer's variables of a compiled tf-keras model."""
    variables = model.optimizer.variables
    return list(variables() if callable(variables) else variables)


def load_state(model: Any, path: str) -> str:
    """Load a state into ``model``; returns the digest of the weights it now starts from."""
    with open(path, "rb") as f:
        weights, optimizer = read_state(f.read())
    if weights:  # none: a new model keeps its own seeded initialisation
        model.set_weights(weights)
    variables = optimizer_variables(model)
    if optimizer:  # a fresh state (a new model, warm start) has none: a new optimizer
        if len(optimizer) != len(variables):
            raise TrainingError(
                f"The optimizer state that arrived has {len(optimizer)} variables, the "
                f"optimizer here {len(variables)}. Received a state written by another "
                "optimizer; run the job again without resume."
            )
        for variable, value in zip(variables, optimizer, strict=True):
            variable.assign(value)
    else:
        for variable in variables:
            variable.assign(np.zeros(variable.shape, variable.dtype.as_numpy_dtype))
    return weights_digest(model.get_weights())


def save_state(model: Any, path: str) -> None:
    """Write ``model``'s weights and optimizer variables to ``path``."""
    optimizer = [np.asarray(v.numpy()) for v in optimizer_variables(model)]
    write_state(path, model.get_weights(), optimizer)


def serve(job: dict[str, Any]) -> None:
    """Answer commands on stdin until it closes (a job without ``training``: an inference
    session, which opens no partitions up front)."""
    tf_runtime.start()
    train = open_local(job["training"]) if job.get("training") else None
    valid = open_local(job["validation"], require=False) if job.get("validation") else None
    models = Models(job)
    augment = decode_augment(job.get("augment"))
    served = ServedModels()
    emit(Ready(rows=train.rows if train else 0, validation_rows=valid.rows if valid else 0))
    for text in sys.stdin:
        try:
            command = parse(text.rstrip("\n"))
            if isinstance(command, Score):
                emit(served.score(command))
            elif isinstance(command, Predict):
                emit(served.predict(command))
            elif isinstance(command, Train) and train is not None:
                emit(_train(job, models, train, command, augment))
            elif isinstance(command, Evaluate) and train is not None:
                emit(_evaluate(models, train, valid, command))
            else:
                raise TrainingError(f"Not a command for this serving trainer: {text[:200]!r}.")
        except Exception as exc:
            emit(Failed(type=type(exc).__name__, message=str(exc)))


def _train(
    job: dict[str, Any], models: Models, train: Any, command: Train, augment: Any
) -> Trained:
    key = command.mst_key
    models.add(key, command.config)
    fit_params = models.config(key)["fit_params"]
    model = models.get(key)
    t0 = time.perf_counter()
    loaded_from = load_state(model, command.state_in)
    loaded = time.perf_counter()
    batch = min(int(fit_params.get("batch_size", 32)), train.rows)
    # A hop trains every row of the partition once per epoch, the last batch short (MADlib's
    # fit on a segment's rows): nothing makes it stop at another trainer's step.
    steps = steps_covering(train.rows, batch)
    # A new shuffle per model, iteration and worker.
    seed = shuffle_seed(
        int(job["seed"]), iteration=command.iteration, model=key, worker=int(job["worker_index"])
    )
    shuffle = fit_params.get("shuffle", True)
    data = training_dataset(train, batch, steps, seed, shuffle=shuffle, augment=augment)
    # fit_params' own callbacks (MADlib's TensorBoard), one directory per model and worker
    callbacks = fit_callbacks(
        tf_runtime.keras(), fit_params, f"mst_key_{key}", f"worker_{job['worker_index']}"
    ) if fit_params.get("callbacks") else None  # fmt: skip
    history = model.fit(data, steps_per_epoch=steps, callbacks=callbacks, **fit_kwargs(fit_params))
    trained = time.perf_counter()
    save_state(model, command.state_out)
    return Trained(
        mst_key=key,
        iteration=command.iteration,
        fit_loss=float(history.history["loss"][-1]),
        train_s=trained - loaded,
        load_s=loaded - t0,
        save_s=time.perf_counter() - trained,
        steps=steps,
        rows=train.rows,
        loaded_sha256=loaded_from,
        resident_bytes=memory_sample.sample(),  # after the state's save: the hop's peak
        zygote_bytes=memory_sample.zygote_bytes(),
    )


def _evaluate(models: Models, train: Any, valid: Any, command: Evaluate) -> Evaluated:
    key = command.mst_key
    models.add(key, command.config)
    model = models.get(key)
    load_state(model, command.state_in)
    batch = int(models.config(key)["fit_params"].get("batch_size", 32))
    validation = local_metrics(model, valid, batch) if valid is not None and valid.rows else None
    return Evaluated(
        mst_key=key, training=local_metrics(model, train, batch), validation=validation
    )
