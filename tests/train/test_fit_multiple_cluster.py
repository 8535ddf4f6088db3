"""dvml.fit_multiple (Model Hopper Parallelism) on a real 2-worker LocalCluster with real
TensorFlow hop trainers: every model visits every partition, results registered, evaluate and
predict on a result, warm start, a killed trainer and the resume."""

from __future__ import annotations

import contextlib
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
from dvml.exceptions import ArgumentTypeError, FitRunningError, MemoryPlanError, TrainerFailedError
from dvml.placement.memory import format_size
from tests.helpers import Background, cnn, half_speed, pid_gone, poll_for, worker_trainers
from tests.helpers.clusters import tls_environment
from tests.helpers.jobs import dvml_command
from tests.helpers.trainers import slowed

pytestmark = [pytest.mark.cluster, pytest.mark.tf]


def configs(arch: int, lrs: tuple[float, ...] = (0.003, 0.01), batches: tuple[int, ...] = (32,)):
    rows = []
    for lr in lrs:
        for b in batches:
            rows.append(
                {
                    "mst_key": len(rows) + 1,
                    "model_id": arch,
                    "compile_params": (
                        "loss='categorical_crossentropy',"
                        f"optimizer='Adam(learning_rate={lr})',metrics=['accuracy']"
                    ),
                    "fit_params": f"batch_size={b},epochs=1",
                }
            )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {
            "id": np.arange(len(d.target)),
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target,
        }
    ).sample(frac=1.0, random_state=0)
    train, test = frame.iloc[:1400], frame.iloc[1400:]
    tmp = tmp_path_factory.mktemp("mop")
    client = cluster2.client
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        dvml.training_preprocessor(
            train, y="label", x="pixels", normalizing_const=16.0, name="mop_digits",
            overwrite=True, client=client,
        )  # fmt: skip
        dvml.validation_preprocessor(
            test, y="label", x="pixels", training="mop_digits", name="mop_digits_val",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch, "test": test, "tmp": tmp}
        registry.close()
        for name in ("mop_digits", "mop_digits_val"):
            dvml.datasets.drop(name, client=client)


def run(env: dict[str, Any], output: str, table: Any, **kwargs: Any) -> dvml.ModelSelection:
    params: dict[str, Any] = {"num_iterations": 2, "progress": False}
    params.update(kwargs)
    return dvml.fit_multiple(
        "mop_digits", output, table, registry=env["registry"], client=env["client"], **params
    )


@pytest.fixture(scope="module")
def selection(env: dict[str, Any]) -> dvml.ModelSelection:
    # 3 models on 2 workers: every worker busy each round, one of them trains two models.
    table = configs(env["arch"], lrs=(0.003, 0.01, 0.001))
    return run(
        env,
        "mop",
        table,
        num_iterations=3,
        validation_set="mop_digits_val",
        metrics_compute_frequency=1,
        name="grid",
        description="three learning rates",
    )


def test_every_model_visits_every_partition_each_iteration(
    selection: dvml.ModelSelection,
) -> None:
    s = selection.summary
    assert s["workers"] == ["worker-0", "worker-1"]
    assert s["hops"] == 3 * 3 * 2  # models x iterations x workers
    visits = {(k, it): set() for k in (1, 2, 3) for it in (1, 2, 3)}
    for k, it, worker in s["hop_workers"]:
        visits[(k, it)].add(worker)
    assert all(v == {"worker-0", "worker-1"} for v in visits.values()), visits
    assert s["moving_seconds"] > 0 and s["moved_bytes"] > 0
    # each worker's training seconds per step over its hops (the straggler rule's figures)
    assert sorted(s["trainer_step_seconds"]) == ["worker-0", "worker-1"]
    assert all(v > 0 for v in s["trainer_step_seconds"].values()), s["trainer_step_seconds"]
    assert {"straggler_worker", "straggler_ratio", "straggler_iterations"} <= set(s)


def test_a_slow_worker_is_named_in_the_progress_line_and_the_summary(
    env: dict[str, Any], cluster2: Any, capsys: Any
) -> None:
    # worker-1's hop trainer at half speed: its seconds per step over the models it trained
    # stand out from the first iteration (issue 37 item 1 for fit_multiple)
    table = configs(env["arch"], lrs=(0.003, 0.01))
    table["fit_params"] = "batch_size=32,epochs=4"  # ~0.5 s of work per hop to fall behind
    with half_speed(cluster2, "worker-1", model_output="mop_slow"):
        s = run(env, "mop_slow", table, progress=True).summary
    assert s["straggler_worker"] == "worker-1", s["trainer_step_seconds"]
    assert s["straggler_ratio"] > 1.5 and s["straggler_iterations"] >= 1, s
    lines = [x for x in capsys.readouterr().out.splitlines() if "iteration 1/2" in x]
    assert len(lines) == 1 and "; straggler: worker-1 is " in lines[0], lines


