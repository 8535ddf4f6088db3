"""What a vineyardd without room tells the user to do (pure: the message's numbers)."""

from __future__ import annotations

import re

from dvml.store.tensors import memory_advice

MiB = 2**20


def test_memory_advice_names_what_helps_with_numbers() -> None:
    text = memory_advice(needed=48 * MiB, free=20 * MiB, limit=32 * MiB)
    assert "12 MiB of the 32 MiB are in use" in text
    # used 12 MiB + 48 MiB needed: a vineyardd of 60 MiB would hold it
    assert "at least 60 MiB" in text
    assert "does not help" in text and not re.search(r"[Uu]se a smaller buffer_size", text)
    for remedy in ("compact=True", "distribution_rules", "vineyard_memory", "dvml datasets"):
        assert remedy in text
    assert "overwrite=True" in text and "room for both" in text


def test_memory_advice_rounds_up_to_a_mib() -> None:
    assert "at least 2 MiB" in memory_advice(needed=MiB + 1, free=MiB, limit=MiB)
