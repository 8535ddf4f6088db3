"""``data.append: true`` in a retrain job: a Parquet directory that grows, on the session
cluster ``cluster2``, as real ``python -m workflows.retrain`` runs (issue 39).

Run 1 packs the directory's three files as version 1 and promotes a first model; two files
are added and run 2 appends exactly those (version 2 shares every buffer of version 1, and
its source lists only them), reports drift and warm-starts the candidate from production;
run 3 finds nothing new and does nothing (unless the run that appended failed before its
model was saved: then it trains on those rows); a file with a class value version 1 lacks is
refused naming it, and nothing is written; a run evaluates only the scores it does not
know (the candidate's from its fit, production's from an earlier run).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

import dvml
from dvml.registry import Registry
from tests.helpers import tls_environment, write_job

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.timeout(900)]

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = "wfappend"
COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']"
)


def digits(start: int, stop: int) -> pd.DataFrame:
    from sklearn.datasets import load_digits

    d = load_digits()
    return pd.DataFrame(
        {"pixels": list(d.data[start:stop].astype("float32")), "label": d.target[start:stop]}
    )


def mlp_json(inputs: int = 64) -> str:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    model = keras.Sequential([
        keras.layers.InputLayer(input_shape=(inputs,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])  # fmt: skip
    return str(model.to_json())


class Job:
    def __init__(self, tmp: pathlib.Path, scheduler: str, tls: dict[str, str]) -> None:
        self.tmp = tmp
        self.drops = tmp / "drops"
        self.registry = f"sqlite:///{tmp / 'registry.db'}"
        self.state = tmp / "wf-state" / f"retrain-{NAME}.state.json"
        self.env = {**os.environ, **tls, "TF_CPP_MIN_LOG_LEVEL": "3",
                    "DASK_DVML__CLUSTER__STATE_DIR": str(tmp / "dvml-state")}  # fmt: skip
        (tmp / "mlp.json").write_text(mlp_json())
        self.config = write_job(
            tmp / "job.yaml",
            f"""\
name: {NAME}
state_dir: {tmp / "wf-state"}
registry: {self.registry}
cluster:
  scheduler: {scheduler}
data:
  source: drops/
  x: pixels
  y: label
  normalizing_const: 16.0
  append: true
validation:
  split: 0.25
model:
  architecture: mlp.json
  compile_params: "{COMPILE}"
  fit_params: "batch_size=50, epochs=1"
promotion:
  metric: accuracy
