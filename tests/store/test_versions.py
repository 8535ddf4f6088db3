"""Dataset versions as plain values: records, the layout of one version, the balance of
appended rows (dvml.store.versions) and the planner's placement of them. No cluster."""

from __future__ import annotations

import numpy as np
import pytest

from dvml.exceptions import ArgumentError, DatasetNotFoundError, PlacementError
from dvml.placement.planner import plan_layout
from dvml.store.versions import (
    at_version,
    balance_new_rows,
    buffer_digest,
    field_digest,
    next_versions,
    summary_at,
    versions_of,
)


def _buffer(index: int, rows: int, version: int | None = None) -> dict:
    b = {
        "index": index,
        "rows": rows,
        "fields": {
            "x_0": {"id": 100 + index, "shape": [rows, 4], "digest": f"x{index}"},
            "y": {"id": 200 + index, "shape": [rows, 3], "digest": f"y{index}"},
        },
    }
    if version is not None:
        b["version"] = version
    return b


def _layout(buffers: list[dict]) -> dict:
    return {
        "fields": {
            "x_0": {"shape": [sum(b["rows"] for b in buffers), 4]},
            "y": {"shape": [sum(b["rows"] for b in buffers), 3]},
        },
        "buffers": buffers,
    }


@pytest.mark.parametrize(
    ("existing", "new", "expected"),
    [
        ({"a": 75, "b": 75}, 31, {"a": 16, "b": 15}),  # level: the first takes the extra row
        ({"a": 75, "b": 76}, 1, {"a": 1, "b": 0}),  # the emptier worker first
        ({"a": 10, "b": 0, "c": 5}, 12, {"a": 0, "b": 9, "c": 3}),  # b, c up to 8, 1 more: b
        ({"a": 10, "b": 0}, 4, {"a": 0, "b": 4}),  # cannot level: all to the emptiest
        ({"a": 3, "b": 3, "c": 3}, 0, {"a": 0, "b": 0, "c": 0}),
        ({"a": 0}, 7, {"a": 7}),
        ({"a": 5, "b": 5, "c": 9}, 8, {"a": 4, "b": 4, "c": 0}),  # all level at 9
        ({"a": 5, "b": 5, "c": 9}, 10, {"a": 5, "b": 5, "c": 0}),  # 9 9 9, then a, b one more
    ],
)
def test_balance_new_rows(existing: dict, new: int, expected: dict) -> None:
    got = balance_new_rows(existing, new)
    assert got == expected
    assert sum(got.values()) == new
    totals = [existing[w] + got[w] for w in existing]
    # as level as giving rows (never taking) allows
    assert max(totals) - min(totals) <= max(1, max(existing.values()) - min(totals))


@pytest.mark.parametrize(
    ("existing", "new", "error"),
    [({}, 3, ArgumentError), ({"a": 1}, -1, ArgumentError), ({"a": 1}, 1.5, TypeError)],
)
def test_balance_new_rows_refuses(existing: dict, new: object, error: type) -> None:
    with pytest.raises(error, match="Received"):
        balance_new_rows(existing, new)  # type: ignore[arg-type]


def test_a_dataset_without_versions_reads_as_version_one() -> None:
    layout = _layout([_buffer(0, 5), _buffer(1, 4)])
    (v1,) = versions_of(None, layout, "2026-01-01T00:00:00+00:00")
    assert (v1["version"], v1["rows"], v1["buffers"], v1["readable"]) == (1, 9, [0, 1], True)
    assert v1["digests"] == {"0": buffer_digest(_buffer(0, 5)), "1": buffer_digest(_buffer(1, 4))}
    assert at_version("d", layout, [v1], 1)["buffers"] == layout["buffers"]


def test_append_versions_and_the_layout_of_each() -> None:
    v1 = next_versions(None, [_buffer(0, 5), _buffer(1, 5)], {"description": "a"}, "t1", False)
    layout = _layout([_buffer(0, 5, 1), _buffer(1, 5, 1), _buffer(2, 3, 2)])
    v2 = next_versions(v1, [_buffer(2, 3)], {"description": "b"}, "t2", append=True)
    assert [(v["version"], v["parent"], v["rows"]) for v in v2] == [(1, None, 10), (2, 1, 3)]
    old = at_version("d", layout, v2, 1)
    assert [b["index"] for b in old["buffers"]] == [0, 1]
    assert old["fields"]["x_0"]["shape"] == [10, 4]
    assert at_version("d", layout, v2, 2)["fields"]["y"]["shape"] == [13, 3]
    assert at_version("d", layout, v2, None) == layout
    with pytest.raises(DatasetNotFoundError, match=r"Version 3 .* does not exist.*\[1, 2\]"):
        at_version("d", layout, v2, 3)
    with pytest.raises(TypeError, match="version must be an int"):
        at_version("d", layout, v2, "2")  # type: ignore[arg-type]


