"""A fit on real trainers leaves the workers responsive, stops when its client dies, runs once
per model, and names what really went wrong (#16 items 6, 7, 13, 15).

``cluster2`` has one thread per worker (``cluster.threads-per-worker: 1``): a launcher that held
its task slot would block every other call on that worker for the whole fit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import dask
import pandas as pd
import pytest

import dvml
from dvml.exceptions import FitRunningError, TrainerFailedError, WorkerDepartedError
from tests.helpers import Background, cnn, pid_gone, poll_for, tls_environment, worker_trainers

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)'"
FIT = "batch_size=32, epochs=3"


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """digits packed on cluster2, a registry in a temporary SQLite file, the CNN registered."""
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target,
        }
    )
    tmp = tmp_path_factory.mktemp("reliability")
    client = cluster2.client
    assert {w["nthreads"] for w in client.scheduler_info()["workers"].values()} == {1}
    settings = {"dvml.cluster.state-dir": str(tmp / "state")}
    with dask.config.set(settings):
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name="rel_digits",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch, "tmp": tmp,
               "settings": settings, "address": cluster2.scheduler_address}  # fmt: skip
        registry.close()
        dvml.datasets.drop("rel_digits", client=client)


def run_fit(env: dict[str, Any], model: str, **kwargs: Any) -> dvml.Model:
    params: dict[str, Any] = {
        "compile_params": COMPILE,
        "fit_params": FIT,
        "num_iterations": 2,
        "progress": False,
        "sync": "iteration",
    }
    params.update(kwargs)
    return dvml.fit(
        "rel_digits", model, env["arch"], registry=env["registry"], client=env["client"], **params
    )


# -- item 6: the control path stays responsive ---------------------------------------------


def test_datasets_list_answers_while_a_fit_runs(env: dict[str, Any], cluster2: Any) -> None:
    with dask.config.set(env["settings"]):
        fit = Background(lambda seen: run_fit(env, "rel_busy", num_iterations=4, on_iteration=seen))
        assert fit.first.wait(300), "the first iteration never finished"
        listed = dvml.datasets.list(client=env["client"])  # a task on every worker
        answered_at = time.monotonic()
        assert "rel_digits" in listed["name"].tolist()
        fit.result()
    assert answered_at < fit.outcome["ended"], "datasets.list() waited for the whole fit"
    assert answered_at < fit.times[-1], "datasets.list() answered only after training"


def test_two_fits_of_different_models_run_at_once(env: dict[str, Any], cluster2: Any) -> None:
    with dask.config.set(env["settings"]):
        fits = [
            Background(lambda seen, m=m: run_fit(env, m, num_iterations=3, on_iteration=seen))
            for m in ("rel_a", "rel_b")
        ]
        most = 0  # trainer processes seen at once: 4 when both fits train side by side
        while any(f.thread.is_alive() for f in fits):
            most = max(most, len(worker_trainers(cluster2, training="rel_digits")))
            time.sleep(0.5)
        models = [f.result() for f in fits]
    for model in models:
        assert model.summary["num_iterations"] == 3
        assert model.summary["weights_identical_on_all_trainers"] is True
    assert most == 4, f"at most {most} trainers ran at once: the fits did not run side by side"


# -- item 13: one fit per model --------------------------------------------------------------


def test_a_second_fit_of_a_running_model_is_refused(env: dict[str, Any], cluster2: Any) -> None:
    with dask.config.set(env["settings"]):
        first = Background(lambda seen: run_fit(env, "rel_twice", num_iterations=3,
                                                on_iteration=seen))  # fmt: skip
        assert first.first.wait(300), "the first iteration never finished"
        with pytest.raises(FitRunningError, match=r"rel_twice.*being trained by another fit") as e:
            run_fit(env, "rel_twice", num_iterations=3)
        assert f"pid {os.getpid()}" in str(e.value) and "job " in str(e.value)
        model = first.result()
        # the first fit trained every iteration; a later fit of the name runs again
        assert model.history()["iteration"].tolist() == [1, 2, 3]
        again = run_fit(env, "rel_twice", num_iterations=1, overwrite=True)
    assert again.summary["num_iterations"] == 1


# -- item 7: a killed client's trainers stop; a rerun resumes --------------------------------

CLIENT_SCRIPT = """
import sys, dask, dvml
address, state_dir, registry = sys.argv[1:4]
with dask.config.set({"dvml.cluster.state-dir": state_dir}):
    cluster = dvml.connect(address)
    dvml.fit("rel_digits", "rel_orphan", int(sys.argv[4]), %r, %r, num_iterations=6,
             sync="iteration", progress=False, registry=dvml.Registry(registry),
             client=cluster.client,
             on_iteration=lambda r: print("ITERATION", r["iteration"], flush=True))
