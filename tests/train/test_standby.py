"""Standby trainers: one never outlives the process that holds its stdin, one after a job
waits until its worker is idle, and preprocessing a training set warms the first fit's."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from dvml import tf_runtime


def test_standby_exits_when_its_stdin_closes() -> None:
    env = tf_runtime.trainer_environment(os.environ, None, use_gpus=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvml.train.runtime.trainer", "--standby"],
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


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "own-process"])
def test_standby_goes_with_its_worker(tmp_path: object, forked: bool) -> None:
    import signal

    import dask.config
    import psutil

    import dvml
    from dvml import config
    from dvml.cluster import standby
    from tests.helpers import pid_gone, poll_for, standby_trainers, worker_descendants

    # Load dvml's defaults first: dask.config.set would otherwise drop them on exit.
    config.defaults()
    settings = {"dvml.cluster.state-dir": str(tmp_path), "dvml.train.fork-trainers": forked}
    with (
        dask.config.set(settings),
        dvml.LocalCluster(n_workers=2, set_as_default=False) as cluster,
    ):
        cluster.client.run(standby.start_standby)
        cluster.client.run(standby.start_standby)  # one per worker, not two
        first = cluster.processes()["dask worker worker-0"]

        def standbys(worker: str) -> list[int]:
            return standby_trainers(worker_descendants(cluster, worker))

        assert poll_for(lambda: len(standbys("worker-0")) == len(standbys("worker-1")) == 1, 30)
        killed, kept = standbys("worker-0")[0], standbys("worker-1")[0]
        parents = {psutil.Process(pid).ppid() for pid in (killed, kept)}
        if forked:  # both forked by the machine's one zygote, a child of neither worker
            (zygote,) = parents
            assert "--zygote" in psutil.Process(zygote).cmdline()
        else:
            assert parents == set(
                cluster.processes()[f"dask worker {w}"] for w in ("worker-0", "worker-1")
            )
        # A worker killed outright: its standby reads EOF on stdin and exits by itself.
        os.kill(first, signal.SIGKILL)
        assert poll_for(lambda: pid_gone(killed), 120)
        assert not pid_gone(kept)
    # A worker closed normally stops its standby (WorkerPlugin teardown), and the zygote ends
    # once no worker holds it.
    assert poll_for(lambda: pid_gone(kept), 30)
    if forked:
        assert poll_for(lambda: pid_gone(zygote), 30)


# -- when a standby starts: not while its worker works, and before the first fit ----------------


def _standby_pid_on(client: Any, address: str) -> int | None:
    from dvml.cluster import standby

    return client.run(standby.standby_pid, workers=[address])[address]  # type: ignore[no-any-return]


def _block_on(client: Any, address: str, event_name: str, key: str) -> Any:
    """A task on ``address`` that runs until the distributed Event ``event_name`` is set."""

    def wait_for_event(name: str) -> bool:  # nested: pickled by value for the worker
        from distributed import Event

        return bool(Event(name).wait(120))

    return client.submit(
        wait_for_event, event_name, key=key, workers=[address], allow_other_workers=False
    )


def test_a_standby_after_a_job_waits_until_its_worker_is_idle(cluster2: Any) -> None:
    import uuid

    from distributed import Event

    from dvml.cluster import standby
    from tests.helpers import poll_for

    client = cluster2.client
    client.run(standby.stop_standby)
    address = sorted(client.scheduler_info()["workers"])[0]
    tag = uuid.uuid4().hex[:8]

    # Work on the worker (an evaluate, say): the standby a finished job asked for waits.
    work = Event(f"dvml-test-work-{tag}", client=client)
    busy = _block_on(client, address, work.name, f"evaluate_local-{tag}")
    assert poll_for(lambda: bool(client.processing(workers=[address])[address]), 30)
    client.run(standby.start_standby_when_idle, workers=[address], quiet=0.5)
    assert not poll_for(lambda: _standby_pid_on(client, address) is not None, 4), (
        "the standby started while a task ran on its worker"
    )
    work.set()
    assert busy.result(timeout=60) is True
    assert poll_for(lambda: _standby_pid_on(client, address) is not None, 30), (
        "the standby did not start once its worker was idle"
    )

    # A fit's own control tasks (checkpoint look-up and clean-up, ports) are not work: a fit
    # that follows a fit still finds its standby.
    client.run(standby.stop_standby)
    control = Event(f"dvml-test-control-{tag}", client=client)
    blocked = _block_on(client, address, control.name, f"clear_checkpoint-{tag}")
    try:
        assert poll_for(lambda: bool(client.processing(workers=[address])[address]), 30)
        client.run(standby.start_standby_when_idle, workers=[address], quiet=0.5)
        assert poll_for(lambda: _standby_pid_on(client, address) is not None, 30), (
            "a fit's control task kept the standby from starting"
        )
    finally:
        control.set()
        blocked.result(timeout=60)


def test_the_first_fit_finds_warm_trainers(local_cluster: Any, tmp_path: Any) -> None:
    import dask.config
    import numpy as np
    import pandas as pd
    import psutil
    from sklearn.datasets import load_digits

    import dvml
    from dvml import config
    from tests.helpers import cnn, poll_for

    d = load_digits()
    frame = pd.DataFrame(
        {
            "id": np.arange(600),
            "pixels": list(d.images[:600].reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target[:600],
        }
    )
    config.defaults()
    with dask.config.set({"dvml.cluster.state-dir": str(tmp_path / "state")}):
        cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
        client = cluster.client
        addresses = sorted(client.scheduler_info()["workers"])
        assert all(_standby_pid_on(client, a) is None for a in addresses)  # a fresh cluster

        # Preprocessing a training set warms its workers' trainers while the data packs.
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name="warm_digits",
            client=client,
        )  # fmt: skip
        assert poll_for(lambda: all(_standby_pid_on(client, a) for a in addresses), 30)
        warmed = {a: _standby_pid_on(client, a) for a in addresses}
        # Forked by one zygote: TensorFlow imported once for both workers.
        zygotes = {psutil.Process(pid).ppid() for pid in warmed.values()}
        assert len(zygotes) == 1

        registry = dvml.Registry(f"sqlite:///{tmp_path / 'registry.db'}")
        try:
            arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
            model = dvml.fit(
                "warm_digits", "warm_cnn", arch, COMPILE, "batch_size=64, epochs=1",
                progress=False, registry=registry, client=client,
            )  # fmt: skip
        finally:
            registry.close()
        startups = model.summary["trainer_startup"]
        assert sorted(startups) == ["worker-0", "worker-1"]
        for startup in startups.values():
            assert startup["standby"] is True  # the first fit paid no TensorFlow import
            assert "import_tensorflow" in startup["standby_imports"]
            assert "import_tensorflow" not in startup["seconds"]
            # ... imported at a lower priority than the job's (nice +10, at most 19)
            base = os.getpriority(os.PRIO_PROCESS, 0)
            assert startup["standby_imports"]["nice"] == min(19, base + 10)
            assert startup["exit_seconds"] >= 0.0  # the trainer's exit after its "done"
        # Each worker starts its next standby once idle: a new process, not the one used,
        # forked by the same zygote (no second import).
        assert poll_for(
            lambda: all(_standby_pid_on(client, a) not in (None, warmed[a]) for a in addresses),
            60,
        )
        assert {psutil.Process(_standby_pid_on(client, a)).ppid() for a in addresses} == zygotes
        dvml.datasets.drop("warm_digits", client=client)


COMPILE = (
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', metrics=['accuracy']"
)