""",
        )

    def run(self, *args: str) -> tuple[int, str]:
        proc = subprocess.run(
            [sys.executable, "-m", "workflows.retrain", "--config", str(self.config), *args],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr

    def read_state(self) -> dict[str, Any]:
        return dict(json.loads(self.state.read_text()))


@pytest.fixture(scope="module")
def job(cluster2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    tmp = tmp_path_factory.mktemp("retrain-appends")
    (tmp / "drops").mkdir()
    for day, start in enumerate(range(0, 1200, 400), 1):
        digits(start, start + 400).to_parquet(tmp / "drops" / f"day-{day}.parquet")
    yield Job(tmp, cluster2.scheduler_address, tls_environment(cluster2))
    for name in dvml.datasets.list(client=cluster2.client)["name"]:
        if name.startswith(NAME):
            dvml.datasets.drop(name, client=cluster2.client)


def object_ids(dataset: Any) -> set[int]:
    return {f["id"] for b in dataset.layout["buffers"] for f in b["fields"].values()}


def test_appends_only_new_files_warm_starts_and_reports_drift(job: Job, cluster2: Any) -> None:
    client = cluster2.client
    code, out = job.run()
    assert code == 0, out
    assert "packing all 3 file(s)" in out, out
    train = dvml.datasets.describe(f"{NAME}-train", client=client)
    val = dvml.datasets.describe(f"{NAME}-val", client=client)
    assert (train.version, val.version, train.rows + val.rows) == (1, 1, 1200)
    assert len(train.versions[0]["source"]["files"]) == 3, train.versions[0]["source"]
    with Registry(job.registry) as registry:
        assert registry.get_model(NAME)["summary"]["promotion"]["data"]["versions"] == {
            "train": 1, "validation": 1}  # fmt: skip

    new = [job.drops / "day-4.parquet", job.drops / "day-5.parquet"]
    digits(1200, 1400).to_parquet(new[0])
    digits(1400, 1600).to_parquet(new[1])
    code, out = job.run("--dry-run")
    assert code == 0 and "append 2 new file(s)" in out, out
    code, out = job.run()
    assert code == 0, out
    assert "2 new file(s)" in out and "drift (PSI, 400 new rows against 1200)" in out, out
    grown = dvml.datasets.describe(f"{NAME}-train", client=client)
    grown_val = dvml.datasets.describe(f"{NAME}-val", client=client)
    assert (grown.version, grown_val.version, grown.rows + grown_val.rows) == (2, 2, 1600)
    assert object_ids(train) <= object_ids(grown) and object_ids(val) <= object_ids(grown_val)
    for ds in (grown, grown_val):
        files = ds.versions[-1]["source"]["files"]
        assert sorted(pathlib.Path(f["path"]).name for f in files) == [p.name for p in new]
    with Registry(job.registry) as registry:
        lineage = registry.get_model(f"{NAME}@candidate")["summary"]["lineage"]
    assert lineage["warm_start"] is True and lineage["parent"]["registered_as"] == NAME
    assert lineage["data"]["training"]["version"] == 2
    outcome = job.read_state()["last_success"]
    assert outcome["data"]["versions"] == {"train": 2, "validation": 2}
    assert outcome["data"]["drift"]["test"] == "psi" and outcome["data"]["drift"]["rows_new"] == 400
    assert len(job.read_state()["appended"]["files"]) == 5
    shown = subprocess.run(
        [sys.executable, "-m", "dvml", "models", "lineage", NAME, "--registry", job.registry],
        env=job.env, capture_output=True, text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    assert f"training: {NAME}-train version 2" in shown and "warm-started from" in shown, shown


def test_nothing_new_does_nothing(job: Job, cluster2: Any) -> None:
    before = dvml.datasets.describe(f"{NAME}-train", client=cluster2.client)
    code, out = job.run()
    assert code == 0, out
    assert "nothing new: no new file" in out and "training" not in out, out
    after = dvml.datasets.describe(f"{NAME}-train", client=cluster2.client)
    assert (after.version, after.summary["dataset_id"]) == (
        before.version, before.summary["dataset_id"])  # fmt: skip


def test_a_new_class_value_is_refused_and_nothing_is_written(job: Job, cluster2: Any) -> None:
    client = cluster2.client
    bad = digits(1600, 1700)
    bad.loc[bad.index[:3], "label"] = 10
    bad.to_parquet(job.drops / "day-6.parquet")
    state = job.state.read_text()
    versions = [dvml.datasets.describe(f"{NAME}-{k}", client=client).version
                for k in ("train", "val")]  # fmt: skip
    code, out = job.run()
    assert code == 1, out
    assert "day-6.parquet holds class value(s) [10]" in out and "Nothing was written" in out, out
    assert "Traceback" not in out, out
    assert job.state.read_text() == state
    assert [dvml.datasets.describe(f"{NAME}-{k}", client=client).version
            for k in ("train", "val")] == versions  # fmt: skip


def test_drift_above_fail_above_is_refused(job: Job, cluster2: Any) -> None:
    (job.drops / "day-6.parquet").unlink()  # the refused file of the test before
    strict = job.config.read_text() + "drift:\n  fail_above: 0.0\n"
    job.config.write_text(strict)
    digits(1600, 1700).to_parquet(job.drops / "day-7.parquet")
    before = dvml.datasets.describe(f"{NAME}-train", client=cluster2.client).version
    code, out = job.run()
    assert code == 1, out
    assert "The new rows drifted" in out and "drift.fail_above=0.0" in out, out
    # the refused run of the test before failed: the journal says so, not "did not finish"
    assert "failed (DataError) (last phase 'appending'" in out, out
    assert ".. Published" not in out, out
    assert dvml.datasets.describe(f"{NAME}-train", client=cluster2.client).version == before


def test_a_run_evaluates_only_what_it_does_not_know(job: Job, cluster2: Any) -> None:
    """The candidate's score is its fit's last validation pass; production's is the one an
    earlier run measured while neither production nor the validation rows changed. Both
    are what dvml.evaluate gives."""
    client = cluster2.client
    digits(1700, 1797).to_parquet(job.tmp / "val.parquet")
    text = job.config.read_text().replace("drift:\n  fail_above: 0.0\n", "")
    job.config.write_text(text.replace("  split: 0.25", f"  source: {job.tmp / 'val.parquet'}"))
    code, out = job.run("--force")  # everything packed again: a validation set of its own
    assert code == 0, out
    assert "measured by an earlier run" not in out, out
    val = f"{NAME}-val"
    production = dvml.evaluate(NAME, val, registry=job.registry, client=client)["metrics"]
    known = job.read_state()["last_success"]["production_score"]
    assert known["value"] == pytest.approx(production["accuracy"], rel=1e-5, abs=1e-6)

    digits(0, 100).to_parquet(job.drops / "day-8.parquet")
    code, out = job.run()
    assert code == 0, out
    assert "1 new file(s)" in out and "measured by an earlier run" in out, out
    # the run before evaluated production, and stopped its serving trainers as it ended
    assert "orphaned" not in out, out
    outcome = job.read_state()["last_success"]
    assert outcome["production_before"] == known["value"]
    candidate = dvml.evaluate(f"{NAME}@candidate", val, registry=job.registry, client=client)
    assert outcome["candidate"] == pytest.approx(
        candidate["metrics"]["accuracy"], rel=1e-5, abs=1e-6
    )


def test_after_a_run_that_failed_in_training_the_next_trains_on_what_it_appended(
    job: Job, cluster2: Any
) -> None:
    """An append whose run then failed leaves rows no model has seen: the next run, with no
    new file, trains on them (it did nothing before), and the one after does nothing."""
    client = cluster2.client
    text = job.config.read_text()
    (job.tmp / "narrow.json").write_text(mlp_json(inputs=32))  # refused at the fit's start
    job.config.write_text(text.replace("architecture: mlp.json", "architecture: narrow.json"))
    digits(100, 200).to_parquet(job.drops / "day-9.parquet")
    code, out = job.run()
    assert code == 1 and "ModelMismatchError" in out and "1 new file(s)" in out, out
    assert job.read_state()["appended"]["trained"] is False
    version = dvml.datasets.describe(f"{NAME}-train", client=client).version
    job.config.write_text(text)
    code, out = job.run()
    assert code == 0, out
    assert f"no run has trained on version {version} of the training set yet" in out, out
    with Registry(job.registry) as registry:
        lineage = registry.get_model(f"{NAME}@candidate")["summary"]["lineage"]
    assert lineage["data"]["training"]["version"] == version
    assert job.read_state()["appended"]["trained"] is True
    code, out = job.run()
    assert code == 0 and "nothing new: no new file" in out and "training" not in out, out
