"""Model averaging (``dvml.train.runtime.averaging``) over a real TensorFlow collective.

Two trainer-like processes on this machine, each with its own ``TF_CONFIG`` and a
``MultiWorkerMirroredStrategy`` (as a ``sync="iteration"`` trainer sets them up), build the
same small model with different weights and hold different row counts. After ``broadcast``
both hold the chief's weights bit for bit; after ``average`` both hold the row-weighted mean,
identical on both (the sum runs in float64).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dvml.cluster.processes import free_port
from tests.helpers import REPO

pytestmark = pytest.mark.tf

PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from dvml import tf_runtime
    from dvml.train.runtime.averaging import Averager, averaging_callback
    from dvml.train.sync import flatten

    tf = tf_runtime.start()
    keras = tf_runtime.keras()
    rank, rows, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.random.set_seed(rank)  # each trainer's own initial weights, as outside the scope
    model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])
    averager = Averager(strategy, rows)
    own = flatten(model.get_weights())
    averager.broadcast(model, chief=rank == 0)
    broadcast = flatten(model.get_weights())
    model.set_weights([w + (rank + 1) for w in model.get_weights()])  # apart again
    before = flatten(model.get_weights())
    averager.average(model)
    averaged = flatten(model.get_weights())
    # sync=k: the callback averages every 2 batches and flushes the rest
    model.compile(optimizer="sgd", loss="mse")
    callback = averaging_callback(keras, averager, every=2)
    x = np.full((3 * 4, 3), rank + 1.0, dtype="float32")
    model.fit(x, np.zeros((12, 2), "float32"), batch_size=4, epochs=1, verbose=0,
              callbacks=[callback], shuffle=False)
    callback.flush(model)
    np.savez(out, own=own, broadcast=broadcast, before=before, averaged=averaged,
             fitted=flatten(model.get_weights()), count=averager.count)
    """
)


def test_broadcast_then_row_weighted_average_are_identical_on_every_trainer(
    tmp_path: object,
) -> None:
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    rows = [3, 1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3",
               "TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": "worker", "index": rank}})}  # fmt: skip
        out = f"{tmp_path}/trainer-{rank}.npz"
        procs.append(subprocess.Popen(
            [sys.executable, "-c", PROGRAM, str(rank), str(rows[rank]), out], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    chief, other = (np.load(f"{tmp_path}/trainer-{r}.npz") for r in (0, 1))
    assert not np.array_equal(chief["own"], other["own"])  # they started apart
    for t in (chief, other):  # the chief's weights, bit for bit, on both
        np.testing.assert_array_equal(t["broadcast"], chief["own"])
    expected = (3 * chief["before"] + 1 * other["before"]) / 4
    np.testing.assert_allclose(chief["averaged"], expected, rtol=1e-6)
    np.testing.assert_array_equal(chief["averaged"], other["averaged"])  # identical bits
    # 3 batches, every=2: one average in the epoch and one at the flush; same bits again
    assert int(chief["count"]) == int(other["count"]) == 1 + 2
    np.testing.assert_array_equal(chief["fitted"], other["fitted"])
