"""Workers do not log "Compute Failed" for failures that dvml reports itself (#13 item 10)."""

from __future__ import annotations

from typing import Any

import pytest

import dvml
from dvml.cluster.worker_logging import dvml_error_names, is_reported_failure
from dvml.exceptions import DataError

ARGS = ("key-1", "executing", "<task>", "DataError('3 rows hold NaN')", "<traceback>")


def test_only_dvml_errors_are_dropped() -> None:
    names = dvml_error_names()
    assert {"DvmlError", "DataError", "ArgumentError", "StoreError"} <= names
    assert is_reported_failure("Compute Failed\nKey: %s\n", ARGS, names)
    bug = (*ARGS[:3], "ZeroDivisionError('division by zero')", ARGS[4])
    assert not is_reported_failure("Compute Failed\nKey: %s\n", bug, names)
    assert not is_reported_failure("Something else %s", ARGS, names)
    assert not is_reported_failure("Compute Failed", ("too", "short"), names)


def _compute_failed(client: Any) -> list[str]:
    return [
        text
        for records in client.get_worker_logs().values()
        for _level, text in records
        if "Compute Failed" in text
    ]


@pytest.mark.cluster
def test_a_worker_logs_a_bug_but_not_a_dvml_error(cluster2: dvml.LocalCluster) -> None:
    client = cluster2.client
    marker = "no-such-rows-7f3a"

    def expected_failure() -> None:
        raise DataError(f"{marker}: x holds NaN. Received: 3 rows. Pass on_invalid='drop'.")

    def a_bug() -> None:
        raise ZeroDivisionError(f"{marker}: a bug")

    with pytest.raises(DataError, match=marker):
        client.submit(expected_failure, pure=False).result()
    with pytest.raises(ZeroDivisionError, match=marker):
        client.submit(a_bug, pure=False).result()
    failed = [t for t in _compute_failed(client) if marker in t]
    # The bug is logged by its worker (the check can fail: the log is captured), the
    # DataError that the caller reports is not.
    assert len(failed) == 1 and "ZeroDivisionError" in failed[0], failed
