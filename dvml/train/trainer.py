"""The trainer process: one per worker that holds data, run as ``python -m dvml.train.trainer``.

It reads a job file, joins the other trainers through ``TF_CONFIG`` in a
MultiWorkerMirroredStrategy (tf-keras), reads ONLY its local partitions from shared memory,
and runs ``num_iterations`` iterations of ``model.fit``. After an iteration it evaluates the
current weights on its local training (and validation) rows and prints one progress line;
the launcher aggregates those over workers. Every trainer checkpoints its weights after each
iteration (they are identical on all trainers), so a rerun resumes from the last iteration
every trainer completed. The process exits when done, so GPU memory is released after every
job.

A trainer is started fresh (``python -m dvml.train.trainer JOB.json``) or as a *standby*
(``python -m dvml.train.trainer --standby``): a standby imports TensorFlow and tf-keras at
once, without starting TensorFlow's runtime, and then waits on stdin for one job line
(``{"job_path", "env", "cwd"}``). ``TF_CONFIG``, the thread budget and device visibility are
still open then, so they are set per job; the standby runs that one job and exits like a fresh
trainer. It exits without running anything when stdin closes (its worker went away).

Start-up is timed: the ``startup`` protocol line says where the seconds before the first step
went (process start, imports, runtime start, strategy, partitions, model, first step).

Lines on stdout that start with ``DVML `` are the protocol to the launcher; everything else is
TensorFlow's chatter.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

import numpy as np

from dvml import tf_runtime
from dvml.cluster.state import private_dir
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import evaluation_dataset, evaluation_steps, training_dataset
from dvml.train.orphan import exit_with_parent
from dvml.train.params import compile_kwargs

# dvml.registry.* is imported where it is used: the registry package loads pandas, SQLAlchemy
# and dask.config, which a trainer process does not need to start training.

_MODULE_START = time.time()  # wall clock: the launcher's time stamps are from another process

PROTOCOL_PREFIX = "DVML "


def emit(kind: str, **payload: Any) -> None:
    """Print one protocol line for the launcher."""
    print(PROTOCOL_PREFIX + json.dumps({"kind": kind, **payload}), flush=True)


class Startup:
    """Seconds between the steps of a trainer's start, emitted as one ``startup`` line.

    ``launched_at`` is the launcher's wall-clock time when it started the process (or handed
    the job to a standby); each :meth:`mark` records the seconds since the previous one.
    """

    def __init__(self, launched_at: float | None, standby: dict[str, float] | None) -> None:
        self.launched_at = launched_at or _MODULE_START
        self.last = self.launched_at
        self.seconds: dict[str, float] = {}
        self.standby = standby

    def mark(self, step: str) -> None:
        now = time.time()
        self.seconds[step] = round(now - self.last, 4)
        self.last = now

    def emit(self) -> None:
        payload: dict[str, Any] = {
            "seconds": self.seconds,
            "total": round(self.last - self.launched_at, 4),
            "standby": self.standby is not None,
        }
        if self.standby is not None:  # paid while the standby waited, not by this job
            payload["standby_imports"] = self.standby
        emit("startup", **payload)

    def first_step_callback(self, keras: Any) -> Any:
        """A callback that marks the end of the first training step and emits the timings."""
        startup = self

        class FirstStep(keras.callbacks.Callback):
            done = False

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if not self.done:
                    self.done = True
                    startup.mark("first_step")
                    startup.emit()

        return FirstStep()


def build_model(keras: Any, job: dict[str, Any], custom_objects: dict[str, Any]) -> Any:
    """The model from its JSON (layers' ``trainable`` flags are part of the JSON)."""
    weights = None
    if job.get("weights_path"):
        from dvml.registry.weights import weights_from_bytes

        with open(job["weights_path"], "rb") as f:
            weights = weights_from_bytes(f.read())
    return tf_runtime.build_model(job["model_json"], weights, custom_objects)


def compile_model(
    model: Any,
    job: dict[str, Any],
    custom_objects: dict[str, Any],
    steps_per_execution: int | None = None,
) -> None:
    """Compile ``model`` with the job's arguments; ``steps_per_execution`` is a default that
    the user's ``compile_params`` override."""
    kwargs = compile_kwargs(job["compile_params"], custom_objects)
    if steps_per_execution is not None:
        kwargs.setdefault("steps_per_execution", steps_per_execution)
    model.compile(**kwargs)


def local_metrics(model: Any, parts: Any, batch_size: int) -> dict[str, Any]:
    """Loss and metrics of ``model`` on every local row (aggregated over workers later)."""
    steps = evaluation_steps(parts, batch_size)  # compile_params may run several per call
    data = evaluation_dataset(parts, batch_size)
    result = model.evaluate(data, steps=steps, verbose=0, return_dict=True)
    return {"rows": parts.rows, "values": {k: float(v) for k, v in result.items()}}


def _checkpoint_path(job: dict[str, Any]) -> str | None:
    directory = job.get("checkpoint_dir")
    if not directory:
        return None
    # Owner-only (0700 directories, 0600 files): weights are the model, and a rerun loads
    # them back, so nobody else may read or replace them.
    private_dir(directory, root=os.path.dirname(os.path.dirname(directory)))
    return os.path.join(directory, f"{job['worker_name']}.npz")


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def save_checkpoint(
    job: dict[str, Any], iteration: int, weights: list[np.ndarray], history: list[dict[str, Any]]
) -> None:
    """Write this trainer's weights after ``iteration`` (atomically: tmp file + rename)."""
    from dvml.registry.weights import weights_to_bytes

    path = _checkpoint_path(job)
    if path is None:
        return
    tmp = path + ".tmp"
    with open(tmp, "wb", opener=_private_opener) as f:
        f.write(weights_to_bytes(weights))
    with open(path + ".json.tmp", "w", opener=_private_opener) as f:
        json.dump({"iteration": iteration, "history": history, "job_id": job["job_key"]}, f)
    os.replace(tmp, path)
    os.replace(path + ".json.tmp", path + ".json")


def run(job: dict[str, Any], startup: Startup | None = None) -> None:
    startup = startup or Startup(job.get("launched_at"), None)
    # Threads from the launcher's budget (in the environment), devices as the launcher left
    # them visible: see dvml.tf_runtime.start.
    tf = tf_runtime.start()
    keras = tf_runtime.keras()
    startup.mark("runtime_start")
    tf.random.set_seed(job["seed"])
    from dvml.registry.custom import custom_objects_from_sources

    custom_objects = custom_objects_from_sources(job.get("custom_objects", {}))
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

    # "step": the strategy all-reduces gradients every step. "iteration" and an int k: the
    # model lives OUTSIDE the strategy's scope and trains on local rows only; the strategy
    # is kept for its collective context, which averages the weights (dvml.train.averaging).
    sync = job.get("sync", "step")
    averager = None
    if sync == "step":
        from dvml.train.step_collectives import local_step_metrics
        from dvml.train.step_collectives import steps_per_execution as execution_steps

        # One all-reduce per step (the gradients), several steps per call of the train
        # function: see dvml.train.step_collectives.
        with strategy.scope():
            model = build_model(keras, job, custom_objects)
            compile_model(model, job, custom_objects, execution_steps(steps))
            local_step_metrics(model, tf)
    else:
        from dvml.train.averaging import Averager

        model = build_model(keras, job, custom_objects)
        compile_model(model, job, custom_objects)
        averager = Averager(strategy, train.rows)
        # Same start everywhere (MultiWorkerMirroredStrategy would do it inside its scope).
        averager.broadcast(model, chief=int(job["tf_config"]["task"]["index"]) == 0)
    # A plain model with the same weights evaluates on LOCAL rows only (no collectives).
    evaluator = build_model(keras, {**job, "weights_path": None}, custom_objects)
    compile_model(evaluator, job, custom_objects)
    startup.mark("build_model")

    callbacks = [startup.first_step_callback(keras)]
    if job.get("tensorboard_dir"):
        log_dir = os.path.join(job["tensorboard_dir"], job["worker_name"])
        callbacks.append(keras.callbacks.TensorBoard(log_dir=log_dir))
    creator = keras.utils.experimental.DatasetCreator(dataset_fn)
    every_k = None
    if isinstance(sync, int) and averager is not None:
        from dvml.train.averaging import averaging_callback

        every_k = averaging_callback(keras, averager, sync)
        callbacks.append(every_k)
    task = int(job["tf_config"]["task"]["index"])

    def local_dataset(iteration: int) -> Any:
        # A new shuffle each iteration (a fresh iterator restarts the generator's epochs).
        return training_dataset(
            train,
            per_worker_batch,
            steps,
            job["seed"] + task + 7919 * iteration,
            shuffle=job["fit_params"].get("shuffle", True),
        )

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
        averaged = (averager.count, averager.seconds) if averager is not None else (0, 0.0)
        data = creator if averager is None else local_dataset(iteration)
        fit_history = model.fit(data, steps_per_epoch=steps, callbacks=callbacks, **fit_kwargs)
        if every_k is not None:
            every_k.flush(model)
        elif averager is not None:
            averager.average(model)  # MADlib: every trainer starts the next one from the mean
        weights = model.get_weights()
        record: dict[str, Any] = {
            "iteration": iteration,
            "fit_seconds": time.monotonic() - t0,
            "elapsed": time.monotonic() - started,
            "fit_loss": float(fit_history.history["loss"][-1]),
            "sync": sync,
        }
        if averager is not None:
            record["averages"] = averager.count - averaged[0]
            record["averaging_seconds"] = averager.seconds - averaged[1]
        if iteration % freq == 0 or iteration == last:
            t1 = time.monotonic()
            evaluator.set_weights(weights)
            record["training"] = local_metrics(evaluator, train, per_worker_batch)
            if valid is not None and valid.rows:
                record["validation"] = local_metrics(evaluator, valid, per_worker_batch)
            record["metrics_seconds"] = time.monotonic() - t1
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


# A standby imports at a lower CPU priority: it should take the cores only when nothing else
# (an evaluate, a pack, another fit's trainer) wants them. Only its import thread is niced
# (Linux nice values are per thread), so the job runs at the priority the trainer started with.
STANDBY_NICE = 10


def _standby_imports(imports: dict[str, float]) -> None:
    """(The standby's import thread.) Import what every job needs, at a lower priority."""
    imports["tid"] = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.nice(STANDBY_NICE)
    imports["nice"] = float(os.getpriority(os.PRIO_PROCESS, 0))  # this thread's
    imports.update(tf_runtime.preimport())
    t0 = time.perf_counter()
    # What every job reads with (this module imported dvml's resolvers already): vineyard,
    # the weights codec and the model averaging, imported while waiting.
    import vineyard  # noqa: F401

    import dvml.registry.weights
    import dvml.train.averaging  # noqa: F401

    imports["import_dvml"] = time.perf_counter() - t0
    imports["ready"] = time.time()


def _normal_priority(tid: int) -> bool:
    """Give a still-importing thread this thread's priority back (False: not permitted; an
    unprivileged process may not lower a nice value, so the import ends at +10)."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, 0))
    except OSError:
        return False
    return True


def _standby() -> tuple[dict[str, Any], dict[str, float]] | None:
    """Import TensorFlow (in a niced thread), and wait for one job line on stdin meanwhile.

    Returns None when stdin closes (the worker went away) before a job came.
    """
    imports: dict[str, float] = {}
    loader = threading.Thread(
        target=_standby_imports, args=(imports,), name="dvml-standby-imports", daemon=True
    )
    loader.start()
    line = sys.stdin.readline()
    came = time.time()
    if not line:
        if loader.is_alive():  # do not tear the interpreter down under a half-done import
            sys.stdout.flush()
            os._exit(0)
        return None
    message = json.loads(line)
    if loader.is_alive():  # the job came first: finish the import at the job's priority
        imports["reniced"] = float(_normal_priority(int(imports.get("tid", 0))))
    loader.join()
    imports.pop("tid", None)
    if "ready" not in imports:  # the import failed in its thread: let the job's import say why
        imports.update(tf_runtime.preimport())
        imports["ready"] = time.time()
    # Before TensorFlow's runtime starts: TF_CONFIG, thread budget, visible devices.
    os.environ.update(message["env"])
    os.chdir(message["cwd"])
    with open(message["job_path"]) as f:
        job = json.load(f)
    ready = imports.pop("ready")
    imports["idle"] = max(0.0, came - ready)  # waited for a job with TensorFlow imported
    imports["waited_for_imports"] = max(0.0, ready - came)  # the job waited for the import
    return job, {k: round(v, 4) for k, v in imports.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m dvml.train.trainer JOB.json | --standby", file=sys.stderr)
        return 2
    exit_with_parent()  # never outlive the worker that started this trainer (or standby)
    if argv[0] == "--standby":
        got = _standby()
        if got is None:
            return 0
        job, imports = got
        startup = Startup(job.get("launched_at"), imports)
        startup.mark("handover")
    else:
        with open(argv[0]) as f:
            job = json.load(f)
        startup = Startup(job.get("launched_at"), None)
        startup.seconds["process_start"] = round(_MODULE_START - startup.launched_at, 4)
        startup.last = _MODULE_START
        startup.seconds.update({k: round(v, 4) for k, v in tf_runtime.preimport().items()})
        startup.last = time.time()
    try:
        run(job, startup)
    except Exception as exc:
        emit("error", type=type(exc).__name__, message=str(exc))
        raise
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written (weights, checkpoint, TensorBoard's files closed at the end of
    # each fit) and the launcher has the "done" line. The interpreter's teardown (TensorFlow's
    # gRPC server of the collectives, its thread pools, every module) took 4.7-6.7 s more on
    # 2 loaded cores, all of it inside the fit's wall time: skip it. An exception still exits
    # the usual way, above, with its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
