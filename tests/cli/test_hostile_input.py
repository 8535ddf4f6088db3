"""Hostile command-line and job-file input: a one-line error within 10 s, never a traceback.

Each case runs the real command (``python -m dvml ...`` or ``python -m workflows.retrain``) in
a fresh process, as a user would, with an empty state directory so that nothing is attached
to by accident. A value that would build a billion strings, overflow a C integer, wait for
10**300 seconds or read ``/dev/zero`` to the end must be refused before it does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dvml.cluster.processes import free_port
from tests.helpers.jobs import ADAM, digits_job, one_error_line, with_state_dir, write_job

# Ten seconds is the bound for a refused input; a Python start with pandas here takes
# 1-3 s, the rest is margin for a loaded machine.
BOUND_S = 10.0

CLUSTER_UP = ["cluster", "up"]
LIST = ["datasets", "list"]

ARGV_CASES = {
    "n-workers-1e12": [*CLUSTER_UP, "--n-workers", "1000000000000"],
    "n-workers-1e23": [*CLUSTER_UP, "--n-workers", str(10**23)],
    "n-workers-0": [*CLUSTER_UP, "--n-workers", "0"],
    "gpus-1e9": [*CLUSTER_UP, "--gpus", "1000000000"],
    "gpus-list-1e9": [*CLUSTER_UP, "--n-workers", "2", "--gpus", "1,1000000000"],
    "gpus-negative": [*CLUSTER_UP, "--gpus", "-1"],
    "scheduler-port-70000": [*CLUSTER_UP, "--scheduler-port", "70000"],
    "scheduler-port--1": [*CLUSTER_UP, "--scheduler-port=-1"],
    "start-timeout-nan": [*CLUSTER_UP, "--start-timeout", "nan"],
    "start-timeout-inf": [*CLUSTER_UP, "--start-timeout", "inf"],
    "start-timeout-1e300": [*CLUSTER_UP, "--start-timeout", "1e300"],
    "wait-nan": [*CLUSTER_UP, "--wait", "nan"],
    "wait--1": [*CLUSTER_UP, "--wait=-1"],
    "hosts-1e12": [*CLUSTER_UP, "--hosts", "1000000000000"],
    "timeout-nan": [*LIST, "--timeout", "nan"],
    "timeout-inf": [*LIST, "--timeout", "inf"],
    "timeout--1": [*LIST, "--timeout=-1"],
    "timeout-0": [*LIST, "--timeout", "0"],
    "timeout-1e300-closed-port": [*LIST, "--scheduler", "CLOSED", "--timeout", "1e300"],
    "status-timeout-nan": ["cluster", "status", "--timeout", "nan"],
    "status-timeout-1e300": ["cluster", "status", "--scheduler", "CLOSED", "--timeout", "1e300"],
    "down-timeout-inf": ["cluster", "down", "--timeout", "inf"],
    "fit-config-dev-zero": ["fit", "--config", "/dev/zero"],
    "fit-multiple-config-dev-zero": ["fit-multiple", "--config", "/dev/zero"],
    "model-configs-config-dev-zero": ["model-configs", "generate", "--config", "/dev/zero"],
}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=BOUND_S, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv[2:]} gave no answer within {BOUND_S:.0f} s")


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout


@pytest.mark.parametrize("case", sorted(ARGV_CASES))
def test_hostile_command_line_gets_one_error_line(case, tmp_path):
    closed = f"tcp://127.0.0.1:{free_port()}"
    argv = [closed if a == "CLOSED" else a for a in ARGV_CASES[case]]
    result = _run([sys.executable, "-m", "dvml", *argv], with_state_dir(tmp_path / "state"))
    _no_traceback(result)
    line = one_error_line(result)
    assert len(line) < 1000
    assert not (tmp_path / "state" / "cluster.json").exists()


def _job(tmp_path, edit: str) -> str:
    """A digits job file with one line changed or added, attached to a closed port."""
    text = digits_job("hostile", f"sqlite:///{tmp_path / 'r.db'}", compile_params=ADAM)
    extra = {
        "n_workers": "cluster:\n  local:\n    n_workers: {v}\n",
        "hosts": "cluster:\n  local:\n    hosts: {v}\n",
        "start_timeout": "cluster:\n  local:\n    start_timeout: {v}\n",
        "timeout": "cluster:\n  scheduler: CLOSED\n  timeout: {v}\n",
        "buffer_size": None,
        "num_iterations": None,
        "seed": None,
        "batch_size": "evaluate:\n  batch_size: {v}\n",
    }
    key, value = edit.split("=")
    template = extra[key]
    if template is not None:
        return text + template.format(v=value)
    section = {"buffer_size": "data:\n", "num_iterations": "model:\n", "seed": "data:\n"}[key]
    return text.replace(section, f"{section}  {key}: {value}\n", 1)


JOB_CASES = [
    "n_workers=1000000000000",
    "n_workers=100000000000000000000000000000",
    "hosts=100000000000000000000000000000",
    "start_timeout=1.0e+300",
    "start_timeout=.nan",
    "timeout=1.0e+300",
    "timeout=.inf",
    "buffer_size=1000000000000",
    "buffer_size=1000000000000000000000000000000",
    "num_iterations=1000000000000",
    "num_iterations=1000000000000000000000000000000",
    "seed=100000000000000000000000000000",
    "batch_size=100000000000000000000000000000",
]


@pytest.mark.parametrize("edit", JOB_CASES)
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_hostile_job_file_gets_one_error_line(tmp_path, edit, dry_run):
    closed = f"tcp://127.0.0.1:{free_port()}"
    job = write_job(tmp_path / "job.yaml", _job(tmp_path, edit).replace("CLOSED", closed))
    argv = [sys.executable, "-m", "dvml", "fit", "--config", str(job)]
    result = _run(argv + ["--dry-run"] * dry_run, with_state_dir(tmp_path / "state"))
    _no_traceback(result)
    line = one_error_line(result)
    assert edit.split("=")[0] in line


@pytest.mark.parametrize("bad", ["compile_params", "fit_params"])
def test_dry_run_refuses_what_a_real_run_refuses(tmp_path, bad):
    params = {"compile_params": ADAM, "fit_params": "batch_size=32, epochs=1"}
    params[bad] = "loss='categorical_crossentropy', optimizer=__import__('os'), garbage=1"
    text = digits_job("dry", f"sqlite:///{tmp_path / 'r.db'}", **params)
    job = write_job(tmp_path / "job.yaml", text)
    result = _run(
        [sys.executable, "-m", "dvml", "fit", "--config", str(job), "--dry-run"],
        with_state_dir(tmp_path / "state"),
    )
    _no_traceback(result)
    assert bad in one_error_line(result)


def test_workflow_config_dev_zero_is_refused_at_once(tmp_path):
    result = _run(
        [sys.executable, "-m", "workflows.retrain", "--config", "/dev/zero"],
        {**with_state_dir(tmp_path / "state"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    _no_traceback(result)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "/dev/zero" in result.stderr + result.stdout
