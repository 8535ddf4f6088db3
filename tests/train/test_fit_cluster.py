"""dvml.fit / evaluate / predict on a real LocalCluster with real TensorFlow trainer processes."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import (
    DatasetNotFoundError,
    MemoryPlanError,
    ModelMismatchError,
    ParameterError,
    RegistryNotFoundError,
    TrainerFailedError,
    TrainingError,
)
from tests.helpers import (
    cnn,
    half_speed,
    keras,
    pid_gone,
    poll_for,
    standby_trainers,
    worker_descendants,
    worker_trainers,
)

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', metrics=['accuracy']"
)


@pytest.fixture(scope="module")
def digits() -> tuple[pd.DataFrame, pd.DataFrame]:
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {
            "id": np.arange(len(d.target)),
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target,
        }
    )
    shuffled = frame.sample(frac=1.0, random_state=0).reset_index(drop=True)
    return shuffled.iloc[:1500], shuffled.iloc[1500:]


@pytest.fixture(scope="module")
def env(cluster2: Any, digits: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """digits packed on cluster2, a registry in a temporary SQLite file, the CNN registered."""
    tmp = tmp_path_factory.mktemp("fit")
    client = cluster2.client
    train, test = digits
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        dvml.training_preprocessor(
            train,
            y="label",
            x="pixels",
            normalizing_const=16.0,
            name="fit_digits",
            overwrite=True,
            client=client,
        )
        dvml.validation_preprocessor(
            test,
            y="label",
            x="pixels",
            training="fit_digits",
            name="fit_digits_val",
            overwrite=True,
            client=client,
        )
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch, "test": test, "tmp": tmp}
        registry.close()
        for name in ("fit_digits", "fit_digits_val"):
            dvml.datasets.drop(name, client=client)


def run_fit(env: dict[str, Any], model: str, **kwargs: Any) -> dvml.Model:
    params: dict[str, Any] = {
        "compile_params": COMPILE,
        "fit_params": "batch_size=32, epochs=2",
        "num_iterations": 2,
        "progress": False,
    }
    params.update(kwargs)
    arch = params.pop("arch_id", env["arch"])
    training = params.pop("training_set", "fit_digits")
    return dvml.fit(training, model, arch, registry=env["registry"], client=env["client"], **params)


# -- one fit shared by the tests of its outcome -------------------------------------------------
# "digits_cnn": 4 iterations, metrics every 2, a validation set, progress recorded. Each test
# below checks one behaviour of this one fit (or of evaluate/predict on its model).


@pytest.fixture(scope="module")
def trained(env: dict[str, Any]) -> dict[str, Any]:
    """The fitted digits CNN, the progress records the client saw while it trained."""
    seen: list[dict[str, Any]] = []
    model = run_fit(
        env,
        "digits_cnn",
        num_iterations=4,
        validation_set="fit_digits_val",
        metrics_compute_frequency=2,
        on_iteration=seen.append,
        sync="iteration",
    )
    return {"model": model, "summary": model.summary, "seen": seen}


@pytest.fixture(scope="module")
def evaluated(env: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
    """dvml.evaluate of the fitted model on the validation set, on the workers."""
    return dvml.evaluate(
        "digits_cnn", "fit_digits_val", registry=env["registry"], client=env["client"]
    )


@pytest.fixture(scope="module")
def top1(env: dict[str, Any], trained: dict[str, Any]) -> pd.DataFrame:
    """dvml.predict of the fitted model on the raw test rows (top class per row)."""
    return dvml.predict(
        "digits_cnn", env["test"], "id", "pixels", registry=env["registry"], client=env["client"]
    ).compute(scheduler=env["client"])


def test_fit_reaches_the_validation_accuracy(trained: dict[str, Any]) -> None:
    s = trained["summary"]
    # MADlib's model averaging converges: >= 90 % within 4 iterations (2 epochs each)
    assert s["sync"] == "iteration"
    assert s["validation_metrics_final"] >= 0.90, s["validation_metrics"]


def test_fit_ends_with_the_same_weights_on_all_trainers(trained: dict[str, Any]) -> None:
    assert trained["summary"]["weights_identical_on_all_trainers"] is True


def test_fit_reports_progress_once_per_iteration(trained: dict[str, Any]) -> None:
    # progress reached the client while training ran, once per iteration
    assert [r["iteration"] for r in trained["seen"]] == [1, 2, 3, 4]
    assert trained["summary"]["metrics_iters"] == [2, 4]


def test_each_trainer_reads_the_buffers_of_its_own_instance(
    env: dict[str, Any], trained: dict[str, Any], cluster2: Any
) -> None:
    # each trainer read exactly the buffers on its own vineyard instance, together all of them
    s = trained["summary"]
    layout = dvml.datasets.describe("fit_digits", client=env["client"]).layout["buffers"]
    by_worker = {w.name: w.vineyard_instance_id for w in cluster2.workers}
    covered = []
    for worker, part in s["trainer_partitions"].items():
        assert part["instance_id"] == by_worker[worker]
        for b in part["buffers"]:
            assert layout[b]["instance_id"] == part["instance_id"]
        covered += part["buffers"]
        assert part["rows"] == sum(layout[b]["rows"] for b in part["buffers"])
    assert sorted(covered) == list(range(len(layout)))


MADLIB_SUMMARY_FIELDS = (
    "source_table",
    "model",
    "dependent_varname",
    "independent_varname",
    "model_arch_table",
    "model_id",
    "compile_params",
    "fit_params",
    "num_iterations",
    "validation_table",
    "metrics_compute_frequency",
    "name",
    "description",
    "model_type",
    "model_size",
    "start_training_time",
    "end_training_time",
    "metrics_elapsed_time",
    "version",
    "num_classes",
    "dependent_vartype",
    "normalizing_const",
    "metrics_type",
    "loss_type",
    "training_metrics_final",
    "training_loss_final",
    "training_metrics",
    "training_loss",
    "validation_metrics_final",
    "validation_loss_final",
    "validation_metrics",
    "validation_loss",
    "metrics_iters",
    "class_values",
)


def test_summary_has_every_madlib_field(trained: dict[str, Any]) -> None:
    s = trained["summary"]
    for key in MADLIB_SUMMARY_FIELDS:
        assert key in s, key
    assert s["class_values"] == list(range(10))
    assert s["loss_type"] == "categorical_crossentropy" and s["metrics_type"] == ["accuracy"]


def test_history_has_every_iteration_and_a_falling_loss(trained: dict[str, Any]) -> None:
    history = trained["model"].history()
    assert list(history["iteration"]) == [1, 2, 3, 4]
    evaluated = history.dropna(subset=["training_loss"])
    assert list(evaluated["iteration"]) == [2, 4]
    assert evaluated["training_loss"].iloc[-1] < evaluated["training_loss"].iloc[0]


def test_evaluate_equals_the_final_validation_figures(
    env: dict[str, Any], trained: dict[str, Any], evaluated: dict[str, Any]
) -> None:
    # evaluate on the workers equals the final validation figures
    s = trained["summary"]
    assert evaluated["metric"] == pytest.approx(s["validation_metrics_final"], abs=1e-6)
    assert evaluated["loss"] == pytest.approx(s["validation_loss_final"], rel=1e-5)
    assert evaluated["rows"] == len(env["test"])


def test_predict_raw_rows_agrees_with_evaluate(
    env: dict[str, Any], evaluated: dict[str, Any], top1: pd.DataFrame
) -> None:
    # predict raw rows, normalization applied on the workers; agrees with evaluate
    test = env["test"]
    assert len(top1) == len(test) and set(top1["rank"]) == {1}
    merged = top1.merge(test[["id", "label"]], on="id")
    assert (merged["class_value"] == merged["label"]).mean() == pytest.approx(evaluated["metric"])


def test_predict_top_k_ranks_by_falling_probability(
    env: dict[str, Any], trained: dict[str, Any]
) -> None:
    top3 = dvml.predict(
        "digits_cnn",
        env["test"].iloc[:20],
        "id",
        "pixels",
        pred_type=3,
        registry=env["registry"],
        client=env["client"],
    ).compute(scheduler=env["client"])
    assert len(top3) == 60 and sorted(set(top3["rank"])) == [1, 2, 3]
    assert (top3.groupby("id")["prob"].apply(lambda p: p.is_monotonic_decreasing)).all()


def test_predict_probabilities_sum_to_one(env: dict[str, Any], trained: dict[str, Any]) -> None:
    probs = dvml.predict(
        "digits_cnn",
        env["test"].iloc[:5],
        "id",
        "pixels",
        pred_type="prob",
        registry=env["registry"],
        client=env["client"],
    ).compute(scheduler=env["client"])
    assert probs.groupby("id")["prob"].sum().to_numpy() == pytest.approx(np.ones(5), abs=1e-4)


def test_byom_with_the_same_weights_predicts_the_same_classes(
    env: dict[str, Any], trained: dict[str, Any], top1: pd.DataFrame
) -> None:
    # BYOM: the same weights loaded as an architecture predict the same classes
    byom_arch = dvml.load_keras_model(
        cnn().to_json(), weights=trained["model"].weights(), registry=env["registry"]
    )
    byom = dvml.predict_byom(
        byom_arch,
        env["test"],
        "id",
        "pixels",
        class_values=list(range(10)),
        normalizing_const=16.0,
        registry=env["registry"],
        client=env["client"],
    ).compute(scheduler=env["client"])
    assert (
        byom.sort_values("id")["class_value"].tolist()
        == top1.sort_values("id")["class_value"].tolist()
    )


def test_fit_names_the_slow_trainer_and_an_even_fit_none(
    env: dict[str, Any], cluster2: Any, trained: dict[str, Any], capsys: Any
) -> None:
    # the undisturbed fit (sync="iteration") of the module names no straggler
    even = trained["summary"]
    assert even["straggler_worker"] is None, even["trainer_step_seconds"]
    assert even["straggler_ratio"] is None and even["straggler_iterations"] is None
    assert set(even["trainer_step_seconds"]) == {"worker-0", "worker-1"}
    assert all(not r["stragglers"] for r in trained["seen"]), [
        r["stragglers"] for r in trained["seen"]
    ]
    # the same fit with worker-1's trainer at half speed: worker-1 is named from iteration 1,
    # not worker-0, which waits for it in the averaging
    seen: list[dict[str, Any]] = []
    with half_speed(cluster2, "worker-1", model="straggler_cnn"):
        s = run_fit(
            env,
            "straggler_cnn",
            fit_params="batch_size=32, epochs=4",  # ~0.5 s of work per iteration to fall behind
            sync="iteration",
            on_iteration=seen.append,
            progress=True,
        ).summary
    assert s["straggler_worker"] == "worker-1", s["trainer_step_seconds"]
    assert s["straggler_ratio"] > 1.5 and s["straggler_iterations"] >= 1, s
    assert [x["worker"] for x in seen[0]["stragglers"]] == ["worker-1"], seen[0]
    assert seen[0]["stragglers"][0]["ratio"] > 1.5
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "iteration 1/2" in x]
    assert "; worker-1 is " in line and "slower than the others" in line, line


def test_warm_start_continues_from_the_trained_weights(
    env: dict[str, Any], trained: dict[str, Any]
) -> None:
    # A copy of the fitted model is warm-started, so that digits_cnn, which the tests above
    # read, stays as the fit left it whatever order the tests run in.
    registry = env["registry"]
    fitted = registry.get_model("digits_cnn")
    registry.save_model(
        "digits_cnn_warm", fitted["arch_id"], fitted["weights"], fitted["summary"], replace=True
    )
    # warm start continues from these weights: its first loss is already low
    warm = run_fit(env, "digits_cnn_warm", num_iterations=1, warm_start=True, sync="iteration")
    assert warm.summary["training_loss_final"] < 0.5
    assert warm.summary["warm_start"] is True


@pytest.mark.parametrize("sync", ["iteration", "step"])
def test_augment_transforms_the_training_batches_and_nothing_else(
    env: dict[str, Any], trained: dict[str, Any], sync: str
) -> None:
    """An augment that blanks every training input: the model cannot learn the digits (its
    accuracy on the rows as stored stays near one class's share), where the same data
    without it reaches >= 90 %. The metrics read the stored rows (a blanked evaluation would
    score every model the same); the summary names what augmented."""

    def blank(x: Any) -> Any:
        return x * 0.0

    model = run_fit(env, f"digits_blank_{sync}", augment=blank, sync=sync, num_iterations=1)
    assert model.summary["augment"].endswith("blank")
    assert model.summary["training_metrics_final"] < 0.35, model.summary["training_metrics"]
    assert trained["summary"]["training_metrics_final"] >= 0.90
    assert trained["summary"]["augment"] is None


def test_augment_with_keras_preprocessing_layers_trains(env: dict[str, Any]) -> None:
    tf_keras = keras()
    shake = tf_keras.Sequential(
        [tf_keras.layers.RandomTranslation(0.1, 0.1), tf_keras.layers.RandomContrast(0.1)]
    )
    model = run_fit(env, "digits_shaken", augment=shake, num_iterations=2, sync="iteration")
    assert model.summary["augment"].startswith("Sequential(random_translation")
    assert model.summary["training_metrics_final"] >= 0.8, model.summary["training_metrics"]
    with pytest.raises(dvml.exceptions.ArgumentTypeError, match="tf-keras layer"):
        run_fit(env, "digits_bad_augment", augment="flip")


def test_transfer_learning_keeps_frozen_layers(env: dict[str, Any]) -> None:
    base = cnn()
    base.get_layer("conv").trainable = False
    initial = base.get_weights()
    arch = dvml.load_keras_model(
        base.to_json(), weights=initial, name="frozen-conv", registry=env["registry"]
    )
    # under model averaging too: identical frozen weights average to themselves, bit for bit
    model = run_fit(env, "transfer", arch_id=arch, num_iterations=1, sync="iteration")
    after = model.weights()
    np.testing.assert_array_equal(after[0], initial[0])  # conv kernel: frozen
    np.testing.assert_array_equal(after[1], initial[1])  # conv bias: frozen
    assert not np.array_equal(after[2], initial[2])  # hidden layer: trained


def test_custom_loss_and_tensorboard(env: dict[str, Any]) -> None:
    dvml.register_custom_function(
        "scaled_ce",
        "import tensorflow as tf\n"
        "def scaled_ce(y_true, y_pred):\n"
        "    return 2.0 * tf.keras.losses.categorical_crossentropy(y_true, y_pred)\n",
        kind="loss",
        registry=env["registry"],
    )
    logs = env["tmp"] / "tb"
    model = run_fit(
        env,
        "custom",
        num_iterations=1,
        compile_params="loss='scaled_ce', optimizer='adam', metrics=['accuracy']",
        custom_objects=["scaled_ce"],
        tensorboard_dir=str(logs),
    )
    assert model.summary["loss_type"] == "scaled_ce"
    assert model.summary["custom_objects"] == ["scaled_ce"]
    assert any(p.name.startswith("events.out.tfevents") for p in logs.rglob("*"))
    # the job's own stream: per-iteration scalars of the job and of every trainer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = EventAccumulator(str(logs / "job"))
    job.Reload()
    tags = set(job.Tags()["scalars"])
    summary = model.summary
    for worker, seconds in summary["trainer_step_seconds"].items():
        (event,) = job.Scalars(f"trainer/{worker}/step_seconds")
        assert event.step == 1 and event.value == pytest.approx(seconds, abs=1e-5)
        assert f"trainer/{worker}/fit_loss" in tags
    (loss,) = job.Scalars("training_loss")
    assert loss.value == pytest.approx(summary["training_loss"][0], rel=1e-5)
    result = dvml.evaluate(
        "custom", "fit_digits_val", registry=env["registry"], client=env["client"]
    )
    assert result["loss_type"] == "scaled_ce" and result["loss"] > 0


def test_loss_and_metric_objects_with_an_uneven_global_batch(
    env: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # MADlib's users write Keras objects; 33 rows per step split 17 + 16 over two trainers.
    with caplog.at_level("WARNING", logger="dvml.train"):
        model = run_fit(
            env,
            "smoothed",
            num_iterations=1,
            compile_params="loss=CategoricalCrossentropy(label_smoothing=0.1), "
            "optimizer=Adam(learning_rate=0.003), metrics=['accuracy', AUC(name='auc')]",
            fit_params="batch_size=33, epochs=2",
        )
    assert "per-trainer batches" in caplog.text and "17" in caplog.text and "16" in caplog.text
    summary = model.summary
    assert summary["loss_type"] == "CategoricalCrossentropy(label_smoothing=0.1)"
    assert summary["metrics_type"] == ["accuracy", "auc"]
    assert "AUC(name='auc')" in summary["compile_params"]
    result = dvml.evaluate(
        "smoothed", "fit_digits_val", registry=env["registry"], client=env["client"]
    )
    assert (
        0.5 < result["metrics"]["auc"] <= 1.0 and result["metric"] == result["metrics"]["accuracy"]
    )
    assert result["loss"] > 0


def test_keras3_model_json_trains(env: dict[str, Any]) -> None:
    # What `from tensorflow.keras import ...` writes under TF 2.21 (Keras 3): before, it passed
    # load_keras_model and failed in the trainers with "Unrecognized keyword arguments".
    keras3_json = (
        Path(__file__).parents[1] / "registry" / "keras3" / "digits_cnn.json"
    ).read_text()
    arch = dvml.load_keras_model(keras3_json, name="keras3_cnn", registry=env["registry"])
    model = run_fit(env, "keras3", arch_id=arch, num_iterations=1)
    assert np.isfinite(model.summary["training_loss_final"])
    result = dvml.evaluate(
        "keras3", "fit_digits_val", registry=env["registry"], client=env["client"]
    )
    assert result["metrics"]["accuracy"] > 0.5


@pytest.mark.parametrize(
    "compile_params",
    [
        "loss=__import__('os').system('touch /tmp/dvml-pwned')",
        # Each of these passed the client's check before and failed inside the trainers.
        "loss='CategoricalCrossentropy(from_logit=True)', optimizer='adam'",
        "loss='sparse_categorical_crossentropy', optimizer='adam'",
        "loss='categorical_crossentropy', metrics=['accuracy', 'acuracy']",
        "loss='categorical_crossentropy', metrics=[AUC(curve='roc')]",
        "loss='categorical_crossentropy', optimizer='adam', lr=1e309",
        "loss='categorical_crossentropy', nonsense_key=1",
        "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy'",
    ],
)
def test_hostile_parameters_run_nothing(env: dict[str, Any], compile_params: str) -> None:
    before = dvml.list_models(registry=env["registry"])
    with pytest.raises(ParameterError):
        run_fit(env, "hostile", compile_params=compile_params)
    assert not os.path.exists("/tmp/dvml-pwned")
    assert len(dvml.list_models(registry=env["registry"])) == len(before)


def test_fit_refuses_bad_inputs_before_training(env: dict[str, Any], cluster2: Any) -> None:
    with pytest.raises(DatasetNotFoundError, match="no_such_dataset"):
        run_fit(env, "x", training_set="no_such_dataset")
    with pytest.raises(RegistryNotFoundError, match="9999"):
        run_fit(env, "x", arch_id=9999)
    wrong_input = dvml.load_keras_model(
        cnn(input_shape=(8, 8, 3)).to_json(), registry=env["registry"]
    )
    with pytest.raises(ModelMismatchError, match=r"\[8, 8, 3\]"):
        run_fit(env, "x", arch_id=wrong_input)
    wrong_classes = dvml.load_keras_model(cnn(n_classes=7).to_json(), registry=env["registry"])
    with pytest.raises(ModelMismatchError, match="7 units"):
        run_fit(env, "x", arch_id=wrong_classes)
    with pytest.raises(TrainingError, match="warm_start=True but no model"):
        run_fit(env, "never_trained", warm_start=True)
    with pytest.raises(TrainingError, match="no GPU"):
        run_fit(env, "x", use_gpus=True)
    with pytest.raises(ParameterError, match="at least 2"):
        run_fit(env, "x", fit_params="batch_size=1")

    # a validation set preprocessed for another training set
    client, (train, test) = env["client"], (env["test"], env["test"])
    dvml.training_preprocessor(
        train,
        y="label",
        x="pixels",
        normalizing_const=16.0,
        name="fit_other",
        overwrite=True,
        client=client,
    )
    dvml.validation_preprocessor(
        test,
        y="label",
        x="pixels",
        training="fit_other",
        name="fit_other_val",
        overwrite=True,
        client=client,
    )
    try:
        with pytest.raises(ModelMismatchError, match="fit_other"):
            run_fit(env, "x", validation_set="fit_other_val")
    finally:
        dvml.datasets.drop("fit_other", client=client)
        dvml.datasets.drop("fit_other_val", client=client)
    assert "x" not in set(dvml.list_models(registry=env["registry"])["name"])


def test_fit_whose_trainers_do_not_fit_the_host_is_refused_before_one_starts(
    env: dict[str, Any], cluster2: Any
) -> None:
    """dvml.plan.fit gives the trainers' plan on this host (it fits); capped by
    dvml.memory.host-memory to room for one trainer and its margin, the fit of two trainers on
    the one host is refused before a trainer starts, with the fewer-trainers fix."""
    plan = dvml.plan.fit("fit_digits", env["arch"], COMPILE, "batch_size=32",
                         registry=env["registry"], client=env["client"])  # fmt: skip
    assert plan.fits, plan.describe()
    assert sorted(t.worker for t in plan.trainers) == ["worker-0", "worker-1"]
    assert [t.batch for t in plan.trainers] == [16, 16]
    # a LocalCluster's simulated hosts share this machine: its two trainers add up
    assert len(plan.hosts) == 1 and plan.hosts[0].host == "host-0 + host-1"
    # the CNN's weights, gradients and Adam's two slots: 4 float32 per parameter
    assert plan.trainers[0].weights == cnn().count_params() * 4 * 4
    one, zygote = plan.trainers[0].total, plan.hosts[0].zygote
    cap = int((zygote + 1.5 * one) * 1.2)  # the zygote and one trainer with the margin, not two
    with dask.config.set({"dvml.memory.host-memory": cap}), pytest.raises(MemoryPlanError) as info:
        run_fit(env, "too_big")
    error = info.value
    assert not error.plan.fits and error.plan.hosts[0].room.room == cap
    assert "No trainer was started" in str(error) and "batch_size=32" in str(error)
    assert any("1 of 2 fit on" in fix for fix in error.plan.fixes), error.plan.fixes
    assert worker_trainers(cluster2, model="too_big") == []
    assert "too_big" not in set(dvml.list_models(registry=env["registry"])["name"])


def test_plans_read_the_hosts_memory_from_the_workers_heartbeats(cluster2: Any) -> None:
    """Every worker's heartbeat carries its machine's memory (no task per host per plan):
    the boot id of this machine and a MemAvailable near this process's reading."""
    from dvml.cluster.worker_metrics import HOST_METRIC, host_memory
    from dvml.cluster.workers import discover_workers
    from dvml.train.trainer_memory import host_rooms

    def metrics(dask_scheduler: Any) -> dict[str, Any]:
        return {a: ws.metrics.get(HOST_METRIC) for a, ws in dask_scheduler.workers.items()}

    boot, available, _ = host_memory()
    found = cluster2.client.run_on_scheduler(metrics)
    assert len(found) == 2 and all(m is not None and m[0] == boot for m in found.values()), found
    rooms, machine_of = host_rooms(cluster2.client, discover_workers(cluster2.client))
    (room,) = rooms  # the simulated hosts share this machine
    assert set(machine_of.values()) == {room.host}
    assert 0.5 * available < room.available < 1.5 * available, (room, available)


def test_two_concurrent_fits_are_admitted_by_their_sum(env: dict[str, Any], cluster2: Any) -> None:
    """Capped to room for one fit's two trainers (not two fits'), a second fit started while
    the first trains is refused before any of its trainers starts, naming the first; once
    the first has ended, the same second fit is admitted."""
    from dvml.train.fit_admission import read_reservations

    plan = dvml.plan.fit("fit_digits", env["arch"], COMPILE, "batch_size=32",
                         registry=env["registry"], client=env["client"])  # fmt: skip
    cap = int(plan.hosts[0].with_margin * 1.5)  # one fit and its margin, not two
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            outcome["model"] = run_fit(env, "first_of_two", num_iterations=6)
        except BaseException as e:  # reported by the assert below
            outcome["error"] = e

    with dask.config.set({"dvml.memory.host-memory": cap}):
        thread = threading.Thread(target=first)
        thread.start()
        try:
            assert poll_for(lambda: read_reservations(env["client"]) != [], timeout=60)
            held = read_reservations(env["client"])
            assert [r["job"] for r in held] == ["dvml.fit of model 'first_of_two'"]
            with pytest.raises(MemoryPlanError) as info:
                run_fit(env, "second_of_two", num_iterations=1)
            assert worker_trainers(cluster2, model="second_of_two") == []
        finally:
            thread.join()
        assert "error" not in outcome, outcome
        message = str(info.value)
        assert "'first_of_two'" in message and "No trainer was started" in message, message
        assert read_reservations(env["client"]) == []  # the first fit gave its bytes back
        second = run_fit(env, "second_of_two", num_iterations=1)
    assert second.summary["num_iterations"] == 1


def test_the_summary_holds_each_trainers_planned_and_peak_memory(
    env: dict[str, Any], trained: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    use = trained["summary"]["trainer_memory"]
    assert sorted(use) == ["worker-0", "worker-1"]
    for row in use.values():
        assert row["planned_bytes"] > 0
        assert row["peak_bytes"] > 50 * 2**20  # TensorFlow's own pages: ~120 MiB when forked
    assert trained["summary"]["memory_over_plan"] == []  # the default plan holds
    assert all(r["memory_over_plan"] == [] for r in trained["seen"])
    # The machine's sum: both trainers and the zygote they were forked from, counted once,
    # against the plan's, within the plan's margin (20 %) either way.
    (host,) = trained["summary"]["host_memory"].values()
    assert host["zygote_peak_bytes"] > 300 * 2**20, host  # TensorFlow and tf-keras imported
    assert 0.8 <= host["peak_bytes"] / host["planned_bytes"] <= 1.2, host
    # A plan that leaves TensorFlow's runtime out: each trainer is named once, as it goes over
    small = {"dvml.memory.trainer-runtime": "1MiB", "dvml.memory.trainer-runtime-forked": "1MiB"}
    with dask.config.set(small):
        under = run_fit(env, "under_planned", num_iterations=2, progress=True)
    assert under.summary["memory_over_plan"] == ["worker-0", "worker-1"]
    lines = [x for x in capsys.readouterr().out.splitlines() if "[dvml.fit under_planned]" in x]
    assert [x.count("over its planned") for x in lines] == [2, 0], lines


def test_warm_start_refuses_other_shapes(env: dict[str, Any]) -> None:
    run_fit(env, "shape_a", num_iterations=1)
    other = dvml.load_keras_model(
        cnn(n_classes=10, input_shape=(8, 8, 1)).to_json(), registry=env["registry"]
    )
    # same shapes under another architecture id: allowed
    run_fit(env, "shape_a", arch_id=other, num_iterations=1, warm_start=True)
    k = keras()
    flat = k.Sequential(
        [
            k.layers.InputLayer(input_shape=(8, 8, 1)),
            k.layers.Flatten(),
            k.layers.Dense(10, activation="softmax"),
        ]
    )
    flat_id = dvml.load_keras_model(flat.to_json(), registry=env["registry"])
    # the dataset fits the flat model, but its weights cannot come from the CNN
    with pytest.raises(ModelMismatchError):
        run_fit(env, "shape_a", arch_id=flat_id, num_iterations=1, warm_start=True)


def test_killed_trainer_stops_all_and_rerun_resumes(env: dict[str, Any], cluster2: Any) -> None:
    first_iteration_done = threading.Event()
    outcome: dict[str, Any] = {}

    def train() -> None:
        try:
            run_fit(
                env,
                "resumable",
                num_iterations=4,
                fit_params="batch_size=32, epochs=2",
                on_iteration=lambda r: first_iteration_done.set(),
                sync="iteration",
            )
        except BaseException as exc:  # recorded for the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=train)
    thread.start()
    assert first_iteration_done.wait(240), "the first iteration never finished"
    # The job's trainers, by their job file: after the job each worker starts a standby
    # trainer for the next one (dvml.cluster.standby), which is neither victim nor survivor.
    victims = worker_trainers(cluster2, "worker-1", model="resumable")
    others = worker_trainers(cluster2, "worker-0", model="resumable")
    assert len(victims) == 1 and len(others) == 1, (victims, others)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    thread.join(150)
    assert not thread.is_alive(), "fit did not return within a bounded time"
    error = outcome.get("error")
    assert isinstance(error, TrainerFailedError), repr(error)
    assert "worker-1" in str(error)
    # dvml's dashboard page lists the failed job with the error that stopped it
    from tests.helpers.browser import get_json

    faults = get_json(f"{cluster2.dvml_dashboard_link}/api/faults.json")
    mine = [f for f in faults if f["model"] == "resumable"]
    assert mine and "TrainerFailedError" in mine[0]["what"] and "worker-1" in mine[0]["what"]
    # the other trainer is gone too
    assert poll_for(lambda: all(pid_gone(pid) for pid in others), 30)
    # each kept checkpoint records where the next iteration reads: its first epoch
    kept = list((env["tmp"] / "state" / "checkpoints").glob("resumable-*/*.npz.json"))
    assert kept, "no checkpoint kept after the first iteration"
    for path in kept:
        meta = json.loads(path.read_text())
        done = meta["iteration"]
        assert meta["data_position"] == {"iteration": done + 1, "epoch": done * 2}, path

    resumed = run_fit(
        env, "resumable", num_iterations=4, fit_params="batch_size=32, epochs=2", sync="iteration"
    )
    assert resumed.summary["resumed_from_iteration"] >= 1
    assert resumed.summary["weights_identical_on_all_trainers"] is True
    assert resumed.summary["num_iterations"] == 4
    # the history of the interrupted run is carried over: every iteration appears once
    assert resumed.history()["iteration"].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("sync", ["step", 5])
def test_sync_modes_end_on_identical_weights(env: dict[str, Any], sync: Any) -> None:
    """Gradient all-reduce per step, and local SGD averaging every 5 steps."""
    model = run_fit(
        env, f"sync_{sync}", num_iterations=1, sync=sync, validation_set="fit_digits_val"
    )
    s = model.summary
    assert s["sync"] == sync
    assert s["weights_identical_on_all_trainers"] is True
    assert s["validation_metrics_final"] > 0.5, s["validation_metrics"]


def test_trainer_start_is_timed_and_a_standby_serves_the_next_fit(
    env: dict[str, Any], cluster2: Any
) -> None:
    from dvml.cluster import standby
    from dvml.tf_runtime import host_cores, thread_budget

    steps = {"runtime_start", "strategy", "open_partitions", "build_model", "first_step"}
    with dask.config.set({"dvml.train.standby-trainer": False}):
        fresh = run_fit(env, "startup_fresh", num_iterations=1, fit_params="epochs=1")
    budget = thread_budget(host_cores(), 2)  # two trainers on this machine's cores
    for startup in fresh.summary["trainer_startup"].values():
        assert startup["standby"] is False
        assert steps | {"process_start", "import_tensorflow"} <= set(startup["seconds"])
        assert startup["total"] >= sum(startup["seconds"].values()) - 0.01
        assert startup["threads"] == {"intra": budget.intra, "inter": budget.inter,
                                      "omp": budget.omp}  # fmt: skip

    # After a job each worker keeps one standby trainer that imports TensorFlow meanwhile
    # (here: warmed by hand, as the fit above ran with standbys off).
    env["client"].run(standby.start_standby)
    assert poll_for(lambda: all(len(standby_trainers(worker_descendants(cluster2, w))) == 1 for w in
                                ("worker-0", "worker-1")), 30)  # fmt: skip
    served = run_fit(env, "startup_standby", num_iterations=1, fit_params="epochs=1")
    for startup in served.summary["trainer_startup"].values():
        assert startup["standby"] is True
        assert "import_tensorflow" in startup["standby_imports"]
        assert "import_tensorflow" not in startup["seconds"]  # paid before the job came
        assert steps | {"handover"} <= set(startup["seconds"])
    assert served.summary["weights_identical_on_all_trainers"] is True
