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


def test_standby_goes_with_its_worker(tmp_path: object) -> None:
    import signal

    import dask.config

    import dvml
    from dvml import config
    from dvml.train import launch
    from tests.helpers import pid_gone, poll_for, standby_trainers, worker_descendants

    # Load dvml's defaults first: dask.config.set would otherwise drop them on exit.
    config.defaults()
    with (
        dask.config.set({"dvml.cluster.state-dir": str(tmp_path)}),
        dvml.LocalCluster(n_workers=2, set_as_default=False) as cluster,
    ):
        cluster.client.run(launch.start_standby)
        cluster.client.run(launch.start_standby)  # one per worker, not two
        first = cluster.processes()["dask worker worker-0"]

        def standbys(worker: str) -> list[int]:
            return standby_trainers(worker_descendants(cluster, worker))

        assert poll_for(lambda: len(standbys("worker-0")) == len(standbys("worker-1")) == 1, 30)
        killed, kept = standbys("worker-0")[0], standbys("worker-1")[0]
        # A worker killed outright: its standby reads EOF on stdin and exits by itself.
        os.kill(first, signal.SIGKILL)
        assert poll_for(lambda: pid_gone(killed), 120)
    # A worker closed normally stops its standby (WorkerPlugin teardown).
    assert poll_for(lambda: pid_gone(kept), 30)
