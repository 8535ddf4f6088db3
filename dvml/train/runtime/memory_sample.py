"""A trainer's own resident bytes, sampled at the end of each iteration for the memory plan's
accounting (:mod:`dvml.train.memory_use`).

What is counted is the process's proportional set size (PSS) less its share of shared memory
(``Pss_Shmem``): the bytes the plan counts per trainer (TensorFlow's runtime, the model, its
batches and evaluation, measured as PSS by the plan's ``memory.trainer-runtime``), without the
vineyard buffers it maps zero-copy, which the plan counts once, in their vineyardd. Read from
``/proc/self/smaps_rollup`` (one summed record: a fraction of a millisecond, where walking
``smaps`` takes tens), so a sample costs nothing next to an iteration.
"""

from __future__ import annotations

__all__ = ["parse_rollup", "resident_bytes", "sample"]

ROLLUP = "/proc/self/smaps_rollup"


def parse_rollup(text: str) -> dict[str, int]:
    """The ``Name: N kB`` fields of an ``smaps_rollup`` text, in bytes."""
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * 1024
    return fields


def resident_bytes(fields: dict[str, int]) -> int | None:
    """PSS less shared memory (see the module's docstring); None without a ``Pss`` field."""
    if "Pss" not in fields:
        return None
    return fields["Pss"] - fields.get("Pss_Shmem", 0)


def sample(path: str = ROLLUP) -> int | None:
    """This process's resident bytes now; None where the kernel has no ``smaps_rollup``."""
    try:
        with open(path) as f:
            return resident_bytes(parse_rollup(f.read()))
    except OSError:
        return None
