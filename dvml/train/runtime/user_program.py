"""The user program of a trainer process: the user's own training loop, ``train_fn(context)``.

Run inside ``python -m dvml.train.runtime.trainer`` for a job whose ``program`` is ``"user"``
(:func:`dvml.run` starts one per worker that holds the data, in lock-step through the
runtime's :mod:`~dvml.train.runtime.lockstep`). ``train_fn`` arrives as cloudpickle bytes,
as Dask ships functions. The :class:`TrainContext` it receives holds what dvml already
owns: the strategy (a MultiWorkerMirroredStrategy with ``TF_CONFIG`` set, or none for a
local-only loop), each named dataset as this worker's LOCAL zero-copy ``tf.data.Dataset``
with the same balanced steps per epoch on every trainer, the worker's rank, host and GPUs,
``report`` (metrics to the client, and a checkpoint), ``checkpoint`` (resume after a fault)
and ``save_model`` (into the registry). What ``train_fn`` returns on the chief goes back.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from typing import Any

from dvml import tf_runtime
from dvml.exceptions import ArgumentError, TrainingError
from dvml.resolve.partitions import LocalPartitions, open_local
from dvml.resolve.tfdata import evaluation_dataset, training_dataset
from dvml.train.runtime import memory_sample
from dvml.train.runtime.checkpoints import CheckpointStore
from dvml.train.runtime.protocol import Report, Returned, SavedModel, emit
from dvml.train.runtime.seeds import shuffle_seed
from dvml.train.runtime.shipped import register_sources
from dvml.train.runtime.startup import Startup

__all__ = ["Checkpoint", "TrainContext", "run", "user_traceback"]

DEFAULT_COMPILE_PARAMS = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
SAMPLE_EVERY_S = 1.0
"""Seconds between two samples of a trainer's memory sent with its reports."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What ``context.report(..., checkpoint=...)`` saved last: the step, its metrics and the
    weights (a list of numpy arrays, ``model.set_weights`` takes it)."""

    step: int
    metrics: dict[str, Any]
    weights: list[Any]


class TrainContext:
    """What a ``train_fn`` gets: the strategy, the local datasets, its place, report/save.

    Attributes
    ----------
    strategy : tf.distribute.Strategy or None
        A MultiWorkerMirroredStrategy over every trainer (``sync="step"``), or None
        (``sync="none"``: each trainer trains on its own; combine the results yourself).
    rank, world_size : int
        This trainer's index (0 is the chief) and the number of trainers.
    worker, host : str
        The Dask worker this trainer runs on, and its host.
    gpus : list
        The worker's GPUs (empty on CPU, and when ``use_gpus=False``).
    config : dict
        The ``config`` given to :func:`dvml.run`.
    batch_size, global_batch_size : int
        This trainer's batch and the sum over trainers.
    steps_per_epoch : int
        Batches per epoch of the primary dataset: the same on every trainer.
    """

    def __init__(self, job: dict[str, Any], strategy: Any) -> None:
        self.job, self.strategy = job, strategy
        self.rank = int(job["tf_config"]["task"]["index"])
        self.world_size = len(job["tf_config"]["cluster"]["worker"])
        self.worker, self.host = str(job["worker_name"]), str(job.get("host") or "")
        self.gpus = list(job.get("gpus") or [])
        self.config = dict(job.get("config") or {})
        self.batch_size = int(job["per_worker_batch"])
        self.global_batch_size = int(job["global_batch_size"])
        self.steps_per_epoch = int(job["steps_per_epoch"])
        self.is_chief = self.rank == 0
        self._parts: dict[str, LocalPartitions] = {}
        self._steps = int((job.get("resume") or {}).get("step", 0))
        self._history: list[dict[str, Any]] = list((job.get("resume") or {}).get("history", []))
        self._started = time.monotonic()
        self._sampled_at = -SAMPLE_EVERY_S  # the first report samples
        self._store = CheckpointStore(job["checkpoint_dir"])

    @property
    def datasets(self) -> list[str]:
        """The names given to :func:`dvml.run`'s ``datasets`` (the first is the primary)."""
        return list(self.job["datasets"])

    def _local(self, name: str | None) -> tuple[str, LocalPartitions]:
        key = name or self.datasets[0]
        if key not in self.job["datasets"]:
            raise ArgumentError(
                f"No dataset {key!r} in this run. Received: name={name!r}; the run has "
                f"{self.datasets}. Pass it in dvml.run(..., datasets={{{key!r}: ...}})."
            )
        if key not in self._parts:
            self._parts[key] = open_local(self.job["datasets"][key], require=False)
        return key, self._parts[key]

    def dataset(self, name: str | None = None, shuffle: bool = True, epoch: int = 0) -> Any:
        """This worker's LOCAL rows of dataset ``name`` (default: the primary) as ``(x, y)``
        batches of :attr:`batch_size`, read zero-copy from shared memory.

        The primary dataset is endless, :attr:`steps_per_epoch` batches per epoch on every
        trainer, reshuffled each epoch: take that many steps per epoch, so every trainer runs
        the same number of collectives. It starts at ``epoch`` (the data position): a loop
        that builds its dataset again (one ``model.fit(..., epochs=1)`` per epoch, or a run
        resumed from :meth:`checkpoint`) passes the epoch it is at and reads the batches an
        uninterrupted run would, not epoch 0's again. Any other dataset (a validation set)
        yields every local row once.
        """
        key, parts = self._local(name)
        if key != self.datasets[0]:
            return evaluation_dataset(parts, self.batch_size)
        seed = shuffle_seed(int(self.job["seed"]), worker=self.rank)
        return training_dataset(
            parts, self.batch_size, self.steps_per_epoch, seed, shuffle, first_epoch=epoch
        )

    def distributed_dataset(self, name: str | None = None, epoch: int = 0) -> Any:
        """:meth:`dataset` for ``strategy.run`` in a custom loop (each trainer its own rows)."""
        if self.strategy is None:
            return self.dataset(name, epoch=epoch)
        return self.strategy.distribute_datasets_from_function(
            lambda _: self.dataset(name, epoch=epoch)
        )

    def dataset_creator(self, name: str | None = None, epoch: int = 0) -> Any:
        """:meth:`dataset` for ``model.fit`` under the strategy (with ``steps_per_epoch``);
        ``model.fit`` builds its dataset anew on every call: pass the epoch the call starts."""
        keras = tf_runtime.keras()
        return keras.utils.experimental.DatasetCreator(lambda _: self.dataset(name, epoch=epoch))

    def local_rows(self, name: str | None = None) -> int:
        """Rows of dataset ``name`` on this worker."""
        return int(self._local(name)[1].rows)

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        """Send ``metrics`` (numbers) to the client: a progress line, the run's history. With
        ``checkpoint`` (a Keras model, or a list of arrays), save it first, owner-only, on this
        worker: after a fault, a rerun's :meth:`checkpoint` returns it."""
        self._steps += 1
        values = {str(k): float(v) for k, v in metrics.items()}
        record = {"iteration": self._steps, "metrics": values}
        self._history.append(record)
        if checkpoint is not None:
            weights = checkpoint.get_weights() if hasattr(checkpoint, "get_weights") else checkpoint
            from dvml.registry.weights import weights_to_bytes

            meta = {"job_key": self.job["job_key"], "iteration": self._steps,
                    "history": self._history}  # fmt: skip
            self._store.save(self.worker, weights_to_bytes(list(weights)), meta)
        elapsed = time.monotonic() - self._started
        # A sample walks the process's pages (~10 ms): at most one a second, for loops that
        # report every step.
        sampled = elapsed - self._sampled_at >= SAMPLE_EVERY_S
        if sampled:
            self._sampled_at = elapsed
        emit(Report(self._steps, values, elapsed, checkpointed=checkpoint is not None,
                    resident_bytes=memory_sample.sample() if sampled else None,
                    zygote_bytes=memory_sample.zygote_bytes() if sampled else None))  # fmt: skip

    def checkpoint(self) -> Checkpoint | None:
        """The last checkpoint of this run (every trainer gets the same one), or None."""
        resume = self.job.get("resume")
        if not resume or not self.job.get("weights_path"):
            return None
        from dvml.registry.weights import weights_from_bytes

        with open(self.job["weights_path"], "rb") as f:
            weights = weights_from_bytes(f.read())
        last = resume["history"][-1] if resume.get("history") else {}
        return Checkpoint(int(resume["step"]), dict(last.get("metrics") or {}), list(weights))

    def save_model(
        self,
        model: Any,
        name: str,
        compile_params: str = DEFAULT_COMPILE_PARAMS,
        description: str | None = None,
    ) -> None:
        """Store ``model`` (architecture and weights) in the registry as ``name``, so that
        ``dvml.evaluate``, ``dvml.predict``, warm start and the workflows use it like a model
        from ``dvml.fit``. ``compile_params`` (a MADlib string) is how evaluation compiles it.
        Saved by the chief only (the others' calls do nothing): call it on every trainer."""
        from dvml.names import check_name

        check_name(name, "model")
        if not self.is_chief:
            return
        try:
            model_json = model.to_json()
        except NotImplementedError:
            raise TrainingError(
                f"context.save_model({name!r}): a subclassed Keras model has no architecture "
                f"JSON. Received: {type(model).__name__}. Build the model to store with the "
                "Sequential or functional API, or keep its weights with "
                "context.report(..., checkpoint=model)."
            ) from None
        from dvml.registry.weights import weights_to_bytes

        directory = os.path.join(os.getcwd(), "saved")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        json_path = os.path.join(directory, f"{name}.json")
        weights_path = os.path.join(directory, f"{name}.npz")
        with open(json_path, "w") as f:
            f.write(model_json)
        with open(weights_path, "wb") as f:
            f.write(weights_to_bytes(model.get_weights()))
        emit(SavedModel(name, json_path, weights_path, compile_params, description))

    def close(self) -> None:
        for parts in self._parts.values():
            parts.close()