def test_info_has_one_row_per_configuration(selection: dvml.ModelSelection) -> None:
    info = selection.info
    assert info["mst_key"].tolist() == [1, 2, 3]
    assert info["model_name"].tolist() == ["mop_1", "mop_2", "mop_3"]
    for column in ("training_loss", "validation_metrics", "metrics_elapsed_time"):
        assert all(len(v) == 3 for v in info[column]), column
    assert "Adam(learning_rate=0.01)" in info.loc[1, "compile_params"]
    # learning from every partition: the good learning rates reach a useful accuracy
    assert info["validation_metrics_final"].max() >= 0.85, info["validation_metrics_final"]
    assert (info["moving_seconds"] > 0).all()
    summary = selection.summary
    assert summary["model_info"] == "mop_info" and summary["name"] == "grid"
    assert summary["metrics_iters"] == [1, 2, 3]
    assert summary["num_iterations"] == 3


def test_evaluate_and_predict_on_a_result(
    env: dict[str, Any], selection: dvml.ModelSelection
) -> None:
    best = selection.best()
    row = selection.info.set_index("model_name").loc[best.name]
    result = dvml.evaluate(
        best.name, "mop_digits_val", registry=env["registry"], client=env["client"]
    )
    assert result["metric"] == pytest.approx(row["validation_metrics_final"], abs=1e-4)
    assert result["loss"] == pytest.approx(row["validation_loss_final"], rel=1e-3)
    by_key = selection.model(2)
    assert by_key.name == "mop_2" and by_key.summary["mst_key"] == 2
    top1 = dvml.predict(
        best.name, env["test"], "id", "pixels", registry=env["registry"], client=env["client"]
    ).compute(scheduler=env["client"])
    truth = env["test"].set_index("id")["label"]
    hits = (top1.set_index("id")["class_value"].astype(int) == truth.loc[top1["id"]].values).mean()
    assert hits == pytest.approx(result["metric"], abs=1e-6)


def test_warm_start_continues_each_model(
    env: dict[str, Any], selection: dvml.ModelSelection
) -> None:
    before = {k: selection.model(k).summary["validation_loss_final"] for k in (1, 2, 3)}
    table = configs(env["arch"], lrs=(0.003, 0.01, 0.001))
    again = run(
        env, "mop", table, num_iterations=1, validation_set="mop_digits_val", warm_start=True
    )
    assert again.summary["warm_start"] is True
    after = again.info.set_index("mst_key")["validation_loss_final"]
    # a fresh start would lose to three trained iterations by far
    for k in (1, 2, 3):
        assert after[k] < before[k] * 1.5 + 0.05, (k, before, after.to_dict())
    assert env["registry"].get_model("mop_1")["version"] == 2


def test_fewer_models_than_workers_still_visit_every_partition(env: dict[str, Any]) -> None:
    one = run(env, "mop_single", configs(env["arch"], lrs=(0.003,)), num_iterations=1)
    assert sorted(w for _, _, w in one.summary["hop_workers"]) == ["worker-0", "worker-1"]
    assert one.info["training_loss_final"].notna().all()


def test_augment_transforms_every_models_training_batches(
    env: dict[str, Any], selection: dvml.ModelSelection
) -> None:
    """The hop trainers augment too: with an augment that blanks the inputs, no model learns
    the digits (accuracy on the stored rows near one class's share), where the same grid
    without it does; each model's summary names it."""

    def blank(x: Any) -> Any:
        return x * 0.0

    table = configs(env["arch"], lrs=(0.003, 0.01))
    blanked = run(env, "mop_blank", table, num_iterations=1, augment=blank)
    assert (blanked.info["training_metrics_final"] < 0.35).all(), blanked.info
    assert selection.info["training_metrics_final"].max() >= 0.85
    assert blanked.model(1).summary["augment"].endswith("blank")
    assert selection.model(1).summary["augment"] is None


def test_the_summary_holds_each_hop_trainers_planned_and_peak_memory(
    selection: dvml.ModelSelection,
) -> None:
    """Each hop trainer sampled its resident bytes at its hops' ends; the stored summary has
    them beside its plan (the trainer's own bytes), and the default plan holds."""
    use = selection.summary["trainer_memory"]
    assert sorted(use) == ["worker-0", "worker-1"]
    for row in use.values():
        assert row["planned_bytes"] > 0
        assert row["peak_bytes"] > 50 * 2**20  # TensorFlow's own pages: ~120 MiB when forked
    assert selection.summary["memory_over_plan"] == []
    # the machine: both hop trainers and their zygote, once, against the plan's
    (host,) = selection.summary["host_memory"].values()
    assert 0.8 <= host["peak_bytes"] / host["planned_bytes"] <= 1.2, host


