"""The synchronous program of a trainer process: one model, every trainer in lock-step.

Run inside ``python -m dvml.train.runtime.trainer`` for a job whose ``program`` is ``"fit"``
(:mod:`dvml.train.runtime.launch` starts one per worker that holds data). It joins the other
trainers through ``TF_CONFIG`` in a MultiWorkerMirroredStrategy (tf-keras), reads ONLY its
local partitions from shared memory, and runs ``num_iterations`` iterations of ``model.fit``.
After an iteration it evaluates the current weights on its local training (and validation)
rows and sends one :class:`~dvml.train.runtime.protocol.Iteration` message; the scheduler
aggregates those over trainers. Every trainer checkpoints its weights after each iteration
(they are identical on all trainers) in the job's :class:`CheckpointStore`, so a rerun
resumes from the last iteration every trainer completed.

Sync modes: ``"step"``, the strategy all-reduces gradients every step; ``"iteration"`` and an
int ``k``, the model lives OUTSIDE the strategy's scope and trains on local rows only, and the
strategy's collective context averages the weights (:mod:`dvml.train.runtime.averaging`).
With ``"step"`` each trainer times its wait in the step's all-reduce
(:mod:`dvml.train.runtime.collective_wait`: the straggler rule's figure) and, when an elastic
fit split the global batch unequally, weighs its rows ``row_weight`` (dvml.resolve.batches).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

from dvml import tf_runtime
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import training_dataset
from dvml.train.runtime import memory_sample
from dvml.train.runtime.augment import decode as decode_augment
from dvml.train.runtime.checkpoints import CheckpointStore
from dvml.train.runtime.local_model import (
    build_model,
    compile_model,
    fit_callbacks,
    fit_kwargs,
    local_metrics,
)
from dvml.train.runtime.protocol import Finished, Iteration, Resolved, emit
from dvml.train.runtime.seeds import data_position, shuffle_seed
from dvml.train.runtime.startup import Startup

__all__ = ["run", "save_iteration"]


@dataclasses.dataclass
class _Setup:
    """What a synchronous trainer built before its first iteration."""

    model: Any
    evaluator: Any  # a plain model with the same weights: metrics on LOCAL rows only
    averager: Any  # None with sync="step"
    every_k: Any  # the averaging callback with sync=k
    data: Callable[[int], Any]  # iteration -> what model.fit reads in it (data_position)
    callbacks: list[Any]
    augment: Any  # x -> x on each training batch, or None (dvml.train.runtime.augment)
    timer: Any = None  # sync="step": its wait in the all-reduce (train.runtime.collective_wait)


def run(job: dict[str, Any], startup: Startup) -> None:
    """Train the job's model for its iterations, then report its final weights."""
    # Threads from the launcher's budget (in the environment), devices as the launcher left
    # them visible: see dvml.tf_runtime.start.
    tf = tf_runtime.start()
    keras = tf_runtime.keras()
    startup.mark("runtime_start")
    tf.random.set_seed(job["seed"])
    # 0 (the default) means no per-collective timeout: see dvml.yaml, train.peer-timeout.
    communication = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=float(job["peer_timeout"]) or None
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    startup.mark("strategy")
    train = open_local(job["training"])
    valid = open_local(job["validation"], require=False) if job.get("validation") else None
    startup.mark("open_partitions")
    emit(
        Resolved(
            rows=train.rows,
            buffers=list(train.buffer_indices),
            instance_id=train.instance_id,
            validation_rows=valid.rows if valid else 0,
        )
    )
    setup = _build(job, keras, strategy, train, startup)
    final = _iterations(job, setup, train, valid)
    from dvml.registry.weights import weights_to_bytes

    blob = weights_to_bytes(final)
    with open(job["output_weights_path"], "wb") as f:
        f.write(blob)
    emit(
        Finished(
            weights_path=job["output_weights_path"],
            weights_sha256=hashlib.sha256(blob).hexdigest(),
            local_rows=train.rows,
        )
    )
    train.close()
    if valid is not None:
        valid.close()


