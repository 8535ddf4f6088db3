"""dvml.automl(method="asha") on a real 2-worker LocalCluster with real serving trainers: the
ASHA state machine on ONE job whose trainers never restart (promotions resume parked models
from their state), a NaN configuration failed and ranked last while the search goes on, the
data packed once (no new vineyard object, one trainer process per worker for the whole search),
and a search whose client was SIGKILLed resumed from its journal. Iris, a small dense model."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import dask
import pandas as pd
import pytest

import dvml
from dvml.search import journal as j
from dvml.search.asha import Asha
from tests.helpers import (
    Background,
    iris_frame,
    iris_mlp,
    poll_for,
    tls_environment,
    worker_trainers,
)
from tests.helpers.browser import get_json, rendered_text
from tests.helpers.polling import poll_until
from tests.helpers.vineyard_probes import snapshot

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.003, 0.01, 0.03, 0.1]}],
    "metrics": ["accuracy"],
}
FIT = {"batch_size": [8, 16], "epochs": [1]}
PARAMS = "max_t=9, eta=3, grace_period=1, max_configs=8"


@pytest.fixture(scope="module")
def env(cluster2: Any) -> Iterator[dict[str, Any]]:
    frame = iris_frame()
    home = pathlib.Path(tempfile.mkdtemp(prefix="dvml-asha-home-"))
    home.chmod(0o755)
    client = cluster2.client
    model = iris_mlp()
    settings = {"dvml.cluster.state-dir": str(home / "state")}
    with dask.config.set(settings):
        dvml.training_preprocessor(
            frame.iloc[:120], y="label", x="x", name="asha_iris", overwrite=True, client=client
        )
        dvml.validation_preprocessor(
            frame.iloc[120:], y="label", x="x", training="asha_iris", name="asha_iris_val",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{home / 'registry.db'}")
        arch = dvml.load_keras_model(model.to_json(), name="iris_mlp", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch, "home": home,
               "settings": settings, "address": cluster2.scheduler_address}  # fmt: skip
        registry.close()
        for name in ("asha_iris", "asha_iris_val"):
            dvml.datasets.drop(name, client=client)
    shutil.rmtree(home, ignore_errors=True)


def _iterations_by_trial(info: pd.DataFrame) -> dict[int, int]:
    return {int(r.mst_key): int(r.iterations) for r in info.itertuples()}


def test_asha_promotes_parked_models_on_one_job_with_the_data_packed_once(
    env: dict[str, Any], cluster2: Any, tmp_path: pathlib.Path
) -> None:
    datasets_before = set(dvml.datasets.list(client=env["client"])["name"])
    vineyard_before = snapshot(cluster2)
    page = cluster2.dvml_dashboard_link

    def search(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.automl(
                "asha_iris", "asha_run", env["arch"], COMPILE, FIT, method="asha", params=PARAMS,
                seed=7, validation_set="asha_iris_val", metrics_compute_frequency=1,
                progress=True, registry=env["registry"], client=env["client"],
            )  # fmt: skip

    running = Background(search)

    # dvml's dashboard page follows the search while it runs: its rungs fill, trials park
    def live_search() -> Any:
        shown = get_json(f"{page}/api/searches.json")
        mine = [s for s in shown if s["model_output"] == "asha_run" and s["state"] == "running"]
        return next((s for s in mine if s["rungs"].get("0", 0) >= 2), None)

    live = poll_until(
        live_search, timeout=120, what="the running search with results at its first rung"
    )
    seen = rendered_text(page, tmp_path)
    result = running.result(timeout=600)
    assert "asha_run" in seen and "rung 0:" in seen, seen[:1000]
    assert live["best"] is not None and len(live["trials"]) >= 2
    info = result.info.set_index("mst_key")
    summary = result.summary
    # rungs at 1, 3, 9 iterations; 8 configurations, each at least to the first rung
    assert summary["rungs"] == [1, 3, 9]
    assert list(info.index) == list(range(1, 9))
    assert summary["rung_sizes"][0] == 8 and summary["rung_sizes"][1] >= 2
    assert set(info["status"]) <= {"parked", "finished"}
    promoted = [k for k, n in _iterations_by_trial(result.info).items() if n > 1]
    assert promoted, info[["iterations", "validation_loss_final"]]
    # A promoted model resumed from its parked state: its iterations are contiguous, each
    # trained once (no model retrained from scratch), evaluated after every iteration.
    for k in promoted:
        assert info.loc[k, "metrics_iters"] == list(range(1, int(info.loc[k, "iterations"]) + 1))
    assert summary["model_iterations"] == int(info["iterations"].sum())
    # Data once: one trainer process per worker for the whole search (each opened its
    # partitions once, at its start), no dataset and no vineyard object created by the search.
    assert sorted(summary["trainer_pids"]) == ["worker-0", "worker-1"]
    assert all(len(p) == 1 for p in summary["trainer_pids"].values()), summary["trainer_pids"]
    assert set(dvml.datasets.list(client=env["client"])["name"]) == datasets_before
    assert snapshot(cluster2) == vineyard_before
    # MADlib's outputs: one model per configuration, .best, the journal replays
    models = set(env["registry"].list_models()["name"])
    assert {f"asha_run_{k}" for k in info.index} <= models
    best_key = summary["best_mst_key"]
    top = max(info["rung"])
    at_top = info[info["rung"] == top]
    assert best_key == int(at_top["validation_loss_final"].idxmin())
    assert int(result.best_config["mst_key"].iloc[0]) == best_key
    assert summary["automl_method"] == "asha" and summary["status"] == "finished"
    replayed = Asha.from_journal(summary["journal"])
    assert replayed.rung_sizes() == summary["rung_sizes"]
    scores = dvml.evaluate(f"asha_run_{best_key}", "asha_iris_val", registry=env["registry"],
                           client=env["client"])  # fmt: skip
    assert scores["loss"] == pytest.approx(info.loc[best_key, "validation_loss_final"], rel=1e-3)
    # the checkpoints are gone once the models are registered
    assert not list((env["home"] / "state" / "checkpoints").glob("asha_run-asha-*/*"))
    # the page's view of the finished search is the search's own (from its journal)
    (shown,) = [s for s in get_json(f"{page}/api/searches.json") if s["model_output"] == "asha_run"]
    assert shown["state"] == "stopped"
    assert shown["rungs"] == {str(r): n for r, n in enumerate(summary["rung_sizes"]) if n}
    assert shown["best"]["trial"] == best_key
    assert {t["trial"] for t in shown["trials"]} == set(info.index)
    hops = [j for j in get_json(f"{page}/api/hop_jobs.json") if j["model"] == "asha_run"]
    assert hops and hops[0]["state"] == "done"
    # an iteration of a model is a hop on each worker (MOP)
    assert sum(m["hops"] for m in hops[0]["models"]) == 2 * summary["model_iterations"]


def test_a_nan_configuration_is_failed_ranked_last_and_the_search_goes_on(
    env: dict[str, Any],
) -> None:
    compile_grid = {
        "loss": ["categorical_crossentropy"],
        "optimizer_params_list": [{"optimizer": ["SGD"], "lr": [0.01, 1e30]}],
        "metrics": ["accuracy"],
    }
    with dask.config.set(env["settings"]):
        result = dvml.automl(
            "asha_iris", "asha_nan", env["arch"], compile_grid, FIT, method="asha",
            params="max_t=3, eta=2, grace_period=1, max_configs=4", seed=1, progress=False,
            registry=env["registry"], client=env["client"],
        )  # fmt: skip
    info = result.info.set_index("mst_key")
    assert len(info) == 4
    huge = [k for k in info.index if "1e+30" in info.loc[k, "compile_params"]
            or "1e30" in info.loc[k, "compile_params"]]  # fmt: skip
    assert len(huge) == 2, info["compile_params"]
    assert all(info.loc[k, "status"] == "failed" for k in huge)
    sane = [k for k in info.index if k not in huge]
    assert all(info.loc[k, "status"] in ("parked", "finished") for k in sane)
    assert max(info.loc[sane, "iterations"]) == 3  # the search went on to the top rung
    assert result.summary["best_mst_key"] in sane
    fails = [d for _, d in j.Journal.loads(result.summary["journal"]).pairs()
             if isinstance(d, j.Fail)]  # fmt: skip
    assert sorted(d.trial_id for d in fails) == sorted(huge)
    assert all("not a finite number" in d.reason for d in fails)


CLIENT_SCRIPT = """
import sys, dask, dvml
address, state_dir, registry, arch, params = sys.argv[1:6]
compile_grid = %(compile)r
fit_grid = %(fit)r
with dask.config.set({"dvml.cluster.state-dir": state_dir, "dvml.train.client-timeout": 20}):
    cluster = dvml.connect(address)
    reg = dvml.Registry(registry)
    dvml.automl("asha_iris", "asha_resume", int(arch), compile_grid, fit_grid, method="asha",
                params=params, seed=11, validation_set="asha_iris_val", progress=True,
                registry=reg, client=cluster.client)
