"""Closing a LocalCluster whose workers ran TensorFlow: no worker is SIGKILLed by its Nanny.

TensorFlow's interpreter teardown took ~3 s in a worker that evaluated a model; the Nanny gives
a closing worker 4 s, then logs "Worker process still alive after 4.0 seconds, killing" (5 of 8
runs that trained, issue 28). ``dvml.cluster.worker_exit`` ends such a worker with ``os._exit``
once every ``atexit`` handler has run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

_SCRIPT = """
import dvml

def load_tensorflow():
    from dvml import tf_runtime
    tf = tf_runtime.tensorflow()
    return float(tf.constant(1.0) + 1)

if __name__ == "__main__":
    cluster = dvml.LocalCluster(n_workers=2, vineyard_memory="64MiB")
    assert list(cluster.client.run(load_tensorflow).values()) == [2.0, 2.0]
    cluster.close()
    print("closed", flush=True)
"""


def test_workers_that_ran_tensorflow_exit_when_the_cluster_closes() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "closed"
    assert "still alive" not in result.stderr, result.stderr[-3000:]
    assert "killing" not in result.stderr, result.stderr[-3000:]