def _build(job: dict[str, Any], keras: Any, strategy: Any, train: Any, startup: Startup) -> _Setup:
    """The model (in the strategy's scope for sync="step"), its evaluator and callbacks."""
    from dvml.registry.custom import custom_objects_from_sources

    custom = custom_objects_from_sources(job.get("custom_objects", {}))
    per_worker_batch, steps = int(job["per_worker_batch"]), int(job["steps_per_epoch"])
    sync = job.get("sync", "step")
    averager = every_k = None
    if sync == "step":
        from dvml.train.runtime.step_collectives import local_step_metrics, steps_per_execution

        # One all-reduce per step (the gradients), several steps per call of the train
        # function: see dvml.train.runtime.step_collectives.
        with strategy.scope():
            model = build_model(job["model_json"], job.get("weights_path"), custom)
            compile_model(model, job["compile_params"], custom, steps_per_execution(steps))
            local_step_metrics(model, tf_runtime.tensorflow())
    else:
        from dvml.train.runtime.averaging import Averager

        model = build_model(job["model_json"], job.get("weights_path"), custom)
        compile_model(model, job["compile_params"], custom)
        averager = Averager(strategy, train.rows)
        # Same start everywhere (MultiWorkerMirroredStrategy would do it inside its scope).
        averager.broadcast(model, chief=int(job["tf_config"]["task"]["index"]) == 0)
    evaluator = build_model(job["model_json"], None, custom)
    compile_model(evaluator, job["compile_params"], custom)
    startup.mark("build_model")
    callbacks = [startup.first_step_callback(keras)]
    if job.get("tensorboard_dir"):
        log_dir = os.path.join(job["tensorboard_dir"], job["worker_name"])
        callbacks.append(keras.callbacks.TensorBoard(log_dir=log_dir))
    # fit_params' own callbacks (MADlib's TensorBoard), one directory per trainer
    callbacks += fit_callbacks(keras, job["fit_params"], job["worker_name"])
    if isinstance(sync, int) and averager is not None:
        from dvml.train.runtime.averaging import averaging_callback

        every_k = averaging_callback(keras, averager, sync)
        callbacks.append(every_k)

    augment = decode_augment(job.get("augment"))
    shuffle = job["fit_params"].get("shuffle", True)
    epochs = int(fit_kwargs(job["fit_params"])["epochs"])
    task = int(job["tf_config"]["task"]["index"])

    def data(iteration: int) -> Any:
        """The data of ``iteration``: its epochs continue where the previous one stopped."""
        if averager is not None:  # a new shuffle each iteration, on the local rows only
            seed = shuffle_seed(job["seed"], iteration=iteration, worker=task)
            return training_dataset(train, per_worker_batch, steps, seed, shuffle, augment)
        first = data_position(iteration, epochs)["epoch"]

        def dataset_fn(context: Any) -> Any:  # called by each model.fit: one per iteration
            seed = shuffle_seed(job["seed"], worker=context.input_pipeline_id)
            weight = job.get("row_weight")  # unequal local batches (dvml.resolve.batches)
            return training_dataset(train, per_worker_batch, steps, seed, shuffle, augment,
                                    first_epoch=first, row_weight=weight)  # fmt: skip

        return keras.utils.experimental.DatasetCreator(dataset_fn)

    timer = None
    if sync == "step":  # outside the scope: its variable is this trainer's own
        from dvml.train.runtime.collective_wait import time_collective

        timer = time_collective(model, tf_runtime.tensorflow())
        callbacks.append(timer.steady_callback(keras))
    return _Setup(model, evaluator, averager, every_k, data, callbacks, augment, timer)


def _iterations(job: dict[str, Any], setup: _Setup, train: Any, valid: Any) -> list[Any]:
    """Run the job's iterations (reporting and checkpointing each); the final weights."""
    per_worker_batch, steps = int(job["per_worker_batch"]), int(job["steps_per_epoch"])
    store = CheckpointStore(job["checkpoint_dir"]) if job.get("checkpoint_dir") else None
    kwargs = fit_kwargs(job["fit_params"])
    history: list[dict[str, Any]] = list(job.get("history", []))
    started = time.monotonic()
    first, last = int(job["start_iteration"]), int(job["num_iterations"])
    freq = int(job["metrics_compute_frequency"])
    averager = setup.averager
    for iteration in range(first, last + 1):
        t0 = time.monotonic()
        averaged = (averager.count, averager.seconds) if averager is not None else (0, 0.0)
        waited = setup.timer.seconds() if setup.timer is not None else 0.0
        data = setup.data(iteration)
        fitted = setup.model.fit(data, steps_per_epoch=steps, callbacks=setup.callbacks, **kwargs)
        if setup.every_k is not None:
            setup.every_k.flush(setup.model)
        elif averager is not None:
            averager.average(setup.model)  # MADlib: every trainer starts the next from the mean
        weights = setup.model.get_weights()
        record: dict[str, Any] = {
            "iteration": iteration,
            "fit_seconds": time.monotonic() - t0,
            "elapsed": time.monotonic() - started,
            "fit_loss": float(fitted.history["loss"][-1]),
            "sync": job.get("sync", "step"),
            "steps": steps * len(fitted.history["loss"]),  # every epoch of the iteration
            # the rows this trainer trained per epoch: all it holds where its steps cover
            # them (sync="iteration"), the full batches' otherwise (dvml.resolve.batches)
            "rows": min(train.rows, steps * per_worker_batch),
        }
        if setup.timer is not None:  # sync="step": the steps' wait in the all-reduce
            record["averaging_seconds"] = setup.timer.seconds() - waited
            record["batch"] = per_worker_batch
            record["steady"] = setup.timer.steady()  # the stretch the straggler rule reads
        if averager is not None:
            record["averages"] = averager.count - averaged[0]
            record["averaging_seconds"] = averager.seconds - averaged[1]
        if iteration % freq == 0 or iteration == last:
            t1 = time.monotonic()
            setup.evaluator.set_weights(weights)
            record["training"] = local_metrics(setup.evaluator, train, per_worker_batch)
            if valid is not None and valid.rows:
                record["validation"] = local_metrics(setup.evaluator, valid, per_worker_batch)
            record["metrics_seconds"] = time.monotonic() - t1
        record["resident_bytes"] = memory_sample.sample()  # after evaluation: its peak
        record["zygote_bytes"] = memory_sample.zygote_bytes()
        history.append(record)
        if store is not None:
            save_iteration(store, job, iteration, weights, history)
        emit(Iteration(**record))
    return list(setup.model.get_weights())


def save_iteration(
    store: CheckpointStore,
    job: dict[str, Any],
    iteration: int,
    weights: list[Any],
    history: list[dict[str, Any]],
) -> None:
    """Checkpoint this trainer after ``iteration``: its weights, the history so far and the
    data position the next iteration starts at (its first epoch), under the job's key."""
    from dvml.registry.weights import weights_to_bytes

    epochs = int(fit_kwargs(job["fit_params"])["epochs"])
    meta = {"job_key": job["job_key"], "iteration": iteration, "history": history,
            "data_position": data_position(iteration + 1, epochs)}  # fmt: skip
    store.save(job["worker_name"], weights_to_bytes(weights), meta)
