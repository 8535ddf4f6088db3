"""A trainer's resident bytes (the smaps_rollup sample) and a fit's memory against its plan."""

from __future__ import annotations

import numpy as np

from dvml.train.memory_use import over_plan, trainer_memory_use
from dvml.train.runtime import memory_sample

ROLLUP = """564589e47000-7fff45114000 ---p 00000000 00:00 0                          [rollup]
Rss:              900000 kB
Pss:              700000 kB
Pss_Shmem:        200000 kB
Private_Dirty:    400000 kB
"""


def test_resident_bytes_are_pss_without_the_shared_memory_buffers() -> None:
    fields = memory_sample.parse_rollup(ROLLUP)
    assert (
        fields["Pss"] == 700000 * 1024
        and "564589e47000-7fff45114000 ---p 00000000 00" not in fields
    )
    assert memory_sample.resident_bytes(fields) == 500000 * 1024
    assert memory_sample.resident_bytes({}) is None


def test_a_sample_of_this_process_grows_with_what_it_holds() -> None:
    before = memory_sample.sample()
    assert before is not None and before > 0
    held = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB, touched
    after = memory_sample.sample()
    assert after is not None and after - before > 48 * 2**20
    del held
    assert memory_sample.sample("/nonexistent/smaps_rollup") is None


def test_peaks_per_trainer_against_the_plan_and_its_margin() -> None:
    planned = {"w0": 1000, "w1": 1000}
    samples = [("w0", 900), ("w1", 1100), ("w0", 1150), ("w1", None), ("w2", 10)]
    use = trainer_memory_use(planned, samples, margin=0.2)
    assert use["trainer_memory"] == {
        "w0": {"planned_bytes": 1000, "peak_bytes": 1150},
        "w1": {"planned_bytes": 1000, "peak_bytes": 1100},
        "w2": {"planned_bytes": None, "peak_bytes": 10},
    }
    assert use["memory_over_plan"] == []  # 1150 is within 1000 + 20 %
    assert trainer_memory_use(planned, samples, margin=0.1)["memory_over_plan"] == ["w0"]
    assert not over_plan(None, 10**12, 0.2) and not over_plan(10, None, 0.2)
