"""The trainer process: one per worker that holds data, run as ``python -m dvml.train.trainer``.

It reads a job file, joins the other trainers through ``TF_CONFIG`` in a
MultiWorkerMirroredStrategy (tf-keras), reads ONLY its local partitions from shared memory,
and runs ``num_iterations`` iterations of ``model.fit``. After an iteration it evaluates the
current weights on its local training (and validation) rows and prints one progress line;
the launcher aggregates those over workers. Every trainer checkpoints its weights after each
iteration (they are identical on all trainers), so a rerun resumes from the last iteration
every trainer completed. The process exits when done, so GPU memory is released after every
job.

Lines on stdout that start with ``DVML `` are the protocol to the launcher; everything else is
TensorFlow's chatter.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

PROTOCOL_PREFIX = "DVML "


def emit(kind: str, **payload: Any) -> None:
    """Print one protocol line for the launcher."""
    print(PROTOCOL_PREFIX + json.dumps({"kind": kind, **payload}), flush=True)


def _keras() -> Any:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras

    return tf_keras


def build_model(keras: Any, job: dict[str, Any], custom_objects: dict[str, Any]) -> Any:
    """The model from its JSON (layers' ``trainable`` flags are part of the JSON)."""
    model = keras.models.model_from_json(job["model_json"], custom_objects=custom_objects)
    if job.get("weights_path"):
        from dvml.registry.weights import weights_from_bytes

        with open(job["weights_path"], "rb") as f:
            model.set_weights(weights_from_bytes(f.read()))
    return model


def compile_model(model: Any, job: dict[str, Any], custom_objects: dict[str, Any]) -> None:
    from dvml.train.params import compile_kwargs

    model.compile(**compile_kwargs(job["compile_params"], custom_objects))


def custom_objects_from_sources(sources: dict[str, str]) -> dict[str, Any]:
    """Compile the custom losses and metrics the launcher read from the registry."""
    _keras()  # TF_USE_LEGACY_KERAS=1 before TensorFlow loads: tf.keras is tf-keras
    import tensorflow as tf

    from dvml.registry.custom import compile_function

    return {
        name: compile_function(name, src, {"tf": tf, "np": np}) for name, src in sources.items()
    }


def local_metrics(model: Any, parts: Any, batch_size: int) -> dict[str, Any]:
    """Loss and metrics of ``model`` on every local row (aggregated over workers later)."""
    from dvml.resolve.tfdata import evaluation_dataset

    result = model.evaluate(evaluation_dataset(parts, batch_size), verbose=0, return_dict=True)
    return {"rows": parts.rows, "values": {k: float(v) for k, v in result.items()}}


def _checkpoint_path(job: dict[str, Any]) -> str | None:
    directory = job.get("checkpoint_dir")
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{job['worker_name']}.npz")


def save_checkpoint(
    job: dict[str, Any], iteration: int, weights: list[np.ndarray], history: list[dict[str, Any]]
) -> None:
    """Write this trainer's weights after ``iteration`` (atomically: tmp file + rename)."""
    from dvml.registry.weights import weights_to_bytes

    path = _checkpoint_path(job)
    if path is None:
        return
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(weights_to_bytes(weights))
    with open(path + ".json.tmp", "w") as f:
        json.dump({"iteration": iteration, "history": history, "job_id": job["job_key"]}, f)
    os.replace(tmp, path)
    os.replace(path + ".json.tmp", path + ".json")


def run(job: dict[str, Any]) -> None:
    import tensorflow as tf

    keras = _keras()
    from dvml.resolve.local import open_local
    from dvml.resolve.tfdata import training_dataset

    tf.random.set_seed(job["seed"])
    custom_objects = custom_objects_from_sources(job.get("custom_objects", {}))
    # 0 (the default) means no per-collective timeout: see dvml.yaml, train.peer-timeout.
    communication = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=float(job["peer_timeout"]) or None
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)

    train = open_local(job["training"])
    valid = open_local(job["validation"], require=False) if job.get("validation") else None
    emit(
        "resolved",
        rows=train.rows,
        buffers=train.buffer_indices,
        instance_id=train.instance_id,
        validation_rows=valid.rows if valid else 0,
    )

    per_worker_batch = int(job["per_worker_batch"])
    steps = int(job["steps_per_epoch"])

    def dataset_fn(context: Any) -> Any:
        return training_dataset(
            train,
            per_worker_batch,
            steps,
            job["seed"] + context.input_pipeline_id,
            shuffle=job["fit_params"].get("shuffle", True),
        )

    with strategy.scope():
        model = build_model(keras, job, custom_objects)
        compile_model(model, job, custom_objects)
    # A plain model with the same weights evaluates on LOCAL rows only (no collectives).
    evaluator = build_model(keras, {**job, "weights_path": None}, custom_objects)
    compile_model(evaluator, job, custom_objects)

    callbacks = []
    if job.get("tensorboard_dir"):
        log_dir = os.path.join(job["tensorboard_dir"], job["worker_name"])
        callbacks.append(keras.callbacks.TensorBoard(log_dir=log_dir))
    creator = keras.utils.experimental.DatasetCreator(dataset_fn)
    fit_kwargs = {
        k: v
        for k, v in job["fit_params"].items()
        if k not in ("batch_size", "shuffle", "steps_per_epoch")
    }
    fit_kwargs.setdefault("epochs", 1)
    fit_kwargs["verbose"] = 0

    history: list[dict[str, Any]] = list(job.get("history", []))
    started = time.monotonic()
    first, last = int(job["start_iteration"]), int(job["num_iterations"])
    freq = int(job["metrics_compute_frequency"])
    for iteration in range(first, last + 1):
        t0 = time.monotonic()
        fit_history = model.fit(creator, steps_per_epoch=steps, callbacks=callbacks, **fit_kwargs)
        weights = model.get_weights()
        record: dict[str, Any] = {
            "iteration": iteration,
            "fit_seconds": time.monotonic() - t0,
            "elapsed": time.monotonic() - started,
            "fit_loss": float(fit_history.history["loss"][-1]),
        }
        if iteration % freq == 0 or iteration == last:
            evaluator.set_weights(weights)
            record["training"] = local_metrics(evaluator, train, per_worker_batch)
            if valid is not None and valid.rows:
                record["validation"] = local_metrics(evaluator, valid, per_worker_batch)
        history.append(record)
        save_checkpoint(job, iteration, weights, history)
        emit("iteration", **record)

    from dvml.registry.weights import weights_to_bytes

    blob = weights_to_bytes(model.get_weights())
    with open(job["output_weights_path"], "wb") as f:
        f.write(blob)
    import hashlib

    emit(
        "done",
        weights_path=job["output_weights_path"],
        weights_sha256=hashlib.sha256(blob).hexdigest(),
        local_rows=train.rows,
    )
    train.close()
    if valid is not None:
        valid.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m dvml.train.trainer JOB.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        job = json.load(f)
    from dvml.train.orphan import exit_with_parent

    exit_with_parent()  # never outlive the worker that started this trainer
    try:
        run(job)
    except Exception as exc:
        emit("error", type=type(exc).__name__, message=str(exc))
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
