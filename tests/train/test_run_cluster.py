"""``dvml.run``: the user's own training loop on pinned, zero-copy data (real trainers)."""

from __future__ import annotations

import json
import linecache
import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import TrainerFailedError
from tests.helpers import Background, cnn, pid_gone, poll_for, worker_trainers

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

ID_ROWS = 1400  # 700 a worker: 70 batches of 10 (a global batch of 20), none left over


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {"pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")), "label": d.target}
    ).sample(frac=1.0, random_state=0)
    tmp = tmp_path_factory.mktemp("run")
    client = cluster2.client
    settings = {"dvml.cluster.state-dir": str(tmp / "state")}
    with dask.config.set(settings):
        dvml.training_preprocessor(
            frame.iloc[:1400], y="label", x="pixels", normalizing_const=16.0, name="run_digits",
            overwrite=True, client=client,
        )  # fmt: skip
        dvml.validation_preprocessor(
            frame.iloc[1400:], y="label", x="pixels", training="run_digits",
            name="run_digits_val", overwrite=True, client=client,
        )  # fmt: skip
        # Rows that carry their id as their only input: what a trainer reads is countable.
        ids = np.arange(ID_ROWS, dtype="float32")
        dvml.training_preprocessor(
            pd.DataFrame({"x": list(ids[:, None]), "label": (ids % 10).astype(int)}), y="label",
            x="x", name="run_ids", overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        yield {"client": client, "registry": registry, "settings": settings,
               "model_json": cnn().to_json()}  # fmt: skip
        registry.close()
        for name in ("run_digits", "run_digits_val", "run_ids"):
            dvml.datasets.drop(name, client=client)


def run(env: dict[str, Any], fn: Any, **kwargs: Any) -> dvml.RunResult:
    kwargs.setdefault("progress", False)
    with dask.config.set(env["settings"]):
        return dvml.run(fn, {"train": "run_digits", "val": "run_digits_val"},
                        registry=env["registry"], client=env["client"], **kwargs)  # fmt: skip


# -- train_fns (module level: shipped by value with this module) ------------------------------


def gradient_tape_loop(context: Any) -> dict[str, Any]:
    """The "Dask on Vineyard" guide's training, as a custom loop under the strategy."""
    import tensorflow as tf
    import tf_keras as keras

    with context.strategy.scope():
        model = keras.models.model_from_json(context.config["model_json"])
        optimizer = keras.optimizers.Adam(0.003)
        loss_fn = keras.losses.CategoricalCrossentropy(reduction=keras.losses.Reduction.NONE)

    @tf.function
    def step(batch: Any) -> Any:
        x, y = batch
        with tf.GradientTape() as tape:
            per_row = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=context.global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    batches = iter(context.distributed_dataset("train"))
    for _ in range(context.config["epochs"]):
        total = 0.0
        for _ in range(context.steps_per_epoch):
            per_replica = context.strategy.run(step, args=(next(batches),))
            total += float(context.strategy.reduce("SUM", per_replica, axis=None))
        weights_sum = float(sum(float(np.sum(w)) for w in model.get_weights()))
        context.report({"loss": total / context.steps_per_epoch, "weights_sum": weights_sum})
    return {"rank": context.rank, "world": context.world_size, "rows": context.local_rows()}


class Subclassed:  # built lazily: tf_keras is imported in the trainer only
    @staticmethod
    def build() -> Any:
        import tf_keras as keras

        class SmallNet(keras.Model):
            def __init__(self) -> None:
                super().__init__()
                self.flat = keras.layers.Flatten()
                self.hidden = keras.layers.Dense(32, activation="relu")
                self.out = keras.layers.Dense(10, activation="softmax")

            def call(self, x: Any) -> Any:
                return self.out(self.hidden(self.flat(x)))

        return SmallNet()


def subclassed_fit(context: Any) -> float:
    """A subclassed model trained with model.fit on the strategy's dataset creator (seeded,
    and a learning rate that learns in its 33 steps: Adam's default left it at 0.47 once)."""
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    with context.strategy.scope():
        model = Subclassed.build()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="categorical_crossentropy",
                      metrics=["accuracy"])  # fmt: skip
    history = model.fit(context.dataset_creator("train"), epochs=3,
                        steps_per_epoch=context.steps_per_epoch, verbose=0)  # fmt: skip
    for epoch, loss in enumerate(history.history["loss"]):
        context.report({"epoch": epoch, "loss": loss})
    evaluated = model.evaluate(context.dataset("val"), verbose=0, return_dict=True)
    return float(evaluated["accuracy"])


