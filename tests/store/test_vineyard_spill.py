"""What vineyardd's spill to disk can and cannot do for dvml (issue 38: "beyond memory").

A real vineyardd 0.24.2 with ``--spill_path``, 64 MiB of shared memory, 20 MiB blobs. The
findings the Memory guide states (docs/guides/memory.md, "Datasets larger than shared
memory"), checked so that a vineyard that changes them fails here:

- blobs that no client holds any more are spilled when a put needs room, and read back;
- a reader holds every blob it got for as long as it is connected (the Python client has no
  ``release``), so a reader cannot hold more than the shared memory: the third reload of
  three 20 MiB blobs fills 64 MiB, and the next ones fail with NotEnoughMemory. A trainer
  holds its partitions zero-copy for the whole fit: spill cannot serve it a partition set
  larger than shared memory, which is why dvml refuses such a pack (MemoryPlanError).
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dvml.cluster.daemons import vineyardd_command
from dvml.cluster.processes import ManagedProcess

MiB = 1 << 20
BLOB = 20 * MiB


@pytest.fixture
def spilling_vineyardd(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """A lone vineyardd (local metadata, no RPC) of 64 MiB that spills into ``tmp_path``."""
    sock, spill = tmp_path / "v.sock", tmp_path / "spill"
    spill.mkdir()
    argv = [*vineyardd_command(), f"--socket={sock}", f"--size={64 * MiB}", "--meta=local",
            "--rpc=false", f"--spill_path={spill}", "--spill_lower_rate=0.3",
            "--spill_upper_rate=0.8", f"--log_dir={tmp_path}"]  # fmt: skip
    daemon = ManagedProcess("spilling vineyardd", argv, str(tmp_path / "vineyardd.log"))
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and daemon.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sock.exists(), daemon.log_tail()
        yield str(sock), spill
    finally:
        daemon.stop()


def _put_released(sock: str, value: int) -> Any:
    """Put one blob from a client that then disconnects (so nothing holds it)."""
    import vineyard

    client = vineyard.connect(sock)
    try:
        oid = client.put(np.full(BLOB // 4, value, dtype=np.float32))
        client.persist(oid)
        return oid
    finally:
        client.close()


def test_spill_frees_room_for_puts_but_not_for_a_reader_that_holds_its_blobs(
    spilling_vineyardd: tuple[str, pathlib.Path],
) -> None:
    import vineyard
    from vineyard._C import NotEnoughMemoryException

    sock, spill = spilling_vineyardd
    ids = [_put_released(sock, i) for i in range(6)]  # 120 MiB into 64 MiB: spilled
    assert sum(f.stat().st_size for f in spill.iterdir()) >= 40 * MiB
    reader = vineyard.connect(sock)
    try:
        held = []
        with pytest.raises(NotEnoughMemoryException, match="reload spilling file"):
            for oid in ids:
                held.append(np.asarray(reader.get(oid)))  # zero-copy, as a trainer reads
        # what it could hold: as many blobs as fit in shared memory, each read back intact
        assert 1 <= len(held) <= 3
        assert all(float(b[0]) == i and float(b[-1]) == i for i, b in enumerate(held))
    finally:
        reader.close()
