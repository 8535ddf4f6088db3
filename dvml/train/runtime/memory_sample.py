"""A trainer's own resident bytes, sampled at the end of each iteration for the memory plan's
accounting (:mod:`dvml.train.memory_use`), and its zygote's.

What a trainer counts depends on how it started:

- **forked** from its machine's zygote (:mod:`dvml.cluster.zygote`, the default on Linux): its
  private pages (``Private_Clean + Private_Dirty``). The pages it still shares with the zygote
  (TensorFlow's and tf-keras' imports) are the zygote's, counted once per machine: the plan's
  ``memory.zygote``, sampled by :func:`zygote_bytes` as the zygote's resident set (from
  ``statm``). Its PSS
  would split those pages over however many trainers the zygote forked, standbys included.
- **a process of its own**: its proportional set size (PSS), the plan's
  ``memory.trainer-runtime``.

Both leave out the vineyard buffers the trainer maps zero-copy (``Pss_Shmem``; shared with
vineyardd, so never private), which the plan counts once, in their vineyardd. Read from
``/proc/self/smaps_rollup`` (one summed record, where walking ``smaps`` takes ten times as
long); the kernel still walks the process's pages for it: about 10 ms for a process that
imported TensorFlow (measured here), once per iteration.
"""

from __future__ import annotations

import os

from dvml.cluster.zygote import PARENT_ENV

__all__ = ["parse_rollup", "resident_bytes", "sample", "zygote_bytes"]

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


def resident_bytes(fields: dict[str, int], forked: bool = False) -> int | None:
    """A trainer's own bytes from its rollup (see the module's docstring): its private pages
    when ``forked``, else its PSS less shared memory; None without the fields."""
    if forked:
        if "Private_Clean" not in fields:
            return None
        return fields["Private_Clean"] + fields.get("Private_Dirty", 0)
    if "Pss" not in fields:
        return None
    return fields["Pss"] - fields.get("Pss_Shmem", 0)


def sample(path: str = ROLLUP) -> int | None:
    """This process's own resident bytes now; None where the kernel has no ``smaps_rollup``."""
    try:
        with open(path) as f:
            return resident_bytes(parse_rollup(f.read()), forked=PARENT_ENV in os.environ)
    except OSError:
        return None


def zygote_bytes() -> int | None:
    """The resident set of the zygote this trainer was forked from (its parent); None when it
    was not forked or the zygote is gone."""
    if PARENT_ENV not in os.environ:
        return None
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            if b"--zygote" not in f.read():
                return None  # the zygote died; this trainer was reparented
        with open(f"/proc/{parent}/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    # statm's resident set is the kernel's counter: what smaps_rollup's Rss sums by walking
    # every page of the zygote (about 10 ms for TensorFlow's), read in microseconds
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