def run(job: dict[str, Any], startup: Startup) -> None:
    """Run the job's ``train_fn`` with a :class:`TrainContext`; the chief writes its value."""
    import cloudpickle

    tf = tf_runtime.start()
    startup.mark("runtime_start")
    tf.random.set_seed(int(job["seed"]))
    strategy = None
    if job["sync"] == "step":
        communication = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=float(job.get("peer_timeout") or 0) or None
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    startup.mark("strategy")
    with open(job["fn_path"], "rb") as f:
        train_fn = cloudpickle.loads(f.read())
    register_sources(train_fn, job.get("sources") or {})
    context = TrainContext(job, strategy)
    startup.emit()
    try:
        value = train_fn(context)
    except Exception as exc:
        error = TrainingError(f"train_fn raised {type(exc).__name__}: {exc}\n{user_traceback(exc)}")
        # The message holds the whole story: the trainer exits without printing its own frames.
        error.reported_in_full = True  # type: ignore[attr-defined]
        raise error from exc
    rows = context.local_rows()
    context.close()
    result_path = None
    if context.is_chief:
        result_path = os.path.join(os.getcwd(), "result.pkl")
        with open(result_path, "wb") as f:
            f.write(cloudpickle.dumps(value))
    emit(Returned(local_rows=rows, result_path=result_path))


def _in_dvml(filename: str) -> bool:
    return filename.startswith(_DVML_DIR)


_DVML_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the user's ``train_fn`` down: without the trainer's frames
    above it, and with dvml's frames below the user's last one trimmed to the first (where
    the user's call entered dvml), with a one-line note of how many were left out."""
    tb = exc.__traceback__
    while tb is not None and _in_dvml(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next  # the trainer's own frames, down to train_fn's
    frames = traceback.extract_tb(tb)
    last_user = max((i for i, f in enumerate(frames) if not _in_dvml(f.filename)), default=-1)
    cut = last_user + 2 if last_user >= 0 else len(frames)  # keep the call into dvml
    trimmed = len(frames) - cut if cut < len(frames) else 0
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[:cut] if trimmed else frames)
    if trimmed:
        lines.append(f"  ({trimmed} frame(s) inside dvml not shown)\n")
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip("\n")
