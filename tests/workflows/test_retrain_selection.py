"""``model: {from_selection: RUN}`` in a retrain job: the workflow retrains the best
configuration of a stored ``fit_multiple`` run (its architecture, compile_params and
fit_params), against the session cluster, as a real ``python -m workflows.retrain``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import dvml
from dvml.jobs.models import architecture_id
from dvml.registry import Registry
from tests.helpers import write_job

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.timeout(900)]

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = "wfselect"
ADAM = "loss='categorical_crossentropy', optimizer='Adam(learning_rate={})', metrics=['accuracy']"


def job_text(tmp: pathlib.Path, scheduler: str, selection: str) -> str:
    return f"""\
name: {NAME}
state_dir: {tmp / "wf-state"}
registry: sqlite:///{tmp / "registry.db"}
cluster:
  scheduler: {scheduler}
data:
  source: sklearn:digits
  normalizing_const: 16.0
validation:
  split: 0.2
model:
  from_selection: {selection}
  num_iterations: 1
promotion:
  metric: accuracy
"""


def tls_environment(cluster: Any) -> dict[str, str]:
    """The cluster's client certificate as Dask configuration (a TLS cluster of the tests is
    recorded by no `dvml cluster up`)."""
    security = cluster.security
    if security is None:
        return {}
    return {
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": security.tls_ca_file,
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": security.tls_client_cert,
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": security.tls_client_key,
    }


def retrain(stored: dict[str, Any], config: pathlib.Path, *args: str) -> tuple[int, str]:
    env = {
        **os.environ,
        **stored["tls"],
        "DASK_DVML__CLUSTER__STATE_DIR": str(stored["tmp"] / "dvml-state"),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "workflows.retrain", "--config", str(config), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def stored(cluster2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A registry holding a fit_multiple run "grid" of two configurations, the second the best
    (written by the registry's own save_model_selection_run, as fit_multiple writes it)."""
    tmp = tmp_path_factory.mktemp("retrain-selection")
    with Registry(f"sqlite:///{tmp / 'registry.db'}") as registry:
        arch = architecture_id("builtin:digits-cnn", registry)
        rows = [
            {"mst_key": 1, "model_id": arch, "model_name": "grid_1",
             "compile_params": ADAM.format(0.001), "fit_params": "batch_size=64, epochs=1",
             "validation_metrics_final": 0.80, "training_loss_final": 0.7},
            {"mst_key": 2, "model_id": arch, "model_name": "grid_2",
             "compile_params": ADAM.format(0.003), "fit_params": "batch_size=48, epochs=1",
             "validation_metrics_final": 0.93, "training_loss_final": 0.3},
        ]  # fmt: skip
        registry.save_model_selection_run("grid", [], rows, {"model": "grid", "mst_keys": [1, 2]})
    yield {
        "tmp": tmp,
        "arch": arch,
        "scheduler": cluster2.scheduler_address,
        "tls": tls_environment(cluster2),
    }
    for name in dvml.datasets.list(client=cluster2.client)["name"]:
        if name.startswith(NAME):
            dvml.datasets.drop(name, client=cluster2.client)


def test_retrains_the_best_configuration(stored: dict[str, Any]) -> None:
    tmp = stored["tmp"]
    config = write_job(tmp / "job.yaml", job_text(tmp, stored["scheduler"], "grid"))
    code, out = retrain(stored, config, "--dry-run")
    assert code == 0, out
    assert "the best configuration of fit_multiple run 'grid'" in out

    code, out = retrain(stored, config)
    assert code == 0, out
    assert "retraining the best configuration of fit_multiple run 'grid': mst_key 2" in out
    with Registry(f"sqlite:///{tmp / 'registry.db'}") as registry:
        production = registry.get_model(NAME)
    assert production["arch_id"] == stored["arch"]
    summary = production["summary"]
    assert "0.003" in str(summary["compile_params"]), summary["compile_params"]
    assert "batch_size=48" in str(summary["fit_params"]), summary["fit_params"]
    state = json.loads((tmp / "wf-state" / f"retrain-{NAME}.state.json").read_text())
    selection = state["last_success"]["selection"]
    assert selection["from"] == "grid" and selection["mst_key"] == 2, selection


def test_an_unknown_run_is_a_clear_error(stored: dict[str, Any]) -> None:
    tmp = stored["tmp"]
    config = write_job(tmp / "missing.yaml", job_text(tmp, stored["scheduler"], "nosuch"))
    code, out = retrain(stored, config)
    assert code != 0, out
    assert "names no stored fit_multiple run" in out and "from_selection='nosuch'" in out, out
    assert "Traceback" not in out, out
