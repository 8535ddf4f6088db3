"""``sync="step"`` runs ONE all-reduce per step (the gradients), with real trainer processes.

Two MultiWorkerMirroredStrategy trainers on loopback (``tests.helpers.step_probe``), set up
as dvml's trainer sets them up. tf-keras alone ran eight all-reduces per step here (the
iterator's end-of-data check and the step's metrics), each a gRPC round trip on CPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from dvml.train.runtime.step_collectives import STEPS_PER_EXECUTION, steps_per_execution
from tests.helpers import REPO
from tests.helpers.processes import outputs_of

pytestmark = pytest.mark.tf


def test_steps_per_execution_is_at_most_an_epoch() -> None:
    assert steps_per_execution(1000) == STEPS_PER_EXECUTION
    assert steps_per_execution(7) == 7
    assert steps_per_execution(0) == 1


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _run_trainers(steps: int) -> list[dict[str, Any]]:
    ports = _free_ports(2)
    procs = []
    for index in range(2):
        env = dict(os.environ)
        env.update(
            TF_USE_LEGACY_KERAS="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            GRPC_VERBOSITY="ERROR",
            CUDA_VISIBLE_DEVICES="-1",
            TF_NUM_INTRAOP_THREADS="1",
            TF_NUM_INTEROP_THREADS="1",
            OMP_NUM_THREADS="1",
            TF_CONFIG=json.dumps(
                {
                    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                    "task": {"type": "worker", "index": index},
                }
            ),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.step_probe", str(steps)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = outputs_of(procs)
    found = []
    for proc, out in zip(procs, outputs, strict=True):
        lines = [x for x in out.splitlines() if x.startswith("PROBE ")]
        assert proc.returncode == 0 and lines, out[-3000:]
        found.append(json.loads(lines[-1][len("PROBE ") :]))
    return found


def test_a_step_runs_one_all_reduce_and_the_epoch_logs_stay_global() -> None:
    first, second = _run_trainers(steps=15)  # 15 x 16 of 256 rows per trainer
    # the gradients, and nothing else, are all-reduced inside the train function
    assert first["all_reduces"] == second["all_reduces"] == 1
    assert first["weights"] == second["weights"]
    # each step's logs are the trainer's own (its own rows: they differ) ...
    assert first["last_step"]["loss"] != second["last_step"]["loss"]
    # ... the epoch's are summed over both trainers, as before: identical on both
    assert first["epoch"] == second["epoch"]
    assert set(first["epoch"]) == {"loss", "accuracy"}
