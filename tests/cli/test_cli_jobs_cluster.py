"""``dvml fit|evaluate|predict --config`` and ``dvml datasets|models`` against a real cluster.

A user's session, step by step, as subprocess calls of ``python -m dvml``: train from the
newest of two Parquet drops with an architecture in a Keras JSON file, look at the datasets
and the model, evaluate, predict to a file, drop a dataset. Runs on the session cluster
``cluster2``; the cluster recorded by ``dvml cluster up`` is stood in for by a state file
that points at it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import psutil
import pytest

import dvml
from tests.helpers import tls_environment

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.timeout(900)]

NAME = "clijob"
COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']"
)


class Session:
    def __init__(self, tmp: pathlib.Path, scheduler: str, tls: dict[str, str]) -> None:
        self.tmp = tmp
        self.scheduler = scheduler
        self.registry = f"sqlite:///{tmp / 'registry.db'}"
        self.rows = (0, 0)  # training and validation rows, found by the first test
        self.env = {
            **os.environ,
            "DASK_DVML__CLUSTER__STATE_DIR": str(tmp / "dvml-state"),
            "TF_CPP_MIN_LOG_LEVEL": "3",
            **tls,  # the session cluster's certificate, as a user's Dask config would give it
        }

    def dvml(self, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dvml", *args], capture_output=True, text=True,
            timeout=timeout, check=False, env=self.env,
        )  # fmt: skip

    def ok(self, *args: str, timeout: float = 400) -> str:
        result = self.dvml(*args, timeout=timeout)
        assert result.returncode == 0, (args, result.stdout, result.stderr[-3000:])
        return result.stdout


def digits_frame(n: int) -> pd.DataFrame:
    from sklearn.datasets import load_digits

    d = load_digits()
    return pd.DataFrame(
        {
            "id": np.arange(n),
            "pixels": list(d.data[:n].astype("float32")),  # 64 values per row
            "label": d.target[:n],
        }
    )


def mlp_json() -> str:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    model = keras.Sequential(
        [
            keras.layers.InputLayer(input_shape=(64,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    return str(model.to_json())


@pytest.fixture(scope="module")
def session(cluster2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    tmp = tmp_path_factory.mktemp("cli-jobs")
    drops = tmp / "drops"
    drops.mkdir()
    digits_frame(1797).to_parquet(drops / "day-1.parquet")
    newest = drops / "day-2.parquet"
    digits_frame(600).to_parquet(newest)
    old = time.time() - 3600
    os.utime(drops / "day-1.parquet", (old, old))
    (tmp / "mlp.json").write_text(mlp_json())
    registry = f"sqlite:///{tmp / 'registry.db'}"
    (tmp / "job.yaml").write_text(
        f"""\
name: {NAME}
registry: {registry}
data:
  source: drops/day-*.parquet
  x: pixels
  y: label
  normalizing_const: 16.0
validation:
  split: 0.25
model:
  architecture: mlp.json
  compile_params: "{COMPILE}"
  fit_params: "batch_size=50, epochs=2"
predict:
  pred_type: 2
  output: predictions.csv
