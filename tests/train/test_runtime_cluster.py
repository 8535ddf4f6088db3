"""The trainer runtime on a real cluster, for every kind of job: owner-only checkpoints, the
client lease, and the scheduler interface that model search needs (park, add, resume)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml
from tests.helpers import Background, cnn, pid_gone, poll_for, tls_environment, worker_trainers

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)'"
FIT = "batch_size=32, epochs=1"
# Seconds from a client's SIGKILL to its last trainer gone: the scheduler drops a disconnected
# client at once; a lease notices within one check (<= 2 s), then SIGTERM, SIGKILL after 1 s.
# README ("Safety"): about 3 s, at most 15 s on a loaded machine.
KILLED_CLIENT_BOUND = 15.0


def table(arch: int, n: int = 2) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "mst_key": k + 1,
                "model_id": arch,
                "compile_params": "loss='categorical_crossentropy', "
                f"optimizer='Adam(learning_rate={0.003 * (k + 1)})'",
                "fit_params": FIT,
            }
            for k in range(n)
        ]
    )


@pytest.fixture(scope="module")
def env(cluster2: Any) -> Iterator[dict[str, Any]]:
    """digits on cluster2; the state directory and registry in a 0755 directory like a home
    (pytest's tmp_path is 0700 and would hide what dvml creates)."""
    from sklearn.datasets import load_digits

    home = pathlib.Path(tempfile.mkdtemp(prefix="dvml-runtime-home-"))
    home.chmod(0o755)
    d = load_digits()
    frame = pd.DataFrame(
        {"pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")), "label": d.target}
    )
    client = cluster2.client
    settings = {"dvml.cluster.state-dir": str(home / "state")}
    with dask.config.set(settings):
        dvml.training_preprocessor(
            frame, y="label", x="pixels", normalizing_const=16.0, name="rt_digits",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{home / 'registry.db'}")
        arch = dvml.load_keras_model(cnn().to_json(), name="cnn", registry=registry)
        yield {"client": client, "registry": registry, "arch": arch, "home": home,
               "settings": settings, "address": cluster2.scheduler_address}  # fmt: skip
        registry.close()
        dvml.datasets.drop("rt_digits", client=client)
    shutil.rmtree(home, ignore_errors=True)


def _checkpoint_files(state: pathlib.Path, prefix: str) -> list[pathlib.Path]:
    return sorted((state / "checkpoints").glob(f"{prefix}*/*"))


def _assert_owner_only(state: pathlib.Path, files: list[pathlib.Path]) -> None:
    assert files, "no checkpoint was written"
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path}: {oct(path.stat().st_mode)}"
    for directory in {p.parent for p in files} | {state / "checkpoints"}:
        mode = stat.S_IMODE(directory.stat().st_mode)
        assert mode == 0o700, f"{directory}: {oct(mode)}"


@pytest.mark.parametrize("kind", ["fit", "fit_multiple"])
def test_checkpoints_are_owner_only(env: dict[str, Any], kind: str) -> None:
    """Both schedulers write through the runtime's one checkpoint store: 0600 in 0700."""
    state = env["home"] / "state"
    name = f"rt_perm_{kind}"
    common = {"registry": env["registry"], "client": env["client"], "progress": False}
    with dask.config.set(env["settings"]):
        if kind == "fit":
            job = Background(lambda seen: dvml.fit(
                "rt_digits", name, env["arch"], COMPILE, FIT, num_iterations=4,
                sync="iteration", on_iteration=seen, **common))  # fmt: skip
        else:
            job = Background(lambda seen: dvml.fit_multiple(
                "rt_digits", name, table(env["arch"]), num_iterations=4, **common))  # fmt: skip
        # checkpoints exist while the job runs (they are removed once its models are saved)
        assert poll_for(lambda: any(p.suffix == ".npz" for p in _checkpoint_files(state, name))
                        or job.done(), 300)  # fmt: skip
        files = [p for p in _checkpoint_files(state, name) if not p.name.endswith(".tmp")]
        _assert_owner_only(state, files)
        job.result()


