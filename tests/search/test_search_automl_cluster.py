"""dvml.automl (MADlib's madlib_keras_automl) on a real 2-worker LocalCluster with real serving
trainers: Hyperband's diagonals on ONE job (trainers started once, survivors going on from
their state in the cluster), MADlib's .info (s, i, metrics_iters over the whole search),
.summary and .best; hyperopt's batches; the refusals before anything trains. Iris, a small
dense model."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any

import dask
import pytest

import dvml
from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError, FitRunningError, MemoryPlanError
from dvml.search import hyperband as hb
from dvml.search import journal as j
from dvml.search.automl_params import HyperoptParams
from dvml.search.hyperopt_run import Batch, HyperoptRun
from tests.helpers import Background, iris_frame, iris_mlp, poll_for, worker_trainers

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.1, "log"]}],
    "metrics": ["accuracy"],
}
FIT = {"batch_size": [8, 16], "epochs": [1]}


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    frame = iris_frame()
    tmp = tmp_path_factory.mktemp("automl")
    client = cluster2.client
    model = iris_mlp()
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        dvml.training_preprocessor(
            frame.iloc[:120], y="label", x="x", name="automl_iris", overwrite=True, client=client
        )
        dvml.validation_preprocessor(
            frame.iloc[120:], y="label", x="x", training="automl_iris", name="automl_iris_val",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        arch = dvml.load_keras_model(model.to_json(), name="iris_mlp", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch}
        registry.close()
        for name in ("automl_iris", "automl_iris_val"):
            dvml.datasets.drop(name, client=client)


def test_refused_before_anything_trains(env: dict[str, Any]) -> None:
    bad = [
        ({"method": "grid"}, "Unknown automl method"),
        ({"method": "hyperopt", "params": "num_configs=0"}, "must be > 0"),
        ({"method": "hyperopt", "params": "num_iterations=0"}, "must be > 0"),
        ({"method": "hyperopt", "params": "algorithm=atpe"}, "valid algorithms"),
        ({"method": "hyperband", "params": "R=2"}, "R should not be less than eta"),
        ({"method": "hyperband", "resume": True}, "resume=True continues an ASHA search"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ArgumentError, match=message):
            dvml.automl("automl_iris", "refused", env["arch"], COMPILE, FIT,
                        registry=env["registry"], client=env["client"], **kwargs)  # fmt: skip
    assert "refused" not in set(env["registry"].list_models()["name"])


def test_a_search_that_does_not_fit_is_refused_before_a_trainer_starts(
    env: dict[str, Any], cluster2: Any
) -> None:
    """A hyperopt search is planned on its space's largest configurations before any trainer
    starts: capped to 900 MiB (the zygote and two serving trainers, with the margin, need
    about 1 GiB), it is refused with the plan's numbers, and no trainer started."""
    with (
        dask.config.set({"dvml.memory.host-memory": "900MiB"}),
        pytest.raises(MemoryPlanError) as info,
    ):
        dvml.automl("automl_iris", "too_big_search", env["arch"], COMPILE, FIT,
                    method="hyperopt", params="num_configs=3, num_iterations=1",
                    progress=False, registry=env["registry"], client=env["client"])  # fmt: skip
    message = str(info.value)
    assert "dvml.automl 'too_big_search'" in message and "No trainer was started" in message
    assert "3 configurations on 2 trainers (largest batch 16 rows)" in message, message
    assert info.value.plan.hosts[0].room.room == 900 * 2**20
    assert worker_trainers(cluster2, model_output="too_big_search") == []
    assert "too_big_search_1" not in set(env["registry"].list_models()["name"])