"""
    )
    state = Session(tmp, cluster2.scheduler_address, tls_environment(cluster2))
    yield state
    table = dvml.datasets.list(client=cluster2.client)
    for name in table["name"]:
        if name.startswith(NAME):
            dvml.datasets.drop(name, client=cluster2.client)


def test_fit_from_the_newest_parquet_drop(session: Session) -> None:
    config = str(session.tmp / "job.yaml")
    out = session.ok("fit", "--config", config, "--scheduler", session.scheduler)
    assert "newest match of drops/day-*.parquet" in out
    found = re.search(rf"{NAME}-train: (\d+) rows; {NAME}-val: (\d+) rows\.", out)
    assert found, out
    session.rows = (int(found[1]), int(found[2]))
    assert sum(session.rows) == 600  # the newest drop only; about 0.25 held out
    assert 100 <= session.rows[1] <= 200
    assert f"Model {NAME!r} version 1 saved" in out
    # The architecture file is registered once; a second fit reuses it and warm-starts.
    out = session.ok("fit", "--config", config, "--scheduler", session.scheduler)
    assert "warm start" in out and f"Model {NAME!r} version 2 saved" in out
    listed = json.loads(session.ok("models", "list", "--registry", session.registry, "--json"))
    assert [(m["name"], m["version"]) for m in listed] == [(NAME, 2)]


def test_fit_dry_run_prints_the_memory_plan_and_starts_nothing(
    session: Session, cluster2: Any
) -> None:
    """On the running cluster, ``--dry-run`` prints the pack's and the trainers' memory plan
    (from the layout of the training set the first test packed) and changes nothing: the
    datasets, the model and the registry are as they were, and no trainer started."""
    from tests.helpers import worker_trainers

    config = str(session.tmp / "job.yaml")
    before = dvml.datasets.describe(f"{NAME}-train", client=cluster2.client).summary
    registry = pathlib.Path(session.registry[len("sqlite:///") :])
    stamp = registry.stat().st_mtime_ns
    out = session.ok("fit", "--config", config, "--scheduler", session.scheduler, "--dry-run")
    assert "Memory plan (dry run" in out, out
    assert f"pack of {NAME}-train into shared memory: fits" in out, out
    assert f"trainers on {NAME}-train's layout: fit their hosts" in out, out
    trainer_rows = [x for x in out.splitlines() if x.startswith("worker-")]
    assert len(trainer_rows) == 2 and all("MiB" in x for x in trainer_rows), out
    after = dvml.datasets.describe(f"{NAME}-train", client=cluster2.client).summary
    assert after["dataset_id"] == before["dataset_id"]
    assert registry.stat().st_mtime_ns == stamp
    assert worker_trainers(cluster2, model=NAME) == []
    # fit-multiple's dry run: the hopper's plan, two configurations of the same MLP
    mop = session.tmp / "mop.yaml"
    mop.write_text(
        f"""\
name: {NAME}
registry: sqlite:///{session.tmp / "mop-registry.db"}
data:
  source: drops/day-*.parquet
  x: pixels
  y: label
  normalizing_const: 16.0
validation:
  split: 0.25
model_selection:
  architectures: [mlp.json]
  compile_params_grid:
    loss: [categorical_crossentropy]
    optimizer_params_list:
      - optimizer: [Adam]
        lr: [0.001, 0.01]
    metrics: [accuracy]
  fit_params_grid: {{batch_size: [16], epochs: [1]}}
fit_multiple:
  num_iterations: 1
