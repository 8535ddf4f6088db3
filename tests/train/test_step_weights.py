"""``sync="step"`` with unequal local batches keeps "a step's gradient is the mean over the
global batch's rows" (issue 37, item 2), in tf-keras as installed, with real processes.

tf-keras under MultiWorkerMirroredStrategy takes each trainer's loss as the mean over its
LOCAL batch (SUM_OVER_BATCH_SIZE divides by the number of rows, not by the weights' sum),
scales it by 1/n and sums the gradients: a row in a batch of 2 would weigh 3x a row in a
batch of 6. Weighting each row ``n * b / B`` (dvml.resolve.tfdata's ``row_weight``) makes the
sum the mean over all B rows. Two trainers of a two-output model (mse + crossentropy), local
batches of 6 and 2 rows, 4 SGD steps each, against one process with the 8 rows in one batch.

The same trainers time their wait in the all-reduce (dvml.train.runtime.collective_wait,
the straggler rule's figure with sync="step"): trainer 1's input sleeps 0.15 s per batch, so
trainer 0 waits for it in every step, and the timing leaves the gradients unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO
from tests.helpers.processes import outputs_of
from tests.train.test_step_collectives import _free_ports

pytestmark = pytest.mark.tf

ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR",
       "CUDA_VISIBLE_DEVICES": "-1", "TF_NUM_INTRAOP_THREADS": "1",
       "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip


def _weights(output: str) -> list[np.ndarray]:
    line = next((s for s in output.splitlines() if s.startswith("WEIGHTS ")), None)
    assert line is not None, output[-3000:]
    return [np.asarray(w) for w in json.loads(line[len("WEIGHTS ") :])]


def _wait(output: str) -> float:
    line = next((s for s in output.splitlines() if s.startswith("WAIT ")), None)
    assert line is not None, output[-3000:]
    return float(line.split()[1])


def _run(mode: str, weighted: bool) -> list[str]:
    ports = _free_ports(2)
    procs = []
    for index in range(1 if mode == "single" else 2):
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        env = {**os.environ, **ENV}
        if mode != "single":
            task = {"type": "worker", "index": index}
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.step_weights", mode, str(int(weighted))],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))  # fmt: skip
    outputs = outputs_of(procs)
    return outputs


def test_weighted_unequal_local_batches_give_the_global_mean_gradient() -> None:
    (single,) = _run("single", False)
    expected = _weights(single)
    weighted = _run("trainer", True)
    for output in weighted:  # both trainers hold the same weights: the global mean's step
        for got, want in zip(_weights(output), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # without the weights the step is another one (the rows of the small batch weigh more)
    # trainer 0 waited in the all-reduce for trainer 1's slow input, trainer 1 hardly
    waits = [_wait(output) for output in weighted]
    assert waits[0] > 0.3 and waits[1] < waits[0] / 2, waits
    unweighted = _weights(_run("trainer", False)[0])
    assert not all(np.allclose(g, w, atol=1e-4) for g, w in zip(unweighted, expected, strict=True))