def test_an_earlier_versions_summary_counts_its_own_buffers() -> None:
    def placed(index: int, rows: int, version: int, worker: str) -> dict:
        b = _buffer(index, rows, version)
        for f in b["fields"].values():
            f["nbytes"] = rows * 4
        return {**b, "worker": f"tcp://{worker}", "worker_name": worker, "host": "h",
                "instance_id": 0}  # fmt: skip

    v1 = next_versions(None, [_buffer(0, 5), _buffer(1, 5)], {"description": "a"}, "t1", False)
    v2 = next_versions(v1, [_buffer(2, 3)], {"description": "b"}, "t2", append=True)
    layout = _layout([placed(0, 5, 1, "a"), placed(1, 5, 1, "b"), placed(2, 3, 2, "a")])
    latest = {"rows": 13, "rows_per_worker": {"a": 8, "b": 5}, "appended_at": "t2",
              "class_values": [0, 1, 2], "buffers": ["three lines"]}  # fmt: skip
    first = summary_at(latest, at_version("d", layout, v2, 1), v2[0])
    assert (first["rows"], first["rows_per_worker"]) == (10, {"a": 5, "b": 5})
    assert first["bytes_per_worker"] == {"a": 40, "b": 40}  # two fields of 5 rows x 4 bytes
    assert [line["buffer"] for line in first["buffers"]] == [0, 1]
    assert "appended_at" not in first and first["class_values"] == [0, 1, 2]
    second = summary_at(latest, at_version("d", layout, v2, 2), v2[1])
    assert (second["rows"], second["appended_at"]) == (13, "t2")


def test_an_overwrite_keeps_the_records_of_freed_versions_not_readable() -> None:
    v1 = next_versions(None, [_buffer(0, 5)], None, "t1", False)
    v2 = next_versions(v1, [_buffer(0, 7)], None, "t2", append=False)
    assert [(v["version"], v["readable"], v["parent"]) for v in v2] == [
        (1, False, None),
        (2, True, None),
    ]
    with pytest.raises(DatasetNotFoundError, match="freed by an overwrite"):
        at_version("d", _layout([_buffer(0, 7, 2)]), v2, 1)


def test_digests_follow_the_bytes() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert field_digest(a) == field_digest(a.copy())
    b = a.copy()
    b[2, 3] = 0.5
    assert field_digest(a) != field_digest(b)
    assert field_digest(np.zeros((0, 4), np.float32)) != field_digest(np.zeros(1, np.uint8))
    one = _buffer(0, 3)
    other = _buffer(0, 3)
    other["fields"]["y"]["digest"] = "changed"
    assert buffer_digest(one) != buffer_digest(other)
    del other["fields"]["y"]["digest"]
    assert buffer_digest(other) is None  # a buffer written before digests existed


def test_planner_places_appended_rows_where_asked() -> None:
    layout = plan_layout([10, 6], ["a", "b", "c"], 4, 16, 1 << 20, 7, {"a": 0, "b": 9, "c": 7})
    assert layout.rows_per_worker == {"a": 0, "b": 9, "c": 7}
    assert [(b.worker, b.rows) for b in layout.buffers] == [
        ("b", 4),
        ("b", 4),
        ("b", 1),
        ("c", 4),
        ("c", 3),
    ]
    assert layout.counts.sum(axis=0).tolist() == [4, 4, 1, 4, 3]
    assert layout.counts.sum(axis=1).tolist() == [10, 6]
    # fewer new rows than workers is fine for an append (no worker is left without rows)
    assert plan_layout([1], ["a", "b"], None, 16, 1 << 20, 0, {"a": 1}).rows_per_worker == {
        "a": 1,
        "b": 0,
    }
    with pytest.raises(PlacementError, match="summing to the input's 16 rows"):
        plan_layout([10, 6], ["a", "b"], 4, 16, 1 << 20, 7, {"a": 1, "b": 2})
    with pytest.raises(PlacementError, match="rows_per_worker"):
        plan_layout([3], ["a"], 4, 16, 1 << 20, 7, {"a": 1, "z": 2})
