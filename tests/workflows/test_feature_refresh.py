"""``python -m workflows.feature_refresh`` on the session cluster, then ``dvml features ...``.

The images are two small synthetic drops (Pillow PNGs, one sub-folder per label); the backbone
is a tiny CNN registered with its weights; the head a Keras JSON file. The run computes the
feature caches, trains the head, and a later run with a changed head finds the caches by key
(no backbone batch runs) and warm-starts the head.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import dvml
from tests.helpers import keras, poll_for, tls_environment

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.timeout(900)]

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = "wfphotos"
COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']"
)


def write_images(root: pathlib.Path, per_class: int, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label, channel in (("red", 0), ("blue", 2)):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 60, (16, 16, 3), dtype=np.uint8)
            pixels[..., channel] = rng.integers(180, 255, (16, 16), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")


class Refresh:
    def __init__(self, tmp: pathlib.Path, scheduler: str, tls: dict[str, str]) -> None:
        self.tmp, self.scheduler = tmp, scheduler
        self.registry = f"sqlite:///{tmp / 'registry.db'}"
        self.env = {**os.environ, **tls, "DASK_DVML__CLUSTER__STATE_DIR": str(tmp / "dvml-state"),
                    "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip

    def config(self, backbone: int, num_iterations: int) -> pathlib.Path:
        path = self.tmp / "refresh.yaml"
        path.write_text(
            f"""\
name: {NAME}
state_dir: {self.tmp / "wf-state"}
registry: {self.registry}
cluster:
  scheduler: {self.scheduler}
images:
  source: photos/drop-*
  image_size: [16, 16]
  validation_source: photos-val
backbone:
  model: {backbone}
  pooling: avg
  batch_size: 8
head:
  architecture: head.json
  compile_params: "{COMPILE}"
  fit_params: "batch_size=8, epochs=1"
  num_iterations: {num_iterations}
