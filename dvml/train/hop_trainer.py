"""The model hopper trainer process: ONE per worker and ``fit_multiple`` job.

Run as ``python -m dvml.train.hop_trainer JOB.json`` by :mod:`dvml.train.hop_worker`. It
imports TensorFlow once, opens the worker's LOCAL partitions once (shared-memory views, as
``dvml.fit``'s trainers do), and then serves commands, one JSON line each on stdin:

- ``{"op": "train", "mst_key", "iteration", "state_in", "state_out"}``: load the model state
  (weights and optimizer variables) that arrived from the previous worker, train the
  configuration's ``epochs`` on the local rows with a plain Keras model (single process, no
  distribution strategy), and write the new state to ``state_out``;
- ``{"op": "eval", "mst_key", "state_in"}``: loss and metrics of that state on the local
  training (and validation) rows.

Each answer is one protocol line (``DVML {...}`` on stdout). The process exits when stdin
closes (its launcher or worker went away) and when its worker dies (``exit_with_parent``).
One compiled Keras model per configuration is kept across hops, so a hop costs only the
state's load and save, not a rebuild.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import evaluation_dataset, evaluation_steps, training_dataset
from dvml.train.orphan import exit_with_parent
from dvml.train.params import compile_kwargs

__all__ = ["main", "read_state", "write_state"]

PROTOCOL_PREFIX = "DVML "


def emit(kind: str, **payload: Any) -> None:
    print(PROTOCOL_PREFIX + json.dumps({"kind": kind, **payload}), flush=True)


def write_state(path: str, weights: list[np.ndarray], optimizer: list[np.ndarray]) -> None:
    """A model's state as one ``.npz``: the weight count, the weights, the optimizer's variables."""
    from dvml.registry.weights import weights_to_bytes

    blob = weights_to_bytes([np.array([len(weights)], dtype=np.int64), *weights, *optimizer])
    with open(path, "wb") as f:
        f.write(blob)


def read_state(blob: bytes) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The weights and optimizer variables of a state written by :func:`write_state`."""
    from dvml.registry.weights import weights_from_bytes

    arrays = weights_from_bytes(blob)
    n = int(arrays[0][0])
    return list(arrays[1 : 1 + n]), list(arrays[1 + n :])


class _Models:
    """One compiled Keras model per configuration, built on first use."""

    def __init__(self, job: dict[str, Any], keras: Any) -> None:
        from dvml.registry.custom import custom_objects_from_sources

        self.job, self.keras = job, keras
        self.custom = custom_objects_from_sources(job.get("custom_objects", {}))
        self.models: dict[int, Any] = {}

    def get(self, mst_key: int) -> Any:
        if mst_key not in self.models:
            config = self.job["configs"][str(mst_key)]
            tf = tf_runtime.tensorflow()
            tf.random.set_seed(int(self.job["seed"]) + mst_key)
            model = tf_runtime.build_model(config["model_json"], None, self.custom)
            model.compile(**compile_kwargs(config["compile_params"], self.custom))
            # Build the optimizer's variables now, so that a state that arrives with them
            # can be assigned before the first step.
            model.optimizer.build(model.trainable_variables)
            self.models[mst_key] = model
        return self.models[mst_key]


def _optimizer_variables(model: Any) -> list[Any]:
    variables = model.optimizer.variables
    return list(variables() if callable(variables) else variables)


def _load(model: Any, path: str) -> None:
    with open(path, "rb") as f:
        weights, optimizer = read_state(f.read())
    if weights:  # none: the first hop keeps the model's own seeded initialisation
        model.set_weights(weights)
    variables = _optimizer_variables(model)
    if optimizer:  # a fresh state (first hop, warm start) has none: a new optimizer
        if len(optimizer) != len(variables):
            from dvml.exceptions import TrainingError

            raise TrainingError(
                f"The optimizer state that arrived has {len(optimizer)} variables, the "
                f"optimizer here {len(variables)}. Received a state written by another "
                "optimizer; run fit_multiple again without resume."
            )
        for variable, value in zip(variables, optimizer, strict=True):
            variable.assign(value)
    else:
        for variable in variables:
            variable.assign(np.zeros(variable.shape, variable.dtype.as_numpy_dtype))


def _save(model: Any, path: str) -> None:
    optimizer = [np.asarray(v.numpy()) for v in _optimizer_variables(model)]
    write_state(path, model.get_weights(), optimizer)


def _metrics(model: Any, parts: Any, batch_size: int) -> dict[str, Any]:
    steps = evaluation_steps(parts, batch_size)  # compile_params may run several per call
    data = evaluation_dataset(parts, batch_size)
    result = model.evaluate(data, steps=steps, verbose=0, return_dict=True)
    return {"rows": parts.rows, "values": {k: float(v) for k, v in result.items()}}


def serve(job: dict[str, Any]) -> None:
    tf_runtime.start()
    keras = tf_runtime.keras()
    train = open_local(job["training"])
    valid = open_local(job["validation"], require=False) if job.get("validation") else None
    models = _Models(job, keras)
    emit("ready", rows=train.rows, validation_rows=valid.rows if valid else 0)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["op"] == "train":
                emit("done", **_train(job, models, train, command))
            elif command["op"] == "eval":
                emit("done", **_evaluate(job, models, train, valid, command))
        except Exception as exc:
            emit("error", type=type(exc).__name__, message=str(exc))


def _train(job: dict[str, Any], models: _Models, train: Any, command: dict[str, Any]) -> Any:
    key = int(command["mst_key"])
    config = job["configs"][str(key)]
    model = models.get(key)
    t0 = time.perf_counter()
    _load(model, command["state_in"])
    loaded = time.perf_counter()
    fit_params = config["fit_params"]
    batch = min(int(fit_params.get("batch_size", 32)), train.rows)
    steps = max(1, train.rows // batch)
    # A new shuffle per model, iteration and worker.
    seed = int(job["seed"]) + 7919 * int(command["iteration"]) + 104729 * key
    seed += int(job["worker_index"])
    data = training_dataset(train, batch, steps, seed, shuffle=fit_params.get("shuffle", True))
    kwargs = {
        k: v for k, v in fit_params.items() if k not in ("batch_size", "shuffle", "steps_per_epoch")
    }
    kwargs.setdefault("epochs", 1)
    history = model.fit(data, steps_per_epoch=steps, verbose=0, **kwargs)
    trained = time.perf_counter()
    _save(model, command["state_out"])
    saved = time.perf_counter()
    return {
        "op": "train",
        "fit_loss": float(history.history["loss"][-1]),
        "train_s": trained - loaded,
        "load_s": loaded - t0,
        "save_s": saved - trained,
        "steps": steps,
        "rows": train.rows,
    }


def _evaluate(
    job: dict[str, Any], models: _Models, train: Any, valid: Any, command: dict[str, Any]
) -> Any:
    key = int(command["mst_key"])
    model = models.get(key)
    _load(model, command["state_in"])
    batch = int(job["configs"][str(key)]["fit_params"].get("batch_size", 32))
    out: dict[str, Any] = {"op": "eval", "training": _metrics(model, train, batch)}
    if valid is not None and valid.rows:
        out["validation"] = _metrics(model, valid, batch)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m dvml.train.hop_trainer JOB.json", file=sys.stderr)
        return 2
    exit_with_parent()
    with open(argv[0]) as f:
        job = json.load(f)
    try:
        serve(job)
    except Exception as exc:
        emit("error", type=type(exc).__name__, message=str(exc), fatal=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