def vineyard_modules(context: Any) -> dict[str, Any]:
    """What the trainer holds of vineyard's command-line wrapper (dvml.vineyard_runtime)."""
    import sys

    context.dataset("train")  # reads through vineyard (a fresh trainer imports it here)
    context.report({"rows": 1.0})
    return {"ctl": type(sys.modules["vineyard.deploy.ctl"]).__name__, "rank": context.rank}


def raising(context: Any) -> None:
    import tensorflow as tf

    if context.rank == 1:
        1 / 0  # noqa: B018
    # The chief waits in an all-reduce for its dead peer: the runtime must stop it.
    ones = context.strategy.run(lambda: tf.constant(1.0))
    context.strategy.reduce("SUM", ones, axis=None)


def checkpointed(context: Any) -> int:
    """Trains with a checkpoint every epoch; resumes from context.checkpoint()."""
    import tf_keras as keras

    with context.strategy.scope():
        model = keras.models.model_from_json(context.config["model_json"])
        model.compile(optimizer="adam", loss="categorical_crossentropy")
    start = 0
    found = context.checkpoint()
    if found is not None:
        model.set_weights(found.weights)
        start = found.step
    for epoch in range(start, context.config["epochs"]):
        # one model.fit per epoch: each starts at its epoch (the data position)
        model.fit(context.dataset_creator("train", epoch=epoch), epochs=1,
                  steps_per_epoch=context.steps_per_epoch, verbose=0)  # fmt: skip
        context.report({"epoch": epoch}, checkpoint=model)
    return start


def counting(context: Any) -> int:
    """Reads the primary dataset's batches from the checkpoint's epoch on and writes the row
    ids of each epoch it read, then checkpoints it: ``<attempt>-<rank>-<epoch>.json``."""
    import json
    import time

    found = context.checkpoint()
    start = found.step if found is not None else 0
    batches = iter(context.dataset(epoch=start))  # the data position: the next unseen epoch
    for epoch in range(start, context.config["epochs"]):
        ids: list[int] = []
        for _ in range(context.steps_per_epoch):
            x, _ = next(batches)
            ids.extend(int(v) for v in x.numpy()[:, 0])
        name = f"{context.config['attempt']}-{context.rank}-{epoch}.json"
        with open(os.path.join(context.config["out"], name), "w") as f:
            json.dump(ids, f)
        context.report({"epoch": epoch}, checkpoint=[np.zeros(1, "float32")])
        time.sleep(context.config["pause"])
    return start


def saves_a_model(context: Any) -> None:
    import tf_keras as keras

    with context.strategy.scope():
        model = keras.models.model_from_json(context.config["model_json"])
        model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    model.fit(context.dataset_creator("train"), epochs=4, steps_per_epoch=context.steps_per_epoch,
              verbose=0)  # fmt: skip
    context.save_model(model, "run_saved_cnn")


# -- tests -----------------------------------------------------------------------------------