"""
        )
        return path

    def run(self, module: str, *args: str, timeout: float = 400) -> tuple[int, str]:
        result = subprocess.run(
            [sys.executable, "-m", module, *args], cwd=REPO, env=self.env, text=True,
            capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
        return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def refresh(cluster2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Refresh]:
    tmp = tmp_path_factory.mktemp("refresh")
    write_images(tmp / "photos" / "drop-1", per_class=20, seed=1)
    write_images(tmp / "photos" / "drop-2", per_class=12, seed=2)  # the newest: 24 images
    old = time.time() - 3600
    os.utime(tmp / "photos" / "drop-1", (old, old))
    write_images(tmp / "photos-val", per_class=4, seed=3)
    k = keras()
    head = k.Sequential([k.layers.InputLayer(input_shape=(8,)),
                         k.layers.Dense(2, activation="softmax")])  # fmt: skip
    (tmp / "head.json").write_text(head.to_json())
    state = Refresh(tmp, cluster2.scheduler_address, tls_environment(cluster2))
    yield state
    for name in dvml.datasets.list(client=cluster2.client)["name"]:
        if name.startswith(NAME):
            dvml.datasets.drop(name, client=cluster2.client)


@pytest.fixture(scope="module")
def backbone(refresh: Refresh) -> int:
    """A tiny CNN with its (seeded) weights in the registry: 8 features after avg pooling."""
    k = keras()
    k.utils.set_random_seed(0)
    model = k.Sequential([k.layers.InputLayer(input_shape=(16, 16, 3)),
                          k.layers.Conv2D(8, 3, activation="relu", name="conv")])  # fmt: skip
    return int(dvml.load_keras_model(model, name="tiny-backbone", registry=refresh.registry))


def test_refresh_computes_caches_and_trains_the_head(refresh: Refresh, backbone: int) -> None:
    config = str(refresh.config(backbone, num_iterations=1))
    code, text = refresh.run("workflows.feature_refresh", "--config", config, "--dry-run")
    assert code == 0, text
    assert "photos/drop-2 (newest match of photos/drop-*)" in text
    assert not (refresh.tmp / "wf-state").exists()

    code, text = refresh.run("workflows.feature_refresh", "--config", config)
    assert code == 0, text
    found = re.search(rf"features {NAME}-features: 24 rows of shape \[8\], (\d+) backbone", text)
    assert found, text  # drop-2 only: 2 x 12 images
    assert re.search(rf"features {NAME}-features-val: 8 rows of shape \[8\], \d+ backbone", text)
    assert f"training head {NAME}-head" in text and "from scratch" in text
    assert f"evaluated head {NAME}-head on {NAME}-features-val" in text

    code, text = refresh.run("workflows.feature_refresh", "--config", config)
    assert code == 0 and "nothing new" in text, text


def test_changed_head_reuses_the_caches(refresh: Refresh, backbone: int) -> None:
    config = str(refresh.config(backbone, num_iterations=2))
    code, text = refresh.run("workflows.feature_refresh", "--config", config)
    assert code == 0, text
    assert f"features {NAME}-features: 24 rows of shape [8], cache hit" in text
    assert f"features {NAME}-features-val: 8 rows of shape [8], cache hit" in text
    assert "from itself (warm start): 2 iteration(s)" in text


def _task_prefixes(dask_scheduler: Any) -> list[str]:
    """Run on the scheduler: the function names of the tasks it knows now."""
    return sorted({str(key).split("-", 1)[0] for key in dask_scheduler.tasks})


def test_killed_while_featurizing(refresh: Refresh, backbone: int, cluster2: Any) -> None:
    from dvml.jobs.job_cluster import staging_runs, wait_for_released_tasks
    from dvml.preprocess.api import INTERNAL_PREFIX

    hidden = f"{INTERNAL_PREFIX}features-source/{NAME}-features"
    config = str(refresh.config(backbone, num_iterations=2))
    args = [sys.executable, "-m", "workflows.feature_refresh", "--config", config, "--force"]
    with open(refresh.tmp / "killed.log", "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=refresh.env, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        # The cache packs the raw images into a hidden dataset, then runs the backbone where
        # they live. Watch the scheduler (not vineyard: a vineyard probe on a worker while a
        # task there uses vineyard breaks that task's connection, see the report) for the
        # backbone's tasks, and kill the workflow while they run.
        def featurizing() -> bool:
            running = cluster2.client.run_on_scheduler(_task_prefixes)
            return proc.poll() is not None or "featurize_buffer" in running

        seen = poll_for(featurizing, 300, interval=0.05)
        assert seen and proc.poll() is None, (refresh.tmp / "killed.log").read_text()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    # The killed client's featurize tasks end by themselves (wait without touching vineyard).
    print(f"\nreleased tasks after the kill: {wait_for_released_tasks(cluster2.client)}")
    # The caches of the last successful run are still there, complete.
    assert dvml.features.describe(f"{NAME}-features", cluster2.client).rows == 24

    code, text = refresh.run("workflows.feature_refresh", "--config", config, "--force")
    assert code == 0, text
    assert "did not finish (last phase 'features'" in text
    assert f"dropped {hidden}, left by the killed run" in text
    print(f"\nrun after the kill:\n{text[text.index('connected to') :][:1500]}")
    assert f"features {NAME}-features: 24 rows of shape [8], " in text
    assert not dvml.datasets.exists(hidden, client=cluster2.client)
    assert staging_runs(cluster2.client) == {}
    names = set(dvml.datasets.list(client=cluster2.client)["name"])
    assert {n for n in names if NAME in n} == {f"{NAME}-features", f"{NAME}-features-val"}


def test_features_commands(refresh: Refresh) -> None:
    where = ["--scheduler", refresh.scheduler]
    code, out = refresh.run("dvml", "features", "list", *where)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["name", "rows", "feature_shape"]
    assert {line.split()[0] for line in lines[1:]} == {f"{NAME}-features", f"{NAME}-features-val"}
    code, out = refresh.run("dvml", "features", "list", "--json", *where)
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows[f"{NAME}-features"]["rows"] == 24
    assert rows[f"{NAME}-features"]["feature_shape"] == [8]

    code, out = refresh.run("dvml", "features", "describe", f"{NAME}-features", *where)
    assert code == 0, out
    assert f"name:      {NAME}-features" in out and "rows:      24 in" in out
    assert "registry architecture" in out and "(pooling avg)" in out
    assert "classes:   ['blue', 'red']" in out

    code, out = refresh.run("dvml", "datasets", "list", "--kind", "feature_cache", *where)
    assert code == 0 and f"{NAME}-features" in out

    code, out = refresh.run("dvml", "features", "drop", f"{NAME}-features-val", *where)
    assert code == 0 and out.startswith(f"Dropped feature cache '{NAME}-features-val'"), out
    code, out = refresh.run("dvml", "features", "describe", f"{NAME}-features-val", *where)
    assert code == 1 and out.strip().startswith("dvml: error: No dataset named"), out
    assert len(out.strip().splitlines()) == 1
    code, out = refresh.run("dvml", "features", "drop", f"{NAME}-features-val",
                            "--missing-ok", *where)  # fmt: skip
    assert code == 0 and "nothing to drop" in out
