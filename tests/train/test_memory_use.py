"""A trainer's resident bytes (the smaps_rollup sample) and a fit's memory against its plan."""

from __future__ import annotations

import numpy as np

from dvml.train.memory_use import over_plan, trainer_memory_use
from dvml.train.runtime import memory_sample

ROLLUP = """564589e47000-7fff45114000 ---p 00000000 00:00 0                          [rollup]
Rss:              900000 kB
Pss:              700000 kB
Pss_Shmem:        200000 kB
Private_Clean:     50000 kB
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


def test_a_forked_trainer_counts_its_private_pages_and_the_zygote_the_shared_ones() -> None:
    """A trainer forked from the zygote shares TensorFlow's pages with it: the zygote's
    resident set is counted once per machine, each trainer's private pages on their own."""
    fields = memory_sample.parse_rollup(ROLLUP)
    assert memory_sample.resident_bytes(fields, forked=True) == 450000 * 1024
    assert memory_sample.resident_bytes({"Pss": 1}, forked=True) is None
    assert memory_sample.zygote_bytes() is None  # this process was not forked by a zygote


ZYGOTE = """
import os, sys
import numpy as np
held = np.ones(96 * 2**20, dtype=np.uint8)  # 96 MiB the child shares, touched
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.environ["DVML_TRAINER_PARENT"] = str(os.getppid())
    from dvml.train.runtime import memory_sample
    os.write(write, str(memory_sample.zygote_bytes()).encode())
    os._exit(0)
os.waitpid(pid, 0)
with open("/proc/self/smaps_rollup") as f:
    rss = [int(l.split()[1]) * 1024 for l in f if l.startswith("Rss:")][0]
print(os.read(read, 64).decode(), rss)
"""


def test_the_zygotes_resident_set_is_its_rollups_rss() -> None:
    """zygote_bytes reads the kernel's counter (statm), not a page walk: the same figure."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", ZYGOTE, "--zygote"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()  # fmt: skip
    counted, walked = int(out[0]), int(out[1])
    assert walked > 96 * 2**20
    assert abs(counted - walked) < 4 * 2**20, (counted, walked)


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


def test_a_hosts_peak_is_its_trainers_and_their_zygote_once() -> None:
    from dvml.placement.fit_memory import HostRoom, HostRow, TrainerMemory

    def trainer(worker: str) -> TrainerMemory:
        return TrainerMemory(worker, "m", 8, 100, 0, 0, 0)

    hosts = [
        HostRow("m", (trainer("w0"), trainer("w1")), HostRoom("m", 10**6), 0.2, zygote=600),
        HostRow("n", (trainer("w2"),), HostRoom("n", 10**6), 0.2),
    ]
    table = {"w0": {"peak_bytes": 110}, "w1": {"peak_bytes": 90}, "w2": {"peak_bytes": None}}
    zygote = [("w0", 590), ("w1", 610), ("w0", None)]
    from dvml.train.memory_use import host_memory_use

    use = host_memory_use(hosts, table, zygote)
    assert use["m"] == {"planned_bytes": 800, "peak_bytes": 810, "zygote_peak_bytes": 610}
    # a trainer that sent no sample: the host's peak is unknown, not understated
    assert use["n"] == {"planned_bytes": 100, "peak_bytes": None, "zygote_peak_bytes": None}


def test_a_serving_trainer_plans_its_own_runtime_and_a_gpu_trainer_a_whole_one() -> None:
    import sys

    import dask

    from dvml.train.trainer_memory import trainer_runtime

    sizes = {"dvml.memory.trainer-runtime": "700MiB", "dvml.memory.zygote": "650MiB",
             "dvml.memory.trainer-runtime-forked": "128MiB",
             "dvml.memory.serving-runtime-forked": "96MiB",
             "dvml.train.fork-trainers": True}  # fmt: skip
    MiB = 2**20
    with dask.config.set(sizes):
        if sys.platform.startswith("linux"):
            assert trainer_runtime(False) == (128 * MiB, 650 * MiB)
            assert trainer_runtime(False, serving=True) == (96 * MiB, 650 * MiB)
        assert trainer_runtime(True, serving=True) == (700 * MiB, 0)  # GPU: no zygote