def test_a_fit_multiple_that_does_not_fit_is_refused_before_a_trainer_starts(
    env: dict[str, Any], cluster2: Any
) -> None:
    """dvml.plan.fit_multiple gives the hopper's plan (it fits); capped by
    dvml.memory.host-memory to room for one trainer, the same call is refused before any
    trainer starts or any checkpoint is written, with the numbers and the fixes."""
    table = configs(env["arch"], lrs=(0.003, 0.01, 0.001))
    plan = dvml.plan.fit_multiple("mop_digits", table, registry=env["registry"],
                                  client=env["client"])  # fmt: skip
    assert plan.fits, plan.describe()
    assert sorted(t.worker for t in plan.trainers) == ["worker-0", "worker-1"]
    one = plan.trainers[0]
    state = cnn().count_params() * 4 * 3  # Adam: weights and two slots
    assert one.models == 2 * state and one.weights == cnn().count_params() * 4 * 4
    assert {"models", "parked"} <= set(plan.table().columns)
    # the zygote and one trainer with the margin, not two
    cap = int((plan.hosts[0].zygote + 1.5 * one.total) * 1.2)
    with dask.config.set({"dvml.memory.host-memory": cap}), pytest.raises(MemoryPlanError) as info:
        run(env, "mop_too_big", table)
    message = str(info.value)
    assert "dvml.fit_multiple 'mop_too_big'" in message and "No trainer was started" in message
    assert "3 configurations on 2 trainers" in message and "available" in message, message
    assert info.value.plan.hosts[0].room.room == cap and info.value.plan.fixes
    assert worker_trainers(cluster2, model_output="mop_too_big") == []
    assert not list((env["tmp"] / "state").glob("checkpoints/mop_too_big-*"))
    assert not env["registry"].model_exists("mop_too_big_1")


def test_a_running_fit_multiple_holds_its_reservation_against_a_fit(
    env: dict[str, Any], cluster2: Any
) -> None:
    """Capped to room for the fit_multiple alone, a fit started while it trains is refused
    before any of its trainers starts, naming it; the reservation goes when it ends."""
    from dvml.train.fit_admission import read_reservations

    table = configs(env["arch"], lrs=(0.003, 0.01))
    plan = dvml.plan.fit_multiple("mop_digits", table, registry=env["registry"],
                                  client=env["client"])  # fmt: skip
    cap = int(plan.hosts[0].with_margin * 1.5)
    compile_params = table.loc[0, "compile_params"]
    with dask.config.set({"dvml.memory.host-memory": cap}), contextlib.ExitStack() as stack:
        first = Background(lambda seen: run(env, "mop_held", table, num_iterations=3))
        try:
            assert poll_for(lambda: first.done() or read_reservations(env["client"]) != [], 120)
            # its trainers at a tenth of their speed while the checks run: on a fast machine
            # the small job could end (and give its reservation back) before the fit is asked
            stack.enter_context(
                slowed(lambda: worker_trainers(cluster2, model_output="mop_held"), 0.09)
            )
            held = read_reservations(env["client"])
            assert [r["job"] for r in held] == ["dvml.fit_multiple 'mop_held'"], first.outcome
            # `dvml cluster status` shows it beside each worker's vineyardd, and on its own
            status = dvml_command("cluster", "status", "--scheduler", cluster2.scheduler_address,
                                  env={**os.environ, **tls_environment(cluster2)},
                                  timeout=120)  # fmt: skip
            with pytest.raises(MemoryPlanError) as info:
                dvml.fit("mop_digits", "fit_beside_mop", env["arch"], compile_params,
                         "batch_size=32", num_iterations=1, progress=False,
                         registry=env["registry"], client=env["client"])  # fmt: skip
            assert worker_trainers(cluster2, model="fit_beside_mop") == []
        finally:
            stack.close()  # full speed again
            selection = first.result()
    message = str(info.value)
    assert "dvml.fit_multiple 'mop_held'" in message and "No trainer was started" in message
    assert status.returncode == 0, status.stderr
    assert "reserved" in status.stdout and "memory reservations" in status.stdout, status.stdout
    job_rows = [x for x in status.stdout.splitlines() if "dvml.fit_multiple 'mop_held'" in x]
    reserved = format_size(plan.hosts[0].with_margin)
    assert len(job_rows) == 1 and reserved in job_rows[0], status.stdout
    worker_rows = [x for x in status.stdout.splitlines() if x.startswith("worker-")]
    assert len(worker_rows) == 2 and all(reserved in x for x in worker_rows), status.stdout
    assert selection.summary["num_iterations"] == 3
    assert read_reservations(env["client"]) == []  # given back when its trainers stopped