"""
    )
    out = session.ok("fit-multiple", "--config", str(mop), "--scheduler", session.scheduler,
                     "--dry-run")  # fmt: skip
    assert f"trainers on {NAME}-train's layout: fit their hosts" in out, out
    assert "2 configurations: each trainer keeps every one compiled" in out, out
    assert len([x for x in out.splitlines() if x.startswith("worker-")]) == 2, out
    assert not (session.tmp / "mop-registry.db").exists()
    assert worker_trainers(cluster2, model_output=NAME) == []


def test_datasets_commands_with_the_recorded_cluster(session: Session) -> None:
    # What `dvml cluster up` writes, pointing at the session cluster; this test process
    # stands in for its serve process (same pid and start time).
    state = session.tmp / "cluster-state"
    state.mkdir()
    (state / "cluster.json").write_text(json.dumps({
        "pid": os.getpid(), "start_time": psutil.Process().create_time(),
        "scheduler_address": session.scheduler,
    }))  # fmt: skip
    where = ["--state-dir", str(state)]
    out = session.ok("datasets", "list", *where)
    lines = [line.split() for line in out.splitlines()]
    assert lines[0][:5] == ["name", "kind", "rows", "version", "buffers"]
    rows = {line[0]: line for line in lines[1:]}
    train, val = session.rows
    assert rows[f"{NAME}-train"][1:3] == ["dataset", str(train)]
    assert rows[f"{NAME}-val"][1:3] == ["dataset", str(val)]

    records = json.loads(session.ok("datasets", "list", "--json", *where))
    found = {r["name"]: r for r in records}[f"{NAME}-train"]
    assert found["rows"] == train
    assert rows[f"{NAME}-train"][3] == str(found["version"])  # each job file run packs anew
    described = json.loads(session.ok("datasets", "describe", f"{NAME}-train", "--json", *where))
    assert found["version"] == described["version"] == described["versions"][-1]["version"]
    assert {r["status"] for r in records} == {"intact"}

    out = session.ok("datasets", "describe", f"{NAME}-train", "--placement", *where)
    assert f"name:     {NAME}-train" in out
    assert f"rows:     {train} in 2 buffers" in out
    assert "status:   intact" in out
    assert "distribution_rules: 'all_workers' -> worker-0, worker-1" in out
    assert "normalizing_const: 16.0" in out
    assert "worker_name  host" in out and "buffer  worker_name" in out
    described = json.loads(session.ok("datasets", "describe", f"{NAME}-val", "--json", *where))
    assert described["summary"]["training_dataset"]["name"] == f"{NAME}-train"


def test_models_describe(session: Session) -> None:
    out = session.ok("models", "describe", NAME, "--registry", session.registry)
    assert f"name:       {NAME}" in out and "version:    2" in out
    assert f"source_table: {NAME}-train" in out
    assert "warm_start: True" in out and "trainers: ['worker-0', 'worker-1']" in out
    history = out.split("\n\n")[-1].splitlines()
    assert history[0].startswith("iteration  training_loss")
    assert len(history) == 2  # one evaluated iteration
    shown = json.loads(session.ok("models", "describe", NAME, "--registry", session.registry,
                                  "--json"))  # fmt: skip
    assert shown["summary"]["validation_table"] == f"{NAME}-val"
    assert shown["iterations"][0]["iteration"] == 1


def test_evaluate_and_predict(session: Session) -> None:
    config = str(session.tmp / "job.yaml")
    where = ["--scheduler", session.scheduler]
    out = session.ok("evaluate", "--config", config, *where)
    val = session.rows[1]
    assert out.startswith(f"Model {NAME!r} on '{NAME}-val' ({val} rows): loss=")
    result = json.loads(session.ok("evaluate", "--config", config, "--json", *where))
    assert result["rows"] == val and 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert result["loss"] > 0

    out = session.ok("predict", "--config", config, *where)
    path = session.tmp / "predictions.csv"  # predict.output, relative to the job file
    assert f"Wrote 1200 predictions of model {NAME!r} to {path}" in out
    frame = pd.read_csv(path)
    assert len(frame) == 1200 and set(frame["rank"]) == {1, 2}  # pred_type 2: top two
    assert list(frame.columns) == ["id", "class_name", "class_value", "prob", "rank"]
    assert sorted(set(frame["id"])) == list(range(600))  # the newest drop only

    out = session.ok("predict", "--config", config, "--limit", "3", "--output",
                     str(session.tmp / "p.parquet"), *where)  # fmt: skip
    assert len(pd.read_parquet(session.tmp / "p.parquet")) == 1200
    bad = session.dvml("predict", "--config", config, "--output", "p.txt", *where)
    assert bad.returncode == 1 and "must end in .csv or .parquet" in bad.stderr


def test_drop_and_errors(session: Session) -> None:
    where = ["--scheduler", session.scheduler]
    out = session.ok("datasets", "drop", f"{NAME}-val", *where)
    assert out.startswith(f"Dropped dataset '{NAME}-val': freed ")
    gone = session.dvml("datasets", "describe", f"{NAME}-val", *where)
    assert gone.returncode == 1
    assert gone.stderr.strip() == (
        f"dvml: error: No dataset named '{NAME}-val' in vineyard. List datasets with "
        "dvml.datasets.list() or `dvml datasets list`."
    )
    again = session.dvml("datasets", "drop", f"{NAME}-val", *where)
    assert again.returncode == 1 and len(again.stderr.strip().splitlines()) == 1
    assert "nothing to drop" in session.ok("datasets", "drop", f"{NAME}-val", "--missing-ok",
                                           *where)  # fmt: skip
    config = str(session.tmp / "job.yaml")
    missing = session.dvml("evaluate", "--config", config, *where)
    assert missing.returncode == 1
    assert f"`dvml fit --config {config}` builds '{NAME}-val'" in missing.stderr
    assert "Traceback" not in missing.stderr
