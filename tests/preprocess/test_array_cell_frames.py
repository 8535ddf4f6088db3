"""A pandas frame with a column of array cells: stacked on the client, prepared like arrays."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import DataError
from dvml.preprocess.graph import compute_stats
from dvml.preprocess.sources import source_parts
from dvml.preprocess.tasks import ClientPart, prepare_scattered, prepare_table
from tests.helpers import poll_for


def _frame(n: int = 103) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    cells = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(n)]
    if n > 5:
        cells[5][0, 0] = np.nan  # one invalid row, counted the same way by both paths
    return pd.DataFrame({"pixels": cells, "digit": rng.choice([7, 3, 5], size=n)})


def test_the_client_does_not_import_dask_dataframe_for_it() -> None:
    """Importing dask.dataframe took ~0.5 s of the first pack's client time (issue 29's B20d);
    a frame of array cells is stacked without it. In a fresh interpreter: this one has it."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, pandas as pd\n"
        "from dvml.preprocess.sources import source_parts\n"
        "frame = pd.DataFrame({'x': list(np.ones((8, 2, 2), 'float32')), 'y': [0, 1] * 4})\n"
        "assert len(source_parts(frame, 'y', 'x', 2, 'raise', None, 1).parts) == 4\n"
        "print('dask.dataframe' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_same_prepared_rows_as_the_table_path() -> None:
    frame = _frame()
    src = source_parts(frame, "digit", "pixels", 4, "drop", None, 3, 255.0)
    assert src.x_names == [["pixels"]] and src.y == "digit"
    assert len(src.parts) == 8  # 2 per target, as dd.from_pandas would split it
    # held by the client, scattered by the pack straight to the workers (not in the graph)
    assert all(isinstance(p, ClientPart) for p in src.parts)
    batches = [prepare_scattered(p.fn, p.args) for p in src.parts]
    assert all(len(batch) == 1 for batch in batches)  # one part per task here
    parts = [batch[0] for batch in batches]
    reference = prepare_table(frame, [["pixels"]], "digit", "drop", 255.0)
    x = np.concatenate([p["x"][0] for p in parts])
    assert x.dtype == reference["x"][0].dtype == np.float32
    np.testing.assert_array_equal(x, reference["x"][0])
    np.testing.assert_array_equal(np.concatenate([p["labels"] for p in parts]), reference["labels"])
    assert sum(p["dropped"] for p in parts) == reference["dropped"] == 1
    assert [p["invalid"] for p in parts if p["invalid"]] == [reference["invalid"]]


def test_ragged_cells_raise_on_the_client() -> None:
    frame = _frame(4)
    cells = frame["pixels"].tolist()
    cells[2] = np.zeros((3, 3), dtype=np.float32)
    frame["pixels"] = pd.Series(cells, dtype=object)
    with pytest.raises(DataError, match="different shapes"):
        source_parts(frame, "digit", "pixels", 2, "raise", None, 3)


def test_missing_column_names_it() -> None:
    with pytest.raises(DataError, match="missing from the source"):
        source_parts(_frame(4), "label", "pixels", 2, "raise", None, 3)


def test_a_worker_that_dies_holding_part_of_a_frame_gets_it_sent_again(
    local_cluster: Callable[..., dvml.LocalCluster],
) -> None:
    """The parts of an in-memory frame are scattered to the workers (only the client has
    another copy): a worker SIGKILLed while it prepares one makes the client send it again,
    and every row is prepared once, as in an undisturbed run."""
    cluster = local_cluster(n_workers=2)
    client = cluster.client
    victim = "worker-1"
    address = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == victim)
    pid = cluster.processes()[f"dask worker {victim}"]

    def slow(x: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
        import time as clock

        from dvml.preprocess.tasks import prepare_arrays

        clock.sleep(3)
        return prepare_arrays([x], labels, ["x"], "y", "raise")

    parts = [ClientPart(slow, (np.full((10, 2), i, np.float32), np.arange(10) % 2))
             for i in range(4)]  # fmt: skip
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = compute_stats(client, parts)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert poll_for(lambda: bool(client.processing(workers=[address]).get(address)), 30)
        os.kill(pid, signal.SIGKILL)
    finally:
        thread.join(120)
    assert "error" not in outcome, outcome
    futures, stats, sizes = outcome["value"]
    assert sizes == [1, 1, 1, 1] and len(stats) == 4
    prepared = [batch[0] for batch in client.gather(futures)]
    values = sorted(int(p["x"][0][0, 0]) for p in prepared)
    assert values == [0, 1, 2, 3]  # each part once, whichever worker prepared it
    client.cancel(futures)