def test_refuses_bad_configs_before_any_trainer(env: dict[str, Any]) -> None:
    with pytest.raises(ArgumentTypeError, match="DataFrame"):
        run(env, "mop_bad", 42)
    with pytest.raises(dvml.DvmlError, match=r"optimizer|parse|Unknown|not"):
        bad = configs(env["arch"])
        bad.loc[0, "compile_params"] = "loss='categorical_crossentropy', optimizer=__import__('os')"
        run(env, "mop_bad", bad)
    assert not env["registry"].model_exists("mop_bad_1")


def test_a_second_run_of_a_running_model_output_is_refused(
    env: dict[str, Any], cluster2: Any
) -> None:
    """Two equal calls at once would share checkpoints: a second ``fit_multiple`` (or an
    ``automl``) of the running ``model_output`` is refused naming who runs it, as a second
    ``fit`` of a model is, and the first trains every iteration."""
    table = configs(env["arch"], lrs=(0.003, 0.01))
    first = Background(lambda seen: run(env, "mop_twice", table, num_iterations=3))
    assert poll_for(
        lambda: first.done() or bool(worker_trainers(cluster2, model_output="mop_twice")), 300
    ), "the first run's trainers never started"
    with pytest.raises(
        FitRunningError, match=r"dvml.fit_multiple refused: the run 'mop_twice'"
    ) as e:
        run(env, "mop_twice", table, num_iterations=3)
    assert "job dvml.fit_multiple" in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    # automl writes the same run and models: one lock for both calls
    grid = {"loss": ["categorical_crossentropy"],
            "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.003]}]}  # fmt: skip
    with pytest.raises(FitRunningError, match=r"dvml.automl refused: the run 'mop_twice'"):
        dvml.automl("mop_digits", "mop_twice", env["arch"], grid, {"batch_size": [32]},
                    method="hyperopt", params="num_configs=2, num_iterations=1",
                    progress=False, registry=env["registry"], client=env["client"])  # fmt: skip
    selection = first.result()
    for k in (1, 2):
        assert selection.model(k).history()["iteration"].tolist() == [1, 2, 3]
    assert "mop_twice_best" not in set(env["registry"].list_model_selections()["name"])


def checkpointed(state_dir: pathlib.Path, output: str, iteration: int, keys: list[int]) -> bool:
    """Whether every model of the fit_multiple run ``output`` has checkpointed ``iteration``:
    what a rerun resumes from (each record is written after its model's state)."""
    found = {p.name for p in state_dir.glob(f"checkpoints/{output}-mop-*/*.npz.json")}
    return all(f"{k}-{iteration}.npz.json" in found for k in keys)


def test_killed_trainer_stops_the_job_and_rerun_resumes(env: dict[str, Any], cluster2: Any) -> None:
    """SIGKILL the job's hop trainer on worker-1 once every model's first iteration is
    checkpointed: the job stops with an error naming worker-1 and the signal, whether the
    trainer was training or waiting for its next hop, and a rerun resumes."""
    table = configs(env["arch"], lrs=(0.003, 0.01))
    fit = Background(lambda seen: run(env, "mop_resume", table, num_iterations=4))
    state = env["tmp"] / "state"
    assert poll_for(lambda: fit.done() or checkpointed(state, "mop_resume", 1, [1, 2]), 300), (
        "the first iteration was never checkpointed"
    )
    # The job's own trainers, by their job file: not a standby, not another job's.
    victims = worker_trainers(cluster2, "worker-1", model_output="mop_resume")
    survivors = worker_trainers(cluster2, "worker-0", model_output="mop_resume")
    assert len(victims) == 1 and len(survivors) == 1, (victims, survivors, fit.outcome)
    os.kill(victims[0], signal.SIGKILL)
    error = fit.error(180)
    assert isinstance(error, TrainerFailedError), repr(error)
    assert "worker-1" in str(error) and "killed by SIGKILL" in str(error), str(error)
    assert poll_for(lambda: all(pid_gone(p) for p in survivors), 30), survivors
    assert not env["registry"].model_exists("mop_resume_1")

    resumed = run(env, "mop_resume", table, num_iterations=4)
    assert resumed.summary["resumed_from_iteration"] >= 1
    for k in (1, 2):
        history = resumed.model(k).history()
        assert history["iteration"].tolist() == [1, 2, 3, 4]


# A killed Dask WORKER process (not only its trainer) and the rerun that resumes: at several
# moments of a job, in tests/train/test_fit_multiple_resume.py.
