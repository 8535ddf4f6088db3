"""The workflows as cron runs them (``python -m workflows.retrain ...``), before any cluster:
bad job files, dry runs, the lock. Each run is a real subprocess; nothing here needs Dask."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import digits_job, write_job

REPO = pathlib.Path(__file__).resolve().parents[2]
# The workflows package lives in the repository, not in the installed dvml: put the repository
# first, or `import workflows` finds this test directory (a namespace package of that name).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def workflow(*args: str, tmp_path: pathlib.Path, timeout: float = 120) -> Any:
    env = {**os.environ, "DASK_DVML__CLUSTER__STATE_DIR": str(tmp_path / "dvml-state")}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def job_file(tmp_path: pathlib.Path, extra: str = "", **replace: str) -> pathlib.Path:
    text = digits_job(
        "digits",
        f"sqlite:///{tmp_path / 'registry.db'}",
        state_dir=tmp_path / "wf-state",
        scheduler="tcp://127.0.0.1:1",
    )
    text += extra
    for old, new in replace.items():
        text = text.replace(old, new)
    return write_job(tmp_path / "job.yaml", text)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


@pytest.mark.parametrize(
    ("extra", "replace", "expected"),
    [
        ("model_name: x\n", {}, "unknown key 'model_name'"),
        ("", {"normalizing_const: 16.0": "normalizing_const: '16'"},
         "'data.normalizing_const' must be a number"),
        ("", {"  source: sklearn:digits\n": ""}, "missing required key 'data.source'"),
    ],
)  # fmt: skip
def test_bad_job_file_starts_nothing(
    tmp_path: pathlib.Path, extra: str, replace: dict[str, str], expected: str
) -> None:
    path = job_file(tmp_path, extra, **replace)
    result = workflow("workflows.retrain", "--config", str(path), tmp_path=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert "invalid config, nothing was started" in errors[0]
    assert f"{path}: " in errors[0] and expected in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "wf-state").exists()  # no lock, journal or state was written


def test_dry_run_shows_the_plan_and_touches_nothing(tmp_path: pathlib.Path) -> None:
    path = job_file(tmp_path)
    result = workflow("workflows.retrain", "--config", str(path), "--dry-run", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("Plan for retrain 'digits' (dry run")
    assert "attach to the scheduler at tcp://127.0.0.1:1" in out
    assert "digits-train and digits-val" in out and "digits@candidate" in out
    assert "warm-started from production 'digits'" in out
    assert not (tmp_path / "wf-state").exists() and not (tmp_path / "registry.db").exists()

    missing = job_file(tmp_path, **{"sklearn:digits": str(tmp_path / "drops/*.parquet")})
    result = workflow("workflows.retrain", "--config", str(missing), "--dry-run",
                      tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert "Nothing matches the data source" in result.stderr


def test_second_run_is_refused_while_the_lock_is_held(tmp_path: pathlib.Path) -> None:
    from workflows._runtime import RunLock

    path = job_file(tmp_path)
    lock = RunLock(tmp_path / "wf-state" / "retrain-digits.lock")
    lock.acquire("retrain 'digits'")  # this test process plays the running workflow
    try:
        result = workflow("workflows.retrain", "--config", str(path), tmp_path=tmp_path)
    finally:
        lock.release()
    assert result.returncode == 3, result.stderr
    (line,) = error_lines(result.stderr)
    assert f"holds the lock {lock.path} (pid {os.getpid()}" in line
    assert "refusing to run twice at once" in line
    assert not (tmp_path / "wf-state" / "retrain-digits.journal.json").exists()


def test_listing_help_and_usage(tmp_path: pathlib.Path) -> None:
    listing = workflow("workflows", "list", tmp_path=tmp_path)
    assert listing.returncode == 0 and "retrain" in listing.stdout
    assert "feature_refresh" in listing.stdout
    assert workflow("workflows", "nope", tmp_path=tmp_path).returncode == 2
    for name in ("retrain", "feature_refresh"):
        result = workflow(f"workflows.{name}", "--help", tmp_path=tmp_path)
        assert result.returncode == 0 and "--dry-run" in result.stdout
        assert "Exit codes: 0 done" in result.stdout
    assert workflow("workflows.retrain", tmp_path=tmp_path).returncode == 2  # --config missing