"""
RESUME_PARAMS = "max_t=27, eta=3, grace_period=3, max_configs=6"


def _journal(registry: Any) -> j.Journal | None:
    try:
        summary = registry.model_selection_run("asha_resume")["summary"]
    except dvml.exceptions.RegistryNotFoundError:
        return None
    return j.Journal.loads(summary["journal"])


def test_a_search_whose_client_was_killed_resumes_from_its_journal(
    env: dict[str, Any], cluster2: Any
) -> None:
    script = CLIENT_SCRIPT % {"compile": COMPILE, "fit": FIT}
    state_dir = env["settings"]["dvml.cluster.state-dir"]
    registry = f"sqlite:///{env['home'] / 'registry.db'}"
    argv = [sys.executable, "-c", script, env["address"], state_dir, registry,
            str(env["arch"]), RESUME_PARAMS]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **tls_environment(cluster2)},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()

    def results() -> int:
        journal = _journal(env["registry"])
        return 0 if journal is None else sum(isinstance(d, j.Park) for _, d in journal.pairs())

    try:
        # killed once three models are parked at a rung and a promotion may be under way
        assert poll_for(lambda: results() >= 3 or proc.poll() is not None, 300), lines[-20:]
        assert proc.poll() is None, "".join(lines[-30:])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    # the killed client's trainers are gone (its lease), so no checkpoint is written any more
    assert poll_for(lambda: not worker_trainers(cluster2, model_output="asha_resume"), 60)
    before = _journal(env["registry"])
    assert before is not None
    state = env["home"] / "state" / "checkpoints"
    on_disk: dict[int, int] = {}
    for path in state.glob("asha_resume-asha-*/*.npz"):
        k, t = (int(x) for x in path.name[: -len(".npz")].split("-"))
        on_disk[k] = max(on_disk.get(k, 0), t)
    with dask.config.set(env["settings"]):
        result = dvml.automl(
            "asha_iris", "asha_resume", env["arch"], COMPILE, FIT, method="asha",
            params=RESUME_PARAMS, seed=11, validation_set="asha_iris_val", progress=True,
            resume=True, registry=env["registry"], client=env["client"],
        )  # fmt: skip
    after = j.Journal.loads(result.summary["journal"])
    # every decision of the killed run is kept, in order; then the resume
    assert after.records[: len(before.records)] == before.records
    resume_at = len(before.records)
    assert after.records[resume_at]["event"]["type"] == "resume"
    queued = after.records[resume_at]["decision"]["trial_ids"]
    assert queued, "no model was in flight when the client was killed"
    killed = Asha.from_journal(before)
    resumed = {int(k): int(t) for k, t in result.summary["resumed_from"].items()}
    for k, trial in killed.trials.items():
        if k in queued:
            # in flight: it goes on from its last checkpointed iteration (it loses at most the
            # iteration it was training), never from before its last rung
            assert resumed.get(k, 0) == on_disk.get(k, 0) >= trial.iterations
        elif trial.status in ("parked", "finished"):
            assert resumed[k] == trial.iterations  # from its rung's state: not trained again
    info = result.info
    assert result.summary["status"] == "finished"
    assert result.summary["model_iterations"] == int(info["iterations"].sum())
    # this run trained only what was not checkpointed before
    assert result.summary["trained_iterations"] == int(info["iterations"].sum()) - sum(
        resumed.values()
    )


def test_a_killed_trainer_fails_its_configuration_and_the_search_goes_on(
    env: dict[str, Any], cluster2: Any
) -> None:
    """SIGKILL the search's trainer on worker-1 once a model is parked: the configuration it
    was training is failed (ranked last), the worker is left out, its rows copied onto
    worker-0, and the search finishes on worker-0 with every other configuration."""
    from tests.helpers import Background

    def run(seen: Any) -> Any:
        with dask.config.set(env["settings"]):
            return dvml.automl(
                "asha_iris", "asha_kill", env["arch"], COMPILE, FIT, method="asha",
                params="max_t=9, eta=3, grace_period=3, max_configs=5", seed=5,
                validation_set="asha_iris_val", progress=True, registry=env["registry"],
                client=env["client"],
            )  # fmt: skip

    search = Background(run)

    def parked() -> bool:
        try:
            text = env["registry"].model_selection_run("asha_kill")["summary"]["journal"]
        except dvml.exceptions.RegistryNotFoundError:
            return False
        return any(isinstance(d, j.Park) for _, d in j.Journal.loads(text).pairs())

    assert poll_for(lambda: search.done() or parked(), 300), search.outcome
    victims = worker_trainers(cluster2, "worker-1", model_output="asha_kill")
    assert len(victims) == 1, (victims, search.outcome)
    os.kill(victims[0], signal.SIGKILL)
    result = search.result(600)
    info = result.info.set_index("mst_key")
    journal = j.Journal.loads(result.summary["journal"])
    fails = [d for _, d in journal.pairs() if isinstance(d, j.Fail)]
    assert fails, info[["status", "iterations"]]
    assert any("worker-1" in d.reason and "SIGKILL" in d.reason for d in fails), fails
    # after the kill, every job went to worker-0
    killed_at = next(n for n, (_, d) in enumerate(journal.pairs()) if isinstance(d, j.Fail))
    later = [d for n, (_, d) in enumerate(journal.pairs())
             if n > killed_at and isinstance(d, j.Start | j.Promote)]  # fmt: skip
    assert all(d.worker == "worker-0" for d in later), later
    assert len(info) == 5 and result.summary["status"] == "finished"
    # worker-1's rows were copied onto worker-0, not left out: every iteration after the kill
    # still trains on the whole training set (main trained on worker-0's rows only, unsaid)
    summary = result.summary
    assert summary["departed"] == ["worker-1"], summary
    assert summary["rows_left_out"] == 0 and summary["repinned_rows"] > 0, summary
    layout = dvml.datasets.describe("asha_iris", client=env["client"]).layout
    assert {b["worker_name"] for b in layout["buffers"]} == {"worker-0"}, layout
    failed = set(info.index[info["status"] == "failed"])
    assert result.summary["best_mst_key"] not in failed
    assert set(info["status"]) - {"failed"} <= {"parked", "finished"}
