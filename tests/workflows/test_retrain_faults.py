"""``python -m workflows.retrain`` against a real cluster, killed with SIGKILL mid-run.

Each run is a real subprocess attached to the session cluster ``cluster2``; the test finds its
phase from its log lines, kills it by pid, and checks that the next run completes and that the
registry and vineyard hold no half result: one production model, one candidate, the two
datasets, no staging objects, no trainer left running.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import dvml
from dvml.jobs.job_cluster import staging_runs
from dvml.registry import Registry
from tests.helpers import (
    digits_job,
    job_trainers,
    pid_gone,
    poll_for,
    tls_environment,
    worker_descendants,
    write_job,
)

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = "wfdigits"
COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', metrics=['accuracy']"
)


class Job:
    """The job files of one test module, its registry and the processes it started."""

    def __init__(self, tmp: pathlib.Path, scheduler: str, tls: dict[str, str]) -> None:
        self.tmp = tmp
        self.registry = f"sqlite:///{tmp / 'registry.db'}"
        self.state = tmp / "wf-state"
        self.fast = self._write("fast.yaml", scheduler, "batch_size=64, epochs=1")
        # Long enough that the trainers still run when the workflow is killed.
        self.slow = self._write("slow.yaml", scheduler, "batch_size=16, epochs=60")
        self.env = {
            **os.environ,
            "DASK_DVML__CLUSTER__STATE_DIR": str(tmp / "dvml-state"),  # trainer checkpoints
            "TF_CPP_MIN_LOG_LEVEL": "3",
            **tls,  # the session cluster's certificate, as a user's Dask config would give it
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def _write(self, name: str, scheduler: str, fit_params: str) -> pathlib.Path:
        text = digits_job(
            NAME,
            self.registry,
            state_dir=self.state,
            scheduler=scheduler,
            compile_params=COMPILE,
            fit_params=fit_params,
            validation_split=0.2,
            promotion_metric="accuracy",
        )
        return write_job(self.tmp / name, text)

    def start(
        self, config: pathlib.Path, *args: str
    ) -> tuple[subprocess.Popen[bytes], pathlib.Path]:
        self.count += 1
        log = self.tmp / f"run-{self.count}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workflows.retrain", "--config", str(config), *args],
                cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs.append(proc)
        return proc, log

    def run(self, config: pathlib.Path, *args: str, timeout: float = 400) -> tuple[int, str]:
        proc, log = self.start(config, *args)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the workflow ran past {timeout}s:\n{log.read_text()[-3000:]}")
        return code, log.read_text()

    def models(self) -> dict[str, int]:
        with Registry(self.registry) as registry:
            table = registry.list_models()
        return dict(zip(table["name"], table["version"], strict=True))

    @property
    def journal(self) -> pathlib.Path:
        return self.state / f"retrain-{NAME}.journal.json"


def wait_for(log: pathlib.Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until the run's log has ``text``; fail when it exits or the time is up."""

    def seen() -> bool:
        return text in log.read_text() or proc.poll() is not None

    poll_for(seen, timeout, interval=0.05)
    content = log.read_text()
    if text not in content:
        pytest.fail(f"{text!r} never appeared (exit {proc.poll()}):\n{content[-3000:]}")


def trainer_pids(cluster: Any) -> list[int]:
    """Trainers running a job under the cluster's workers (by their job file: the idle standby
    trainers that a pack warms and a fit leaves behind do not count)."""
    return job_trainers(worker_descendants(cluster))


def our_datasets(cluster: Any) -> set[str]:
    table = dvml.datasets.list(client=cluster.client)
    return {n for n in table["name"] if n.startswith(NAME)}


@pytest.fixture(scope="module")
def job(cluster2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    state = Job(
        tmp_path_factory.mktemp("retrain"), cluster2.scheduler_address, tls_environment(cluster2)
    )
    yield state
    for proc in state.procs:  # only the runs this module started, by pid
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    for name in our_datasets(cluster2):
        dvml.datasets.drop(name, client=cluster2.client)


def test_killed_after_preprocessing_and_refused_while_running(job: Job, cluster2: Any) -> None:
    first, log = job.start(job.fast)
    wait_for(log, "started (pid", first, timeout=120)

    # A second run while the first holds the lock: refused at once, naming lock and holder.
    code, text = job.run(job.fast, timeout=120)
    assert code == 3, text
    lock = job.state / f"retrain-{NAME}.lock"
    assert f"holds the lock {lock} (pid {first.pid}" in text
    assert "refusing to run twice at once" in text

    wait_for(log, f"preprocessed {NAME}-train", first, timeout=300)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    assert job.journal.exists()  # the killed run says where it stopped
    assert NAME not in job.models()  # nothing was promoted
    assert our_datasets(cluster2) == {f"{NAME}-train", f"{NAME}-val"}  # both complete

    started = time.monotonic()
    code, text = job.run(job.fast)
    assert code == 0, text
    print(f"\nrun after the kill: {time.monotonic() - started:.0f}s")
    assert "did not finish (last phase 'preprocessed'" in text
    assert f"reusing {NAME}-train and {NAME}-val" in text  # built from the same data
    assert f"promoted {NAME}@candidate to production {NAME}" in text
    assert job.models() == {f"{NAME}@candidate": 1, NAME: 1}
    with Registry(job.registry) as registry:
        promotion = registry.model_summary(NAME)["promotion"]
    assert promotion["from"] == f"{NAME}@candidate" and promotion["previous"] is None
    assert our_datasets(cluster2) == {f"{NAME}-train", f"{NAME}-val"}
    assert staging_runs(cluster2.client) == {}
    assert not job.journal.exists()


def test_killed_during_training_stops_orphaned_trainers(job: Job, cluster2: Any) -> None:
    run, log = job.start(job.slow)
    wait_for(log, f"training {NAME}@candidate", run, timeout=300)
    assert poll_for(lambda: len(trainer_pids(cluster2)) == 2, 120, interval=0.2), log.read_text()
    trainers = trainer_pids(cluster2)
    time.sleep(2)  # let them join the collective and train
    os.kill(run.pid, signal.SIGKILL)
    run.wait(30)

    # The trainers' client lease (dvml.train.runtime) stops them once the scheduler dropped
    # the killed client: within seconds, before any rerun has to.
    killed_at = time.monotonic()
    assert poll_for(lambda: all(pid_gone(pid) for pid in trainers), 30, interval=0.2)
    print(f"\nthe trainers stopped {time.monotonic() - killed_at:.1f}s after the SIGKILL")

    started = time.monotonic()
    code, text = job.run(job.fast, "--force")
    assert code == 0, text
    print(f"run after the kill: {time.monotonic() - started:.0f}s")
    assert "did not finish (last phase 'training'" in text
    assert f"reusing {NAME}-train and {NAME}-val" in text
    assert all(pid_gone(pid) for pid in trainers)
    models = job.models()
    assert set(models) == {NAME, f"{NAME}@candidate"}  # exactly one production model
    assert models[NAME] in (1, 2)  # promoted again only when the candidate was better
    assert our_datasets(cluster2) == {f"{NAME}-train", f"{NAME}-val"}
    assert staging_runs(cluster2.client) == {}
    assert not job.journal.exists()


def test_nothing_new_is_a_quick_success(job: Job) -> None:
    before = job.models()
    code, text = job.run(job.fast, timeout=200)
    assert code == 0, text
    assert "nothing new: run" in text and "training" not in text
    assert job.models() == before
