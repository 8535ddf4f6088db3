"""``dvml automl --config`` as a user runs it (``python -m dvml``): the job file's schema and
dry run without a cluster, its refusals, and a search on the session cluster followed by
``--resume`` of the finished search (returned as it is, nothing trained again)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from dvml.jobs.schemas import AUTOML_SCHEMA
from dvml.jobs.yaml_schema import load
from tests.helpers import REPO, dvml_command, one_error_line, tls_environment, with_state_dir

JOB = """\
name: digits-search
registry: sqlite:///REGISTRY
SCHEDULER
data:
  source: sklearn:digits
  normalizing_const: 16.0
model_selection:
  architectures: [builtin:digits-cnn]
  compile_params_grid:
    loss: [categorical_crossentropy]
    optimizer_params_list:
      - optimizer: [Adam]
        lr: [0.0003, 0.03, log]
    metrics: [accuracy]
  fit_params_grid: {batch_size: [32, 64], epochs: [1]}
automl:
  method: asha
  params: "max_t=3, eta=3, grace_period=1, max_configs=3"
  seed: 2
"""


def job_file(tmp_path: pathlib.Path, scheduler: str | None = None) -> pathlib.Path:
    path = tmp_path / "search.yaml"
    cluster = f"cluster:\n  scheduler: {scheduler}" if scheduler else ""
    path.write_text(JOB.replace("REGISTRY", str(tmp_path / "registry.db"))
                    .replace("SCHEDULER\n", cluster + "\n" if cluster else ""))  # fmt: skip
    return path


def test_automl_dry_run(tmp_path: pathlib.Path) -> None:
    path = job_file(tmp_path)
    result = dvml_command("automl", "--config", str(path), "--dry-run",
                          env=with_state_dir(tmp_path / "state"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sklearn:digits -> digits-search-train, digits-search-val" in out
    assert ("automl -> 'digits-search': method=asha, 'max_t=3, eta=3, grace_period=1, "
            "max_configs=3, sampler=random', seed=2") in out  # fmt: skip
    assert not (tmp_path / "registry.db").exists()


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("method: asha", "method: grid"), "'automl.method' must be one of"),
        (('"max_t=3, eta=3', '"max_t=0, eta=3'), "automl is refused"),
        (("lr: [0.0003, 0.03, log]", "lr: [0.0003, 0.03, logg]"), "model_selection is refused"),
    ],
)
def test_bad_automl_job_file(edit: tuple[str, str], expected: str, tmp_path: pathlib.Path) -> None:
    path = job_file(tmp_path)
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(*edit))
    line = one_error_line(dvml_command("automl", "--config", str(path),
                                       env=with_state_dir(tmp_path / "state")))  # fmt: skip
    assert f"dvml: error: {path}: " in line and expected in line, line
    assert not (tmp_path / "registry.db").exists()


def test_the_example_job_file_is_valid() -> None:
    job = load(REPO / "workflows/configs/automl-digits.yaml", AUTOML_SCHEMA)
    assert job["automl"]["method"] == "asha"
    assert "max_configs=16" in job["automl"]["params"]


@pytest.mark.cluster
@pytest.mark.tf
def test_automl_searches_then_resume_returns_the_finished_search(
    cluster2: Any, tmp_path: pathlib.Path
) -> None:
    path = job_file(tmp_path, cluster2.scheduler_address)
    env = {**with_state_dir(tmp_path / "state"), **tls_environment(cluster2),
           "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dvml", "automl", "--config", str(path),
                               *extra], capture_output=True, text=True, timeout=600, env=env,
                              check=False)  # fmt: skip

    first = run()
    assert first.returncode == 0, (first.stdout[-3000:], first.stderr[-3000:])
    out = first.stdout
    assert out.count("[dvml.automl asha digits-search]") >= 6  # a line per decision
    assert "best so far: trial" in out
    assert "Searched 3 configurations into 'digits-search'" in out
    best = out.split("best: mst_key=")[1].split(" ")[0]
    again = run("--resume")
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    assert "Resuming on the datasets digits-search-train, digits-search-val" in again.stdout
    assert "[dvml.automl asha" not in again.stdout  # finished: nothing trained again
    assert f"best: mst_key={best} " in again.stdout
    import dvml

    for name in ("digits-search-train", "digits-search-val"):
        dvml.datasets.drop(name, client=cluster2.client)
    assert os.path.exists(tmp_path / "registry.db")