"""


def test_a_killed_clients_trainers_stop_and_a_rerun_resumes(
    env: dict[str, Any], cluster2: Any
) -> None:
    script = CLIENT_SCRIPT % (COMPILE, FIT)
    state_dir = env["settings"]["dvml.cluster.state-dir"]
    registry = f"sqlite:///{env['tmp'] / 'registry.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, env["address"], state_dir, registry, str(env["arch"])],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **tls_environment(cluster2)},  # the cluster's certificate
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the first iteration is checkpointed
        assert line.startswith("ITERATION 1"), line
        trainers = worker_trainers(cluster2, model="rel_orphan")
        assert len(trainers) == 2, trainers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    # the launchers notice that nobody waits for the trainers any more
    assert poll_for(lambda: all(pid_gone(p) for p in trainers), 30), "trainers outlived client"
    with dask.config.set(env["settings"]):
        resumed = run_fit(env, "rel_orphan", num_iterations=6)
    assert resumed.summary["resumed_from_iteration"] >= 1
    assert resumed.history()["iteration"].tolist() == [1, 2, 3, 4, 5, 6]


# -- item 15: a killed trainer is named, with its signal, not TensorFlow's banner ------------


def test_a_killed_trainer_is_named_with_its_signal(env: dict[str, Any], cluster2: Any) -> None:
    with dask.config.set(env["settings"]):
        fit = Background(lambda seen: run_fit(env, "rel_killed", num_iterations=6,
                                              on_iteration=seen))  # fmt: skip
        assert fit.first.wait(300), "the first iteration never finished"
        victims = worker_trainers(cluster2, "worker-1", model="rel_killed")
        survivors = worker_trainers(cluster2, "worker-0", model="rel_killed")
        assert len(victims) == 1 and len(survivors) == 1, (victims, survivors)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(TrainerFailedError) as e:
            fit.result()
    text = str(e.value)
    assert "worker-1" in text and "killed by SIGKILL" in text, text
    for banner in ("This TensorFlow binary", "oneDNN", "absl::InitializeLog", "cuInit"):
        assert banner not in text, text
    # blamed first: the survivor's collective error is not the message
    assert not text.startswith("The trainer on worker worker-0"), text
    assert poll_for(lambda: all(pid_gone(p) for p in victims + survivors), 60)


def test_a_killed_zygote_stops_no_fit_and_a_new_one_forks_the_next_trainers(
    env: dict[str, Any], cluster2: Any
) -> None:
    """The trainers forked by the machine's zygote (dvml.cluster.zygote) need it only to
    start: killed mid-fit, the fit still ends, and the workers' next standbys come from a new
    zygote."""
    import psutil

    from dvml.cluster import standby

    with dask.config.set(env["settings"]):
        fit = Background(lambda seen: run_fit(env, "rel_zygote", num_iterations=4,
                                              on_iteration=seen))  # fmt: skip
        assert fit.first.wait(300), "the first iteration never finished"
        trainers = worker_trainers(cluster2, model="rel_zygote")
        assert len(trainers) == 2
        (zygote,) = {psutil.Process(pid).ppid() for pid in trainers}
        assert "--zygote" in " ".join(psutil.Process(zygote).cmdline())
        os.kill(zygote, signal.SIGKILL)
        model = fit.result(timeout=300)
    assert model.summary["num_iterations"] == 4 and model.summary["metrics_iters"] == [4]

    def new_standbys() -> bool:
        pids = [p for p in env["client"].run(standby.standby_pid).values() if p]
        parents = {psutil.Process(p).ppid() for p in pids if not pid_gone(p)}
        return len(pids) == 2 and len(parents) == 1 and zygote not in parents

    assert poll_for(new_standbys, 60), "the workers' next standbys did not come from a new zygote"


def test_exit_description_drops_the_tensorflow_banner() -> None:
    from dvml.train.runtime.exits import describe_exit

    banner = [
        "2026-11-23 13:37:25.1: I tensorflow/core/util/port.cc:153] oneDNN custom operations "
        "are on. You may see slightly different numerical results. To turn them off, set the "
        "environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1763905045.1 12 cpu_feature_guard.cc:210] This TensorFlow binary is "
        "optimized to use available CPU instructions in performance-critical operations.",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild "
        "TensorFlow with the appropriate compiler flags.",
        # as main printed it for a killed trainer (#16)
        "I0000 00:00:1795442984.602492    2938 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1795442984.605271    2938 cudart_stub.cc:31] Could not find cuda drivers "
        "on your machine, GPU will not be used.",
        "E0000 00:00:1795443018.923520    2938 cuda_platform.cc:52] failed call to cuInit: "
        "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    ]
    text = describe_exit(-9, {}, banner)
    assert "killed by SIGKILL (signal 9)" in text and "TensorFlow's start-up banner" in text
    assert "oneDNN" not in text and "AVX2" not in text and "cuInit" not in text
    assert "MemoryError: boom" in describe_exit(-15, {}, [*banner, "MemoryError: boom"])
    assert describe_exit(1, {"type": "ValueError", "message": "bad shape"}, banner) == (
        "exit code 1, ValueError: bad shape"
    )


def test_a_killed_worker_is_named_not_the_survivor(local_cluster: Any, tmp_path: Any) -> None:
    """SIGKILL one worker process mid-fit: the error names it, not the surviving trainer whose
    collective op was aborted."""
    from sklearn.datasets import load_digits

    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    d = load_digits()
    frame = pd.DataFrame(
        {"pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")), "label": d.target}
    )
    client = cluster.client
    registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name="rel_wk", client=client
        )
        arch = dvml.load_keras_model(cnn().to_json(), registry=registry)
        fit = Background(
            lambda seen: dvml.fit(
                "rel_wk", "rel_wk_model", arch, COMPILE, FIT, num_iterations=8, sync="iteration",
                progress=False, on_iteration=seen, registry=registry, client=client,
            )
        )  # fmt: skip
        assert fit.first.wait(300), "the first iteration never finished"
        os.kill(cluster.processes()["dask worker worker-1"], signal.SIGKILL)
        with pytest.raises(TrainerFailedError) as e:
            fit.result()
    registry.close()
    text = str(e.value)
    assert text.startswith("worker worker-1 on host"), text
    assert "left the cluster during training" in text, text
    # the departed workers, for an elastic fit to go on without them (dvml.train.elastic)
    assert isinstance(e.value, WorkerDepartedError), type(e.value)
    assert [w.name for w in e.value.workers] == ["worker-1"]
