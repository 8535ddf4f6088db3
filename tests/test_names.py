"""User names (datasets, feature caches, models) are checked before they reach a path."""

from __future__ import annotations

from typing import Any

import pytest

from dvml.names import INTERNAL_PREFIX, MAX_NAME_LENGTH, check_name


@pytest.mark.parametrize(
    "name", ["digits", "digits_cnn", "model@candidate", "v1.2", "a-b+c", "X" * MAX_NAME_LENGTH]
)
def test_accepted(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "../../escaped", "/etc/passwd", "a/b", "..", ".hidden", "__mine", "a b", "tab\there",
     "nl\n", "\x00", "é", "X" * (MAX_NAME_LENGTH + 1), None, 3, b"bytes",
     f"{INTERNAL_PREFIX}x"],
)  # fmt: skip
def test_refused(name: Any) -> None:
    with pytest.raises(ValueError, match=r"Received: model="):
        check_name(name, "model")


def test_internal_names_only_where_allowed() -> None:
    assert check_name(f"{INTERNAL_PREFIX}features-source/x".replace("/x", "x"), internal=True)
    with pytest.raises(ValueError):
        check_name(f"{INTERNAL_PREFIX}../x", internal=True)
