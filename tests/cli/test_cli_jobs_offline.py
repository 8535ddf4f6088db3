"""``dvml datasets|models|features|fit|evaluate|predict`` as a user runs them, without a cluster:
help, job-file errors, missing clusters and registries. Every call is ``python -m dvml``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import (
    digits_job,
    dvml_command,
    one_error_line,
    with_state_dir,
    write_image_folder,
    write_job,
    write_tar_shards,
)

# "{registry}" stays a placeholder: job_file fills in the test's own registry file.
JOB = digits_job("clidigits", "sqlite:///{registry}")


def dvml_cli(*args: str, tmp_path: pathlib.Path, timeout: float = 120) -> Any:
    return dvml_command(*args, env=with_state_dir(tmp_path / "state"), timeout=timeout)


def job_file(tmp_path: pathlib.Path, text: str = JOB) -> pathlib.Path:
    return write_job(tmp_path / "job.yaml", text.format(registry=tmp_path / "registry.db"))


@pytest.mark.parametrize(
    "args",
    [["datasets", "--help"], ["datasets", "list", "--help"], ["datasets", "describe", "--help"],
     ["datasets", "drop", "--help"], ["datasets", "append", "--help"], ["models", "--help"],
     ["models", "list", "--help"],
     ["models", "describe", "--help"], ["fit", "--help"], ["evaluate", "--help"],
     ["predict", "--help"], ["features", "--help"], ["features", "list", "--help"],
     ["features", "describe", "--help"], ["features", "drop", "--help"]],
)  # fmt: skip
def test_help(args: list[str], tmp_path: pathlib.Path) -> None:
    result = dvml_cli(*args, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: dvml")
    assert len(result.stdout.splitlines()) > 3


def test_groups_are_listed(tmp_path: pathlib.Path) -> None:
    out = dvml_cli("--help", tmp_path=tmp_path).stdout
    for group in ("datasets", "models", "fit", "evaluate", "predict", "features"):
        assert f"    {group} " in out
    result = dvml_cli("datasets", tmp_path=tmp_path)  # a group without its command
    assert result.returncode == 2 and "list" in result.stderr


@pytest.mark.parametrize("command", ["fit", "evaluate", "predict"])
@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("model:", "modle:"), "unknown key 'modle'. Did you mean 'model'?"),
        (("normalizing_const: 16.0", "normalizing_const: [16]"),
         "'data.normalizing_const' must be a number. Received: data.normalizing_const=[16]"),
        (("  source: sklearn:digits\n", ""), "missing required key 'data.source'"),
    ],
)  # fmt: skip
def test_bad_job_file(
    command: str, edit: tuple[str, str], expected: str, tmp_path: pathlib.Path
) -> None:
    path = job_file(tmp_path, JOB.replace(*edit))
    line = one_error_line(dvml_cli("fit", "--config", str(path), tmp_path=tmp_path))
    assert f"dvml: error: {path}: " in line and expected in line
    assert not (tmp_path / "registry.db").exists()  # nothing was started or written


def test_missing_job_file(tmp_path: pathlib.Path) -> None:
    line = one_error_line(dvml_cli("fit", "--config", "nope.yaml", tmp_path=tmp_path))
    assert "The config file nope.yaml does not exist" in line


def test_fit_dry_run(tmp_path: pathlib.Path) -> None:
    path = job_file(tmp_path)
    result = dvml_cli("fit", "--config", str(path), "--dry-run", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "clidigits-train, clidigits-val" in result.stdout
    assert "attach to the cluster recorded in" in result.stdout
    assert not (tmp_path / "registry.db").exists()


def test_no_cluster_is_one_clear_line(tmp_path: pathlib.Path) -> None:
    for args in (["datasets", "list"], ["features", "list"], ["datasets", "drop", "x"],
                 ["fit", "--config", str(job_file(tmp_path))]):  # fmt: skip
        line = one_error_line(dvml_cli(*args, tmp_path=tmp_path))
        assert "No cluster to use" in line and "dvml cluster up" in line
    # A recorded cluster whose process is gone: the state file names a dead pid.
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (state / "cluster.json").write_text(
        json.dumps({"pid": int(dead.stdout), "scheduler_address": "tcp://127.0.0.1:1"})
    )
    line = one_error_line(dvml_cli("datasets", "list", tmp_path=tmp_path))
    assert "is not running: its serve process" in line
    unreachable = dvml_cli("datasets", "list", "--scheduler", "tcp://127.0.0.1:1",
                           "--timeout", "2", tmp_path=tmp_path)  # fmt: skip
    assert "Cannot reach the Dask scheduler at 'tcp://127.0.0.1:1'" in one_error_line(unreachable)


def test_models_without_a_cluster(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = dvml_cli("models", "list", "--registry", url, tmp_path=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "(none)"
    listed = dvml_cli("models", "list", "--registry", url, "--json", tmp_path=tmp_path)
    assert json.loads(listed.stdout) == []
    line = one_error_line(dvml_cli("models", "describe", "nope", "--registry", url,
                                   tmp_path=tmp_path))  # fmt: skip
    assert "No model named 'nope'" in line


def test_fit_dry_run_reads_directories_and_urls_by_content(
    tmp_path: pathlib.Path, s3_server: Any
) -> None:
    """A hive-partitioned Parquet data set (locally and in an S3-compatible store, with the
    store's options from dvml.storage-options) is planned as a table, not as an image folder;
    a wrong key and a folder of other files are one clear line each."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1], "day": [1, 1, 2, 2]})
    pq.write_to_dataset(pa.Table.from_pandas(frame), tmp_path / "hive", partition_cols=["day"])
    bucket = s3_server.bucket("jobs")
    s3_server.upload(tmp_path / "hive", f"{bucket}/hive")
    env = {**with_state_dir(tmp_path / "state"),
           "DASK_DVML__STORAGE_OPTIONS": json.dumps(s3_server.storage_options)}  # fmt: skip
    for source in ("hive", f"{bucket}/hive"):
        text = JOB.replace("source: sklearn:digits", f"source: {source}")
        path = job_file(tmp_path, text.replace("clidigits", "hivejob"))
        result = dvml_command("fit", "--config", str(path), "--dry-run", env=env)
        assert result.returncode == 0, result.stderr
        assert "data: Parquet table" in result.stdout and "hivejob-train" in result.stdout

    wrong = {**s3_server.storage_options, "key": "AKIAWRONGWRONG"}
    result = dvml_command("fit", "--config", str(path), "--dry-run",
                          env={**env, "DASK_DVML__STORAGE_OPTIONS": json.dumps(wrong)})  # fmt: skip
    assert "refused access" in one_error_line(result)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.json").write_text("{}")
    text = JOB.replace("source: sklearn:digits", "source: notes")
    result = dvml_command("fit", "--config", str(job_file(tmp_path, text)), "--dry-run", env=env)
    line = one_error_line(result)
    assert "Cannot tell what the source folder holds" in line and "1 .json file" in line


def test_closed_pipe_ends_quietly(tmp_path: pathlib.Path) -> None:
    """`dvml models list | head`: a reader that has gone is no error (no "Broken pipe", no
    traceback), and the status is a SIGPIPE'd tool's, for `set -o pipefail`."""
    args = ["models", "list", "--registry", f"sqlite:///{tmp_path / 'empty.db'}"]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before dvml wrote anything
    try:
        result = subprocess.run(
            [sys.executable, "-m", "dvml", *args], stdout=write_end, stderr=subprocess.PIPE,
            text=True, timeout=120, check=False, env=with_state_dir(tmp_path / "state"),
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141


@pytest.mark.parametrize("kind", ["images", "shards"])
@pytest.mark.parametrize("split", ["  split: 0.2\n", ""])
def test_image_data_without_validation_source_is_refused_by_the_dry_run(
    kind: str, split: str, tmp_path: pathlib.Path
) -> None:
    """validation.split (given, or its 0.2 default) cannot split image files: the dry run
    refuses the job, naming validation.source, before any cluster starts."""
    if kind == "images":
        source = write_image_folder(tmp_path / "photos", 1)
    else:
        source = write_tar_shards(tmp_path / "shards", 1, 1)
    escaped = str(source).replace("{", "{{").replace("}", "}}")  # job_file formats the text
    text = JOB.replace("sklearn:digits", escaped).replace(
        "  normalizing_const: 16.0\n",
        "  normalizing_const: 255.0\n  image_size: [8, 8]\n"
        + ("validation:\n" + split if split else ""),
    )
    path = job_file(tmp_path, text)
    line = one_error_line(dvml_cli("fit", "--config", str(path), "--dry-run",
                                   tmp_path=tmp_path))  # fmt: skip
    assert "validation.split works for table sources only" in line
    assert "Add validation.source" in line
    assert not (tmp_path / "registry.db").exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_fit_refuses_data_append_which_is_the_retrain_workflows(
    dry_run: bool, tmp_path: pathlib.Path
) -> None:
    """A `dvml fit` that repacked every file would replace the versions the retrain workflow
    appends to (and its next run would append them twice): it is refused, naming the way."""
    drops = tmp_path / "drops"
    drops.mkdir()
    (drops / "day-1.csv").write_text("a,b,label\n1.0,2.0,0\n3.0,4.0,1\n")
    text = JOB.replace("sklearn:digits", str(drops)).replace(
        "  normalizing_const: 16.0\n",
        "  normalizing_const: 16.0\n  x: [a, b]\n  y: label\n  append: true\n",
    )
    path = job_file(tmp_path, text)
    args = ["fit", "--config", str(path)] + (["--dry-run"] if dry_run else [])
    line = one_error_line(dvml_cli(*args, tmp_path=tmp_path))
    assert "data.append: true is the retrain workflow's" in line
    assert f"python -m workflows.retrain --config {path}" in line
    assert not (tmp_path / "registry.db").exists()
