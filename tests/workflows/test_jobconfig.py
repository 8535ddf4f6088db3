"""Job files, sources, promotion rules and the run lock: pure or file-level, no cluster."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from dvml.exceptions import ConfigError, DataError
from dvml.jobs.data import resolve_source, validation_split
from dvml.jobs.models import is_better, metric_mode, metric_value
from dvml.jobs.schemas import FEATURE_REFRESH_SCHEMA, JOB_SCHEMA
from dvml.jobs.yaml_schema import Field, Section, describe, load, validate

REPO = pathlib.Path(__file__).resolve().parents[2]
# The workflows package lives in the repository, not in the installed dvml: put the repository
# first, or `import workflows` finds this test directory (a namespace package of that name).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GOOD = """\
name: digits
cluster:
  scheduler: tcp://127.0.0.1:8786
data:
  source: sklearn:digits
  normalizing_const: 16
model:
  architecture: builtin:digits-cnn
  compile_params: "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
"""


def write(tmp_path: pathlib.Path, text: str, name: str = "job.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problem(tmp_path: pathlib.Path, text: str, schema: Any = JOB_SCHEMA) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path, schema)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message, message
    return message


def test_good_file_gets_defaults(tmp_path: pathlib.Path) -> None:
    job = load(write(tmp_path, GOOD), JOB_SCHEMA)
    assert job["name"] == "digits"
    assert job["data"]["normalizing_const"] == 16.0
    assert isinstance(job["data"]["normalizing_const"], float)  # an int given for a float
    assert job["model"]["num_iterations"] == 1
    assert job["model"]["warm_start"] is True
    assert job["cluster"]["local"] is None  # absent: no LocalCluster
    assert job["validation"] == {"source": None, "split": None}
    assert job["promotion"]["metric"] == "loss"
    job["model"]["custom_objects"].append("x")  # defaults are copies, never shared
    assert load(write(tmp_path, GOOD), JOB_SCHEMA)["model"]["custom_objects"] == []


def test_example_configs_are_valid() -> None:
    job = load(REPO / "workflows/configs/retrain-digits.yaml", JOB_SCHEMA)
    assert job["cluster"]["local"]["n_workers"] == 2
    refresh = load(REPO / "workflows/configs/feature-refresh.yaml", FEATURE_REFRESH_SCHEMA)
    assert refresh["head"] is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD + "colour: red\n", "unknown key 'colour'"),
        (GOOD.replace("  normalizing_const: 16", "  normalising_const: 16"),
         "unknown key 'data.normalising_const'. Did you mean 'normalizing_const'?"),
        (GOOD + "promotion:\n  metrik: loss\n", "unknown key 'promotion.metrik'"),
        (GOOD.replace("  scheduler: tcp://127.0.0.1:8786", "  local:\n    workers: 2"),
         "unknown key 'cluster.local.workers'"),
    ],
)  # fmt: skip
def test_unknown_key(tmp_path: pathlib.Path, text: str, expected: str) -> None:
    assert expected in problem(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD + "  num_iterations: '3'\n", "'model.num_iterations' must be an integer. "
         "Received: model.num_iterations='3' (a string)"),
        (GOOD + "  num_iterations: true\n", "'model.num_iterations' must be an integer"),
        (GOOD + "  warm_start: 1\n", "'model.warm_start' must be true or false"),
        (GOOD.replace("normalizing_const: 16", "normalizing_const: sixteen"),
         "'data.normalizing_const' must be a number"),
        (GOOD.replace("normalizing_const: 16", "normalizing_const: -1"),
         "'data.normalizing_const' must be a positive number"),
        (GOOD + "validation:\n  split: 1.5\n", "'validation.split' must be a fraction"),
        (GOOD + "data2: 1\n", "unknown key 'data2'"),
        (GOOD + "promotion:\n  mode: biggest\n", "'promotion.mode' must be one of 'auto'"),
        (GOOD + "cluster2: {}\n", "unknown key 'cluster2'"),
        ("- a\n- b\n", "the file must be a mapping"),
        (GOOD.replace("name: digits", "name: my model"), "'name' must start with a letter"),
        (GOOD + "validation:\n  split: 0.2\n  source: a.parquet\n",
         "either 'validation.source' or 'validation.split'"),
        (GOOD.replace("cluster:\n", "cluster:\n  local: {}\n"),
         "either 'cluster.scheduler'"),
    ],
)  # fmt: skip
def test_wrong_type_or_value(tmp_path: pathlib.Path, text: str, expected: str) -> None:
    assert expected in problem(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("name: digits\n", ""), "missing required key 'name'"),
        (GOOD.replace("  source: sklearn:digits\n", ""), "missing required key 'data.source'"),
        (GOOD.split("model:")[0], "missing required section 'model'"),
        (GOOD.replace("  architecture: builtin:digits-cnn\n", "  architecture:\n"),
         "'model' needs 'architecture' (or 'from_selection'"),
        ("", "missing required key 'name'"),
    ],
)  # fmt: skip
def test_missing_field(tmp_path: pathlib.Path, text: str, expected: str) -> None:
    assert expected in problem(tmp_path, text)


SELECTION = GOOD.split("model:")[0] + "model:\n  from_selection: grid\n  num_iterations: 2\n"


def test_model_from_a_fit_multiple_run(tmp_path: pathlib.Path) -> None:
    """``model.from_selection`` replaces the architecture and its parameters (retrain the best
    configuration of a stored fit_multiple run); giving both is refused."""
    job = load(write(tmp_path, SELECTION), JOB_SCHEMA)
    model = job["model"]
    assert model["from_selection"] == "grid" and model["num_iterations"] == 2
    assert model["architecture"] is None and model["fit_params"] is None
    assert load(write(tmp_path, GOOD), JOB_SCHEMA)["model"]["from_selection"] is None
    both = SELECTION + "  architecture: builtin:digits-cnn\n  fit_params: 'batch_size=8'\n"
    message = problem(tmp_path, both)
    assert "give either 'model.from_selection' or 'architecture', 'fit_params'" in message
    assert "Received: from_selection='grid'" in message
    assert "'model.from_selection' must" in problem(
        tmp_path, SELECTION.replace("from_selection: grid", "from_selection: my grid")
    )


def test_unknown_key_is_reported_before_the_missing_one(tmp_path: pathlib.Path) -> None:
    text = GOOD.replace("  source: sklearn:digits", "  sorce: sklearn:digits")
    assert "unknown key 'data.sorce'. Did you mean 'source'?" in problem(tmp_path, text)


def test_file_level_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml", JOB_SCHEMA)
    message = problem(tmp_path, "name: x\ndata: [1, 2\n")
    assert "not valid YAML at line" in message


def test_feature_refresh_schema(tmp_path: pathlib.Path) -> None:
    text = textwrap.dedent("""\
    name: photos
    images:
      source: /data/photos/*
      image_size: [32, 32]
    backbone:
      model: MobileNetV2
      pooling: avg
    """)
    job = load(write(tmp_path, text), FEATURE_REFRESH_SCHEMA)
    assert job["head"] is None and job["backbone"]["batch_size"] == 64
    bad = text.replace("[32, 32]", "[32]")
    assert "'images.image_size' must be [height, width]" in problem(
        tmp_path, bad, FEATURE_REFRESH_SCHEMA
    )
    head = text + "head:\n  compile_params: x\n"
    assert "missing required key 'head.architecture'" in problem(
        tmp_path, head, FEATURE_REFRESH_SCHEMA
    )


def test_small_schema_and_describe() -> None:
    schema = {
        "a": Field(int, required=True, help="an a"),
        "s": Section({"b": Field(str, default="x", choices=("x", "y"), help="a b")}),
    }
    assert validate({"a": 1}, schema, "f.yaml") == {"a": 1, "s": {"b": "x"}}
    with pytest.raises(ConfigError, match=r"^f\.yaml: 's\.b' must be one of 'x', 'y'"):
        validate({"a": 1, "s": {"b": "z"}}, schema, "f.yaml")
    text = describe(schema)
    assert "a: int (required)  # an a" in text and "  b: str (default 'x'" in text


# -- sources -------------------------------------------------------------------------------


def test_newest_match_of_a_glob(tmp_path: pathlib.Path) -> None:
    old, new = tmp_path / "day-1.parquet", tmp_path / "day-2.parquet"
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    os.utime(old, (time.time() - 100, time.time() - 100))
    found = resolve_source("day-*.parquet", tmp_path)  # relative to the job file's directory
    assert found.kind == "table" and found.location == str(new)
    again = resolve_source(str(tmp_path / "day-*.parquet"))
    assert again.fingerprint == found.fingerprint
    os.utime(old, None)  # "day-1" is the newest now
    assert resolve_source("day-*.parquet", tmp_path).location == str(old)
    expected = "Nothing matches the data source. Received: data.source='none-*.csv'"
    with pytest.raises(DataError, match=re.escape(expected)):
        resolve_source("none-*.csv", tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="Cannot tell the format"):
        resolve_source("notes.txt", tmp_path)


def test_directories_and_shards(tmp_path: pathlib.Path) -> None:
    images = tmp_path / "images"
    (images / "cat").mkdir(parents=True)
    (images / "cat" / "a.png").write_bytes(b"x")
    assert resolve_source(str(images)).kind == "images"
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        (shards / f"s-{i}.tar").write_bytes(b"x")
    found = resolve_source(str(shards))
    assert found.kind == "shards" and found.location == str(shards)
    pattern = resolve_source(str(shards / "s-{0..1}.tar"))
    assert pattern.kind == "shards" and pattern.fingerprint == found.fingerprint
    assert resolve_source(str(shards / "s-%d.tar")).fingerprint == found.fingerprint
    with pytest.raises(DataError, match="1 of 3 files of the pattern do not exist"):
        resolve_source(str(shards / "s-{0..2}.tar"))
    assert resolve_source("sklearn:digits").kind == "sklearn"
    with pytest.raises(DataError, match="Known: sklearn:digits"):
        resolve_source("sklearn:mnist")


def test_validation_split_is_reproducible() -> None:
    import pandas as pd

    rows = pd.DataFrame({"a": range(100)})
    train, valid = validation_split(rows, 0.2, seed=3)
    assert len(valid) == 20 and len(train) == 80
    assert set(train.a).isdisjoint(valid.a)
    assert list(validation_split(rows, 0.2, seed=3)[1].a) == list(valid.a)


# -- promotion -----------------------------------------------------------------------------


def test_promotion_rule() -> None:
    assert metric_mode("loss") == "min" and metric_mode("accuracy") == "max"
    assert metric_mode("accuracy", "min") == "min"
    assert is_better(0.9, None, "max", 0.0)  # nothing in production yet
    assert is_better(0.91, 0.90, "max", 0.0)
    assert not is_better(0.90, 0.90, "max", 0.0)  # a tie keeps production
    assert not is_better(0.905, 0.90, "max", 0.01)
    assert is_better(0.2, 0.3, "min", 0.05)
    assert not is_better(float("nan"), 0.3, "min", 0.0)
    result = {"loss": 0.5, "metrics": {"accuracy": 0.8}}
    assert metric_value(result, "loss") == 0.5 and metric_value(result, "accuracy") == 0.8
    with pytest.raises(ConfigError, match="Computed: loss, accuracy"):
        metric_value(result, "auc")


# -- lock ----------------------------------------------------------------------------------


def test_run_lock_refuses_a_second_holder(tmp_path: pathlib.Path) -> None:
    from workflows._runtime import LockHeldError, RunLock

    first = RunLock(tmp_path / "job.lock")
    first.acquire("retrain 'x'")
    try:
        assert first.is_held() and first.holder()["pid"] == os.getpid()
        with pytest.raises(LockHeldError) as info:
            RunLock(tmp_path / "job.lock").acquire("retrain 'x'")
        message = str(info.value)
        assert str(tmp_path / "job.lock") in message and f"pid {os.getpid()}" in message
        # Another process sees it held too (flock is per open file, not per process).
        code = (
            "import pathlib, sys; from workflows._runtime import RunLock; "
            f"sys.exit(3 if RunLock(pathlib.Path({str(tmp_path / 'job.lock')!r})).is_held() "
            "else 0)"
        )
        assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 3
    finally:
        first.release()
    assert not first.is_held()
    second = RunLock(tmp_path / "job.lock")
    second.acquire("retrain 'x'")  # free again once released
    second.release()