def test_hyperband_runs_madlibs_diagonals_with_warm_start(env: dict[str, Any]) -> None:
    result = dvml.automl(
        "automl_iris", "hb_iris", env["arch"], COMPILE, FIT, method="hyperband",
        params="R=3, eta=3, skip_last=0", seed=5, validation_set="automl_iris_val",
        progress=False, registry=env["registry"], client=env["client"],
    )  # fmt: skip
    # R=3: bracket 1 has 3 configurations for 1 iteration, then its best for 3 more; bracket 0
    # has 2 configurations for 3 iterations (diagonal 1)
    assert [tuple(r) for r in dvml.hyperband_schedule(3)] == [(1, 0, 3, 1), (1, 1, 1, 3),
                                                                (0, 0, 2, 3)]  # fmt: skip
    info = result.info.set_index("mst_key")
    assert list(info.index) == [1, 2, 3, 4, 5]
    assert list(info["s"]) == [1, 1, 1, 0, 0]
    survivor = int(info.loc[[1, 2, 3], "validation_loss_final"].idxmin())
    assert info.loc[survivor, "i"] == 1
    assert all(info.loc[k, "i"] == 0 for k in (1, 2, 3, 4, 5) if k != survivor)
    # metrics_iters over the whole search (MADlib's global iteration counter)
    assert info.loc[survivor, "metrics_iters"] == [1, 4]
    assert len(info.loc[survivor, "validation_loss"]) == 2
    for k in (1, 2, 3):
        if k != survivor:
            assert info.loc[k, "metrics_iters"] == [1]
    assert info.loc[4, "metrics_iters"] == [4] and info.loc[5, "metrics_iters"] == [4]
    summary = result.summary
    # ONE job for the whole search: the same trainer process on each worker in both diagonals
    # (a job per diagonal would show a new pid per worker and diagonal) ...
    pids = summary["trainer_pids"]
    assert sorted(pids) == ["worker-0", "worker-1"] and all(len(p) == 1 for p in pids.values())
    assert summary["model_iterations"] == 3 * 1 + 3 + 2 * 3
    # ... and the survivor went on from its state in the cluster: every model is registered
    # once, at the end (a warm start from the registry needs one registered per diagonal)
    for k in range(1, 6):
        assert env["registry"].get_model(f"hb_iris_{k}")["version"] == 1
    assert summary["automl_method"] == "hyperband"
    assert summary["automl_params"] == "R=3, eta=3, skip_last=0"
    assert summary["random_state"] == 5
    assert summary["automl_loss"] == "validation_loss_final"
    best_key = int(info["validation_loss_final"].idxmin())
    assert summary["best_mst_key"] == best_key
    best = result.best_config
    assert len(best) == 1 and int(best["mst_key"].iloc[0]) == best_key
    # dvml's dashboard page: the brackets as the search left them, from the scheduler's events
    from dvml.dashboard.views import searches_view

    events = env["client"].get_events("dvml-search-hb_iris")
    (page,) = searches_view({"dvml-search-hb_iris": events})
    assert page["method"] == "hyperband" and page["state"] == "finished", page
    assert (page["diagonal"], page["diagonals"]) == (2, 2) and page["best"]["trial"] == best_key
    brackets = {b["s"]: (b["round"], b["keys"], b["iterations"]) for b in page["brackets"]}
    assert brackets == {1: (1, [survivor], 4), 0: (0, [4, 5], 3)}, page["brackets"]
    assert best["compile_params"].iloc[0] == info.loc[best_key, "compile_params"]
    # the journal replays into a fresh scheduler
    replayed = j.replay(j.Journal.loads(summary["journal"]), hb.HyperbandRun(3, 3, 0))
    assert replayed.next_diagonal() is None
    # any configuration's model evaluates like a fit_multiple result
    scores = dvml.evaluate(result.best().name, "automl_iris_val", registry=env["registry"],
                           client=env["client"])  # fmt: skip
    assert scores["loss"] == pytest.approx(info.loc[best_key, "validation_loss_final"], rel=1e-3)


def test_hyperopt_gives_num_configs_rows_and_one_best(env: dict[str, Any]) -> None:
    result = dvml.automl(
        "automl_iris", "hyperopt_iris", env["arch"], COMPILE, FIT, method="hyperopt",
        params="num_configs=5, num_iterations=1, algorithm=tpe", seed=3, progress=False,
        registry=env["registry"], client=env["client"],
    )  # fmt: skip
    info = result.info
    assert list(info["mst_key"]) == [1, 2, 3, 4, 5]
    assert len({(r.compile_params, r.fit_params) for r in info.itertuples()}) == 5
    assert all(m == [1] for m in info["metrics_iters"])
    assert result.summary["automl_loss"] == "training_loss_final"  # no validation set
    assert result.summary["automl_params"] == "num_configs=5, num_iterations=1, algorithm=tpe"
    # the run's times have the form of every other summary's (UTC, seconds, with the offset)
    times = [result.summary[f] for f in ("start_training_time", "end_training_time")]
    times += [result.model(1).summary["start_training_time"]]
    for text in times:
        moment = datetime.datetime.fromisoformat(text)
        assert moment.utcoffset() == datetime.timedelta(0) and moment.microsecond == 0, text
    assert times[0] <= times[2] <= times[1], times
    best = result.best_config
    assert len(best) == 1
    losses = info.set_index("mst_key")["training_loss_final"]
    assert int(best["mst_key"].iloc[0]) == int(losses.idxmin())
    # 2 workers: MADlib's batches [1, 2], [3, 4], [5]; the journal replays
    fresh = HyperoptRun(SearchSpace(env["arch"], COMPILE, FIT), HyperoptParams(5, 1, "tpe"), 2, 3)
    replayed = j.replay(j.Journal.loads(result.summary["journal"]), fresh)
    assert [b.keys for _, b in replayed.journal.pairs() if isinstance(b, Batch)] == [
        [1, 2], [3, 4], [5],
    ]  # fmt: skip


def test_a_second_search_of_a_running_model_output_is_refused(
    env: dict[str, Any], cluster2: Any
) -> None:
    """Two equal searches at once would share checkpoints: the second is refused naming the
    running one, and the first finishes every configuration."""

    def search() -> dvml.AutoMLResult:
        return dvml.automl(
            "automl_iris", "automl_twice", env["arch"], COMPILE, FIT, method="hyperopt",
            params="num_configs=2, num_iterations=4", seed=1, progress=False,
            registry=env["registry"], client=env["client"],
        )  # fmt: skip

    first = Background(lambda seen: search())
    assert poll_for(
        lambda: first.done() or bool(worker_trainers(cluster2, model_output="automl_twice")),
        300,
    ), "the first search's trainers never started"
    with pytest.raises(FitRunningError, match=r"dvml.automl refused: the run 'automl_twice'") as e:
        search()
    assert "job dvml.automl 'automl_twice'" in str(e.value), str(e.value)
    assert f"pid {os.getpid()}" in str(e.value)
    result = first.result()
    assert list(result.info["mst_key"]) == [1, 2]
    assert all(m == [4] for m in result.info["metrics_iters"]), result.info["metrics_iters"]
