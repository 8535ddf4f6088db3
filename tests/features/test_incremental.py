"""Which feature cache an append extends, and which buffers it featurizes (pure)."""

from __future__ import annotations

from dvml.features.incremental import covered_buffers, new_buffers, source_digests

VERSIONS = [
    {"version": 1, "digests": {"0": "a", "1": "b"}},
    {"version": 2, "digests": {"2": "c"}},
    {"version": 3, "digests": {"3": "d"}},
]


def test_a_versions_digests_are_its_buffers_and_the_older_ones() -> None:
    assert source_digests(VERSIONS, 1) == {"0": "a", "1": "b"}
    assert source_digests(VERSIONS, 3) == {"0": "a", "1": "b", "2": "c", "3": "d"}


def test_a_cache_is_extended_only_under_its_lineage_with_unchanged_buffers() -> None:
    summary = {"lineage_key": "L", "source": {"version": 1, "digests": {"0": "a", "1": "b"}}}
    now = source_digests(VERSIONS, 3)
    assert covered_buffers(summary, "L", now) == 1
    assert covered_buffers(summary, "other", now) is None  # another backbone, layer...
    assert covered_buffers(summary, "L", {**now, "1": "changed"}) is None
    assert covered_buffers({"lineage_key": "L", "source": {}}, "L", now) is None  # no record
    assert covered_buffers({**summary, "source": {"version": 1, "digests": {"0": None}}}, "L",
                           now) is None  # fmt: skip


def test_the_new_buffers_are_those_added_after_the_covered_version() -> None:
    layout = {"buffers": [{"index": 0}, {"index": 1, "version": 1}, {"index": 2, "version": 2},
                          {"index": 3, "version": 3}]}  # fmt: skip
    assert new_buffers(layout, 1) == [2, 3]
    assert new_buffers(layout, 3) == []
