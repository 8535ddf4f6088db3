"""The pure parts of the retrain workflow's appends: the new-file diff, the drift statistic
(PSI per feature), and the refusal of new files of another schema or class value."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dvml.exceptions import DataError
from dvml.jobs import drift
from dvml.jobs.appends import features, inspect_file, refuse_incompatible
from dvml.jobs.file_diff import diff_files, entries, refuse_changed
from dvml.preprocess.locations import hive_partitions

SEEN = entries(["d/a.parquet", "d/b.parquet"], [10, 20], ["1.0", "2.0"])


def test_diff_finds_new_changed_and_removed_files() -> None:
    now = entries(["d/b.parquet", "d/c.parquet", "d/d.parquet"], [21, 5, 6], ["2.0", "3", "4"])
    diff = diff_files(SEEN, now)
    assert [e["path"] for e in diff.new] == ["d/c.parquet", "d/d.parquet"]
    assert [(o["size"], n["size"]) for o, n in diff.changed] == [(20, 21)]
    assert [e["path"] for e in diff.removed] == ["d/a.parquet"]
    assert diff.unchanged == []


def test_diff_of_the_same_listing_is_empty_and_a_stamp_change_is_a_change() -> None:
    same = diff_files(SEEN, list(reversed(SEEN)))
    assert (same.new, same.changed, same.removed) == ([], [], [])
    assert len(same.unchanged) == 2
    touched = entries(["d/a.parquet", "d/b.parquet"], [10, 20], ["1.0", "etag-2"])
    assert [n["path"] for _, n in diff_files(SEEN, touched).changed] == ["d/b.parquet"]


def test_a_rewritten_file_is_refused_by_name() -> None:
    refuse_changed(diff_files(SEEN, SEEN), "d/")  # nothing changed: no error
    now = entries(["d/a.parquet", "d/b.parquet"], [11, 20], ["1.5", "2.0"])
    with pytest.raises(DataError, match=r"d/a\.parquet.*size 10 -> 11.*--force"):
        refuse_changed(diff_files(SEEN, now), "d/")


def test_psi_is_zero_for_equal_distributions_and_grows_with_the_shift() -> None:
    rng = np.random.default_rng(1)
    old = rng.normal(0, 1, (4000, 2))
    summary = drift.summarize(old, bins=10)
    assert summary["rows"] == 4000 and len(summary["edges"]) == 2
    same = drift.summarize(rng.normal(0, 1, (2000, 2)), summary["edges"])
    moved_rows = np.column_stack([rng.normal(0, 1, 2000), rng.normal(1.5, 1, 2000)])
    shifted = drift.summarize(moved_rows, summary["edges"])
    calm = drift.compare(summary, same, names=["a", "b"])
    moved = drift.compare(summary, shifted, names=["a", "b"])
    assert calm["max_psi"] < 0.05 and calm["drifted"] == []
    assert moved["feature"] == "b" and moved["drifted"] == ["b"] and moved["max_psi"] > 0.25
    assert moved["psi"]["a"] < 0.05
    assert "1 feature(s) drifted: b" in drift.describe_drift(moved)
    assert "no feature drifted" in drift.describe_drift(calm)


def test_psi_by_hand_and_merge_adds_counts() -> None:
    expected = (0.5 - 0.25) * math.log(0.5 / 0.25) + (0.5 - 0.75) * math.log(0.5 / 0.75)
    assert drift.psi([3, 1], [2, 2]) == pytest.approx(expected)
    assert drift.psi([0, 0], [1, 1]) == 0.0
    a = drift.summarize(np.array([0.0, 1.0, 2.0, 3.0]), [[1.5]])
    b = drift.summarize(np.array([5.0, 6.0]), [[1.5]])
    assert a["counts"] == [[2, 2]] and b["counts"] == [[0, 2]]
    assert drift.merge(a, b) == {"edges": [[1.5]], "counts": [[2, 4]], "rows": 6}


def test_features_of_array_and_scalar_columns() -> None:
    frame = pd.DataFrame({"f": [1.0, 2.0], "v": [np.array([1, 2]), np.array([3, 4])], "y": [0, 1]})
    matrix, names = features(frame, ["f", "v"], "y")
    assert names == ["f", "v[0]", "v[1]"]
    assert matrix.tolist() == [[1.0, 1.0, 2.0], [2.0, 3.0, 4.0]]
    assert features(frame[["f", "y"]], None, "y")[1] == ["f"]


def test_a_new_class_or_another_schema_is_refused_naming_the_file() -> None:
    schema = {"f0": "float64", "label": "int64"}
    ok = {"path": "d/ok.parquet", "missing": [], "columns": schema, "labels": [0, 1]}
    refuse_incompatible([ok], schema, [0, 1, 2], "d/")
    new_class = {**ok, "path": "d/new.parquet", "labels": [1, 7]}
    with pytest.raises(DataError, match=r"d/new\.parquet holds class value\(s\) \[7\].*Nothing"):
        refuse_incompatible([ok, new_class], schema, [0, 1, 2], "d/")
    other = {**ok, "path": "d/other.parquet", "columns": {"f0": "object", "label": "int64"}}
    with pytest.raises(DataError, match=r"d/other\.parquet has the columns"):
        refuse_incompatible([other], schema, [0, 1], "d/")
    missing = {**ok, "path": "d/m.parquet", "missing": ["label"]}
    with pytest.raises(DataError, match=r"d/m\.parquet has no column\(s\) \['label'\]"):
        refuse_incompatible([missing], schema, None, "d/")


def test_job_files_validate_append_and_drift() -> None:
    from dvml.exceptions import ConfigError
    from dvml.jobs.schemas import FIT_MULTIPLE_SCHEMA, JOB_SCHEMA
    from dvml.jobs.yaml_schema import validate

    base = {"name": "j", "model": {"architecture": 1, "compile_params": "loss='mse'"}}
    job = validate({**base, "data": {"source": "drops/", "append": True},
                    "drift": {"fail_above": 0.3}}, JOB_SCHEMA)  # fmt: skip
    assert job["data"]["append"] is True and job["drift"] == {"fail_above": 0.3, "bins": 10}
    assert validate({**base, "data": {"source": "d/"}}, JOB_SCHEMA)["data"]["append"] is False
    with pytest.raises(ConfigError, match=r"data\.append: true .*sklearn:digits"):
        validate({**base, "data": {"source": "sklearn:digits", "append": True}}, JOB_SCHEMA)
    with pytest.raises(ConfigError, match="append"):
        validate({**base, "data": {"source": "d/", "append": "yes"}}, JOB_SCHEMA)
    with pytest.raises(ConfigError, match="bins"):
        validate({**base, "data": {"source": "d/"}, "drift": {"bins": 1}}, JOB_SCHEMA)
    assert "append" not in FIT_MULTIPLE_SCHEMA["data"].fields  # type: ignore[union-attr]


def test_a_killed_runs_append_is_recognised_by_the_version_record() -> None:
    from types import SimpleNamespace

    from dvml.jobs.appends import already_appended

    files = [{"path": "file:///d/c.parquet"}, {"path": "file:///d/d.parquet"}]
    appended = SimpleNamespace(
        versions=[{"parent": None}, {"parent": 1, "source": {"files": files}}]
    )
    assert already_appended(appended, ["/d/d.parquet", "/d/c.parquet"])
    assert not already_appended(appended, ["/d/c.parquet"])
    first = SimpleNamespace(versions=[{"parent": None, "source": {"files": files}}])
    assert not already_appended(first, ["/d/c.parquet", "/d/d.parquet"])


def test_hive_partitions_of_a_path() -> None:
    assert hive_partitions("/data/label=3/day=2026-11%2F29/part-0.parquet") == {
        "label": 3,
        "day": "2026-11/29",
    }
    assert hive_partitions("s3://bucket/drops/part=-1/x.parquet") == {"part": -1}
    assert hive_partitions("/data/label=3.parquet") == {}  # a file name is not a partition


def test_a_hive_partition_label_is_a_column_of_each_new_file(tmp_path: Any) -> None:
    # pandas reads one file without its hive columns; the check must see them as the Dask
    # read that packs the files does, else every file "has no column label"
    for label in (0, 1):
        (tmp_path / f"label={label}").mkdir()
        frame = pd.DataFrame({"a": np.arange(4.0) + label, "b": np.ones(4)})
        frame.to_parquet(tmp_path / f"label={label}" / "day-1.parquet")
    path = str(tmp_path / "label=1" / "day-1.parquet")
    found = inspect_file(path, "parquet", None, ["a", "b"], "label", None, sample=10)
    assert found["missing"] == []
    assert found["labels"] == [1]
    assert found["names"] == ["a", "b"]
    refuse_incompatible([found], found["columns"], [0, 1], "drops")  # same schema, known class
    with pytest.raises(DataError, match=r"class value\(s\) \[1\]"):
        refuse_incompatible([found], found["columns"], [0], "drops")
