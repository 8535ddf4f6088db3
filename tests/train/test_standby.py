"""A standby trainer never outlives the process that holds its stdin."""

from __future__ import annotations

import os
import subprocess
import sys

from dvml import tf_runtime


def test_standby_exits_when_its_stdin_closes() -> None:
    env = tf_runtime.trainer_environment(os.environ, None, use_gpus=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvml.train.trainer", "--standby"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.poll() is None  # it waits for a job
        proc.stdin.close()  # type: ignore[union-attr]  # what a killed worker does
        assert proc.wait(180) == 0  # after its imports it reads EOF and runs nothing
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