def test_a_custom_gradient_tape_loop_trains_in_lockstep(
    env: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    logs = tmp_path / "tb"
    result = run(env, gradient_tape_loop, batch_size=64, tensorboard_dir=str(logs),
                 config={"model_json": env["model_json"], "epochs": 3},
                 memory="4MiB")  # fmt: skip
    assert result.value["rank"] == 0 and result.value["world"] == 2  # the chief's return
    # the memory plan it was admitted by, against what its trainers used (issue 38)
    assert result.memory_plan is not None and result.memory_plan.fits
    assert "4.0 MiB per trainer" in " ".join(result.memory_plan.notes)
    assert sorted(result.memory["trainer_memory"]) == sorted(result.workers)
    assert all(t["peak_bytes"] for t in result.memory["trainer_memory"].values()), result.memory
    (host,) = result.memory["host_memory"].values()
    print("run host memory", host)
    assert 0.8 <= host["peak_bytes"] / host["planned_bytes"] <= 1.2, host
    assert result.value["rows"] > 0
    history = result.history
    assert history["step"].tolist() == [1, 2, 3]
    assert history["loss"].iloc[-1] < history["loss"].iloc[0]  # it learned
    # the strategy kept the trainers' weights identical: both reported the same sums
    by_step: dict[int, set[float]] = {}
    for r in result.reports:
        by_step.setdefault(r["step"], set()).add(round(r["metrics"]["weights_sum"], 4))
    assert all(len(v) == 1 for v in by_step.values()), by_step
    assert sorted({r["worker"] for r in result.reports}) == sorted(result.workers)
    # the run's own TensorBoard stream: each report step, averaged and per trainer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = EventAccumulator(str(logs / "job"))
    job.Reload()
    assert [e.step for e in job.Scalars("loss")] == [1, 2, 3]
    assert [e.value for e in job.Scalars("loss")] == pytest.approx(history["loss"].tolist())
    for r in result.reports:
        events = {e.step: e.value for e in job.Scalars(f"trainer/{r['worker']}/weights_sum")}
        assert events[r["step"]] == pytest.approx(r["metrics"]["weights_sum"], rel=1e-5)


def test_a_subclassed_model_with_model_fit(env: dict[str, Any]) -> None:
    result = run(env, subclassed_fit, batch_size=64)
    assert 0.5 < result.value <= 1.0, result.value  # accuracy on the chief's local val rows
    assert result.history["loss"].iloc[-1] < result.history["loss"].iloc[0]


def test_trainers_import_vineyard_without_its_vineyardctl_subprocess(env: dict[str, Any]) -> None:
    """A trainer (a standby's import, or a fresh one's) goes through dvml.vineyard_runtime: the
    placeholder is what it holds, so vineyard's import ran no vineyardctl."""
    result = run(env, vineyard_modules, sync="none")
    assert result.value == {"ctl": "_LazyCtl", "rank": 0}, result.value


def test_a_raising_train_fn_stops_every_trainer_with_its_traceback(
    env: dict[str, Any], cluster2: Any
) -> None:
    with pytest.raises(TrainerFailedError) as e:
        run(env, raising, name="run_raising", timeout=300)
    text = str(e.value)
    assert "ZeroDivisionError" in text and "Traceback" in text and "in raising" in text, text
    assert "worker-1" in text, text
    assert poll_for(lambda: not worker_trainers(cluster2, name="run_raising"), 30)


CELL = "<dynamic-code-run-cell>"  # a notebook cell's or an exec'd script's file name
CELL_SOURCE = """\
def cell_train_fn(context):
    ratio = context.rank / 0  # the cell's failing line
    return ratio
"""


def test_a_train_fn_from_a_cell_shows_its_lines_and_no_trainer_frames(
    env: dict[str, Any],
) -> None:
    """A train_fn whose file exists on the client only (linecache, as IPython keeps cells):
    its error shows the cell's lines; the trainer's, the zygote's and the runtime's frames
    are not printed after it."""
    linecache.cache[CELL] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(True), CELL)
    namespace: dict[str, Any] = {}
    exec(compile(CELL_SOURCE, CELL, "exec"), namespace)
    try:
        with pytest.raises(TrainerFailedError) as e:
            run(env, namespace["cell_train_fn"], name="run_cell", sync="none", timeout=300)
    finally:
        linecache.cache.pop(CELL, None)
    text = str(e.value)
    assert "ratio = context.rank / 0  # the cell's failing line" in text, text
    assert "ZeroDivisionError" in text, text
    for dvml_frame in ("zygote.py", "trainer.py", "user_program.py", "The above exception"):
        assert dvml_frame not in text, text


def test_a_killed_trainer_then_a_rerun_resumes_from_its_checkpoint(
    env: dict[str, Any], cluster2: Any
) -> None:
    config = {"model_json": env["model_json"], "epochs": 30}
    job = Background(lambda seen: run(env, checkpointed, config=config, name="run_ckpt",
                                      on_report=seen))  # fmt: skip
    assert poll_for(lambda: len(job.times) >= 2, 300), "no second checkpoint"
    victims = worker_trainers(cluster2, "worker-1", name="run_ckpt")
    assert len(victims) == 1, victims
    os.kill(victims[0], signal.SIGKILL)
    error = job.error(300)
    assert isinstance(error, TrainerFailedError), error
    assert "worker-1" in str(error) and "killed by SIGKILL" in str(error), str(error)
    assert poll_for(lambda: all(pid_gone(p) for p in victims), 30)
    resumed = run(env, checkpointed, config={**config, "epochs": 4}, name="run_ckpt")
    assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 2
    assert resumed.value == resumed.resumed_from_step  # train_fn started from the checkpoint
    assert resumed.history["step"].tolist()[0] == resumed.resumed_from_step + 1