CLIENT_SCRIPT = """
import sys, dask, dvml, pandas as pd
address, state_dir, registry, arch, kind = sys.argv[1:6]
settings = {"dvml.cluster.state-dir": state_dir, "dvml.train.client-timeout": 20}
with dask.config.set(settings):
    cluster = dvml.connect(address)
    reg = dvml.Registry(registry)
    if kind == "fit":
        dvml.fit("rt_digits", "rt_orphan_fit", int(arch), %(compile)r, %(fit)r,
                 num_iterations=20, sync="iteration", progress=False, registry=reg,
                 client=cluster.client,
                 on_iteration=lambda r: print("ITERATION", r["iteration"], flush=True))
    else:
        rows = [{"mst_key": k, "model_id": int(arch), "fit_params": %(fit)r,
                 "compile_params": "loss='categorical_crossentropy', optimizer='Adam("
                                   f"learning_rate={0.001 * k})'"} for k in (1, 2)]
        dvml.fit_multiple("rt_digits", "rt_orphan_mop", pd.DataFrame(rows), num_iterations=20,
                          progress=True, registry=reg, client=cluster.client)
"""


@pytest.mark.parametrize("kind", ["fit", "fit_multiple"])
def test_a_killed_clients_trainers_stop_within_the_bound(
    env: dict[str, Any], cluster2: Any, kind: str
) -> None:
    """SIGKILL the client mid-job: every trainer of its job is gone within the bound, for
    both schedulers (the runtime's one client lease)."""
    script = CLIENT_SCRIPT % {"compile": COMPILE, "fit": FIT}
    output = "rt_orphan_fit" if kind == "fit" else "rt_orphan_mop"
    argv = [sys.executable, "-c", script, env["address"], env["settings"]["dvml.cluster.state-dir"],
            f"sqlite:///{env['home'] / 'registry.db'}", str(env["arch"]), kind]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **tls_environment(cluster2)},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        # fit: its first iteration is done; fit_multiple: its first iteration's hops are done
        marker = "ITERATION 1" if kind == "fit" else "iteration 1/"
        assert poll_for(lambda: any(marker in x for x in lines) or proc.poll() is not None, 300)
        assert proc.poll() is None, "".join(lines[-30:])
        field = {"model": output} if kind == "fit" else {"model_output": output}
        assert poll_for(lambda: len(worker_trainers(cluster2, **field)) == 2, 60), lines[-30:]
        trainers = worker_trainers(cluster2, **field)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert poll_for(lambda: all(pid_gone(p) for p in trainers), KILLED_CLIENT_BOUND + 30)
    took = time.monotonic() - killed_at
    assert took < KILLED_CLIENT_BOUND, f"the trainers outlived their client by {took:.1f}s"


def test_a_scheduler_parks_adds_and_resumes_models_without_restarting_trainers(
    env: dict[str, Any], cluster2: Any
) -> None:
    """A small scheduler on the runtime (what model search does): model 1 trains, is parked;
    model 2 joins the running job and trains; model 1 resumes from exactly its parked
    weights (checked by value), on the same trainer processes."""
    from dvml.configs import parse_compile_params, parse_fit_params
    from dvml.exceptions import ArgumentError
    from dvml.registry.weights import weights_from_bytes
    from dvml.train.runtime.hopper import ModelHopper
    from dvml.train.runtime.model_state import state_bytes, weights_digest
    from dvml.train.runtime.plan import training_workers
    from dvml.train.runtime.sessions import weights_of

    client = env["client"]
    ds = dvml.datasets.describe("rt_digits", client=client)
    workers = training_workers(client, ds, None, use_gpus=False)
    arch = env["registry"].get_architecture(env["arch"])
    model = {
        "model_json": arch["model_json"],
        "compile_params": parse_compile_params(COMPILE),
        "fit_params": parse_fit_params(FIT),
    }
    w0, w1 = workers
    with dask.config.set(env["settings"]), ModelHopper(
        client, name="rt_search", training="rt_digits", validation=None, workers=workers,
        seed=7, job_key="rt-search", checkpoint_dir=str(env["home"] / "state" / "rt-search"),
        custom_sources={}, use_gpus=False, timeout=600,
    ) as hopper:  # fmt: skip
        hopper.add(1, model, state_bytes([]), w0)
        _, first = hopper.train(1, w0, iteration=1)
        parked = hopper.park(1)
        parked_digest = hopper.digest(1)
        hopper.wait([first, parked_digest])
        assert hopper.parked == {1}

        hopper.add(2, model, state_bytes([]), w1)  # joins the running job
        with pytest.raises(ArgumentError, match="already in job"):
            hopper.add(2, model, state_bytes([]), w1)
        _, second = hopper.train(2, w1, iteration=1)
        _, third = hopper.train(2, w0, iteration=2)
        hopper.wait([second, third])
        assert hopper.parked == {1}

        _, resumed = hopper.train(1, w1, iteration=2)  # a parked model resumes when trained
        hopper.wait([resumed])
        assert hopper.parked == set()
        records = client.gather([first, second, third, resumed])
        # By value: the weights model 1 resumed from are the weights it was parked with.
        parked_weights = weights_from_bytes(client.submit(weights_of, parked, pure=False).result())
        assert weights_digest(parked_weights) == parked_digest.result()
        assert records[3]["loaded_sha256"] == parked_digest.result()
        assert records[3]["loaded_sha256"] != records[2]["loaded_sha256"]  # not model 2's
        # and it trained on: its new weights differ from those it resumed from
        after = hopper.weights([1])[1]
        assert weights_digest(weights_from_bytes(after)) != parked_digest.result()
        assert not np.isnan(records[3]["fit_loss"])
        # the same trainer process per worker served every step: nothing restarted
        pids = {r["worker"]: set() for r in records}
        for r in records:
            pids[r["worker"]].add(r["pid"])
        assert all(len(p) == 1 for p in pids.values()), pids
        assert {r["worker"] for r in records} == {w0.name, w1.name}
    # stopped with the hopper: no serving trainer of the job is left
    assert poll_for(lambda: not worker_trainers(cluster2, model_output="rt_search"), 30)