def test_across_a_kill_and_a_resume_every_row_id_is_read_once_per_epoch(
    env: dict[str, Any], cluster2: Any, tmp_path: pathlib.Path
) -> None:
    """Issue 37 item 5 for dvml.run: the trainers' row ids, counted. A trainer is killed
    mid-run; the rerun starts at the checkpoint's epoch (``context.checkpoint().step``), and
    the epochs of the run that results (the first attempt's before it, the rerun's from it)
    each read every row of the dataset exactly once over the two trainers."""
    config = {"out": str(tmp_path), "pause": 0.2}

    def go(attempt: int, epochs: int, seen: Any = None) -> dvml.RunResult:
        with dask.config.set(env["settings"]):
            return dvml.run(counting, "run_ids", batch_size=20, name="run_ids_count",
                            config={**config, "attempt": attempt, "epochs": epochs},
                            on_report=seen, progress=False, registry=env["registry"],
                            client=env["client"])  # fmt: skip

    job = Background(lambda seen: go(0, 40, seen))
    assert poll_for(lambda: len(job.times) >= 4, 300), "no second epoch checkpointed"
    victims = worker_trainers(cluster2, "worker-1", name="run_ids_count")
    assert len(victims) == 1, victims
    os.kill(victims[0], signal.SIGKILL)
    assert isinstance(job.error(300), TrainerFailedError)
    assert poll_for(lambda: all(pid_gone(p) for p in victims), 30)
    epochs = 6
    resumed = go(1, epochs)
    start = resumed.resumed_from_step
    assert start is not None and 2 <= start < epochs and resumed.value == start, resumed
    read = {tuple(int(v) for v in f.stem.split("-")): json.loads(f.read_text())
            for f in tmp_path.glob("*.json")}  # fmt: skip
    # the rerun read no epoch before the checkpoint's: it went on at the next unseen one
    assert sorted(e for a, _, e in read if a == 1) == sorted(list(range(start, epochs)) * 2)
    for epoch in range(epochs):
        attempt = 0 if epoch < start else 1
        both = read[(attempt, 0, epoch)] + read[(attempt, 1, epoch)]
        assert sorted(both) == list(range(ID_ROWS)), (epoch, attempt, len(both))
    # what both attempts read of one epoch is the same: the batches an uninterrupted run reads
    for (attempt, rank, epoch), ids in read.items():
        if attempt == 0 and (1, rank, epoch) in read:
            assert ids == read[(1, rank, epoch)], (rank, epoch)
    assert read[(0, 0, 0)] != read[(0, 0, 1)]  # a new shuffle every epoch


def test_a_saved_model_is_evaluated_like_a_fit_model(env: dict[str, Any]) -> None:
    result = run(env, saves_a_model, batch_size=64, config={"model_json": env["model_json"]})
    assert result.models == ["run_saved_cnn"]
    with dask.config.set(env["settings"]):
        scores = dvml.evaluate("run_saved_cnn", "run_digits_val", registry=env["registry"],
                               client=env["client"])  # fmt: skip
    assert scores["metric"] > 0.5, scores
    assert scores["rows"] == 397


def test_refuses_bad_arguments_before_any_trainer(env: dict[str, Any]) -> None:
    from dvml.exceptions import ArgumentError, ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match="train_fn must be a function"):
        run(env, "not a function")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="sync must be one of"):
        run(env, raising, sync="iteration")
    with pytest.raises(ArgumentError, match="memory must be the bytes"):
        run(env, raising, memory="-1 MiB")


def test_a_run_whose_plan_does_not_fit_is_refused_before_any_trainer(
    env: dict[str, Any], cluster2: Any
) -> None:
    from dvml.exceptions import MemoryPlanError

    with dask.config.set(env["settings"]):
        plan = dvml.plan.run({"train": "run_digits"}, batch_size=64, client=env["client"])
    assert plan.fits and "lower bound" in " ".join(plan.notes)
    assert [t.batch for t in plan.trainers] == [32, 32]
    before = worker_trainers(cluster2)
    with pytest.raises(MemoryPlanError, match=r"dvml\.run 'raising' does not fit") as refused:
        run(env, raising, memory="1TiB")
    assert "1.00 TiB per trainer" in str(refused.value) and refused.value.plan.fixes
    assert worker_trainers(cluster2) == before  # refused before any trainer started