def test_a_model_whose_evaluation_died_with_another_trainer_trains_and_checkpoints_again(
    env: dict[str, Any], cluster2: Any
) -> None:
    """Model 1 trains on worker-0 and is evaluated on both workers; worker-1's trainer is
    killed first, so the evaluation there fails, and the iteration's checkpoint with it. The
    scheduler rewinds the model to its state before the job (what ASHA does when another
    worker's trainer died under an evaluation): the job goes again on worker-0 and its new
    checkpoint is written (it waits for no checkpoint of the failed job)."""
    from dvml.configs import parse_compile_params, parse_fit_params
    from dvml.train.runtime.hopper import ModelHopper
    from dvml.train.runtime.model_state import state_bytes
    from dvml.train.runtime.plan import training_workers
    from dvml.train.runtime.sessions import list_checkpoints

    client = env["client"]
    ds = dvml.datasets.describe("rt_digits", client=client)
    w0, w1 = training_workers(client, ds, None, use_gpus=False)
    arch = env["registry"].get_architecture(env["arch"])
    model = {
        "model_json": arch["model_json"],
        "compile_params": parse_compile_params(COMPILE),
        "fit_params": parse_fit_params(FIT),
    }
    directory = str(env["home"] / "state" / "rt-rewind")
    with dask.config.set(env["settings"]), ModelHopper(
        client, name="rt_rewind", training="rt_digits", validation=None, workers=[w0, w1],
        seed=7, job_key="rt-rewind", checkpoint_dir=directory, custom_sources={},
        use_gpus=False, timeout=600,
    ) as hopper:  # fmt: skip
        hopper.add(1, model, state_bytes([]), w0)
        hopper.add(2, model, state_bytes([]), w1)
        _, started = hopper.train(2, w1, iteration=1)  # worker-1's trainer is up
        hopper.wait([started])
        victims = worker_trainers(cluster2, w1.name, model_output="rt_rewind")
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        assert poll_for(lambda: pid_gone(victims[0]), 30)

        before = hopper.states[1]
        _, record = hopper.train(1, w0, iteration=2)
        evals = hopper.evaluate(1, [w0, w1])
        failed = hopper.checkpoint(1, 1, [record], evals, w0)
        outcome = hopper.watch([failed])
        assert outcome.failed is not None and not outcome.gone, outcome
        assert "SIGKILL" in str(evals[1].exception()), evals[1].exception()

        hopper.rewind(1, before)
        _, again = hopper.train(1, w0, iteration=3)
        written = hopper.checkpoint(1, 1, [again], hopper.evaluate(1, [w0]), w0)
        # watched alone: hopper.wait would raise the job's earlier failure
        outcome = hopper.watch([written])
        assert outcome.failed is None and not outcome.gone, written.exception()
        listing = client.submit(list_checkpoints, directory, "rt-rewind", workers=[w0.address],
                                allow_other_workers=False, pure=False).result()  # fmt: skip
        assert [(m["mst_key"], m["iteration"]) for m in listing] == [(1, 1)], listing
        assert listing[0]["records"][0]["loaded_sha256"] == client.gather(again)["loaded_sha256"]
