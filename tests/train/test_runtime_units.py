"""Unit tests of the trainer runtime's small modules, each on its own (no cluster): the seed
function, the start timings, the exit-with-parent watch, the supervisor's view of a trainer
process (a real child process speaking the protocol), the worker's checkpoint calls and the
``model.fit`` keywords. What they do inside a whole job is tested by the fit, run and
fit_multiple cluster tests."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from dvml.cluster.zygote import PARENT_ENV
from dvml.exceptions import TrainerFailedError, TrainerStoppedError
from dvml.train.runtime import launch, local_model, protocol, seeds, startup, supervisor
from dvml.train.runtime.checkpoints import CheckpointStore
from dvml.train.runtime.orphan import EXIT_ORPHANED
from tests.helpers import pid_gone, poll_for

# -- seeds ------------------------------------------------------------------------------------


def test_every_iteration_model_and_worker_has_its_own_reproducible_seed() -> None:
    keys = [(i, m, w) for i in range(3) for m in range(3) for w in range(3)]
    drawn = [seeds.shuffle_seed(7, iteration=i, model=m, worker=w) for i, m, w in keys]
    assert len(set(drawn)) == len(keys)  # no two shuffles alike
    assert drawn == [seeds.shuffle_seed(7, iteration=i, model=m, worker=w) for i, m, w in keys]
    assert seeds.shuffle_seed(8) != seeds.shuffle_seed(7)
    assert all(0 <= s < 2**32 for s in drawn)  # a valid numpy / tf.data seed


def test_the_data_position_of_an_iteration_is_its_first_epoch() -> None:
    assert seeds.data_position(1, 3) == {"iteration": 1, "epoch": 0}
    assert seeds.data_position(4, 3) == {"iteration": 4, "epoch": 9}
    with pytest.raises(ValueError, match="iteration=0"):
        seeds.data_position(0, 1)


def test_a_job_key_holds_each_datasets_id_and_version() -> None:
    from types import SimpleNamespace

    from dvml.train.runtime.plan import dataset_key, job_key

    v1 = SimpleNamespace(summary={"dataset_id": "abc"}, version=1)
    v2 = SimpleNamespace(summary={"dataset_id": "abc"}, version=2)  # the same, appended to
    assert dataset_key(v1) == ["abc", 1] and dataset_key(None) is None
    assert job_key("fit", dataset_key(v1)) != job_key("fit", dataset_key(v2))


# -- startup ----------------------------------------------------------------------------------


def test_startup_times_each_step_from_the_launch_and_emits_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import time

    launched = time.time() - 2.0  # the launcher started the process two seconds ago
    timings = startup.Startup(launched, {"tensorflow": 3.5})
    timings.mark("imports")
    timings.mark("dataset")
    timings.emit()
    line = protocol.parse(capsys.readouterr().out.strip())
    assert isinstance(line, protocol.Startup)
    assert list(line.seconds) == ["imports", "dataset"]
    assert line.seconds["imports"] >= 2.0 and line.seconds["dataset"] < 1.0
    assert line.total == pytest.approx(sum(line.seconds.values()), abs=1e-3)
    assert line.standby and line.standby_imports == {"tensorflow": 3.5}


# -- orphan -----------------------------------------------------------------------------------


def test_a_trainer_exits_when_the_worker_that_asked_for_it_dies() -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = "from dvml.train.runtime.orphan import exit_with_parent\n" \
        "import time\nexit_with_parent(interval=0.1)\ntime.sleep(60)\n"  # fmt: skip
    env = {**os.environ, PARENT_ENV: str(worker.pid)}  # as a zygote-forked trainer has it
    trainer = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        worker.kill()
        worker.wait(10)
        assert trainer.wait(30) == EXIT_ORPHANED
        assert trainer.stderr is not None
        assert f"its worker (pid {worker.pid}) died" in trainer.stderr.read().decode()
    finally:
        for proc in (worker, trainer):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


# -- supervisor -------------------------------------------------------------------------------


def _trainer(tmp_path: pathlib.Path, body: str, name: str = "trainer") -> supervisor.TrainerProcess:
    """A child process that speaks the protocol as a trainer does (``emit`` lines on stdout)."""
    code = "from dvml.train.runtime import protocol\nimport sys, time\n" + textwrap.dedent(body)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    workdir = tmp_path / name
    workdir.mkdir()
    return supervisor.TrainerProcess(proc, "trainer on worker w0", str(workdir))


def test_the_supervisor_reads_a_trainers_lines_then_names_how_it_ended(
    tmp_path: pathlib.Path,
) -> None:
    trainer = _trainer(tmp_path, """
        print("a line that is not the protocol", flush=True)
        protocol.emit(protocol.Report(step=1, metrics={"loss": 0.5}, elapsed=0.1))
        protocol.emit(protocol.Failed(type="ValueError", message="bad rows", fatal=True))
        sys.exit(3)
    """)  # fmt: skip
    try:
        line = trainer.next(timeout=30)
        assert isinstance(line, protocol.Report) and line.metrics == {"loss": 0.5}
        assert isinstance(trainer.next(timeout=30), protocol.Failed)
        with pytest.raises(TrainerFailedError, match="trainer on worker w0") as info:
            trainer.next(timeout=30)
        assert "bad rows" in str(info.value)
        assert "a line that is not the protocol" in trainer.tail
        with pytest.raises(TrainerFailedError):  # and again for every later call
            trainer.next(timeout=1)
    finally:
        trainer.close()
    assert not pathlib.Path(trainer.workdir).exists()


def test_a_silent_trainer_is_stopped_at_its_timeout_or_when_told(tmp_path: pathlib.Path) -> None:
    trainer = _trainer(tmp_path, "time.sleep(60)\n")
    try:
        with pytest.raises(TrainerStoppedError, match="past the timeout of 1s"):
            trainer.next(timeout=1)
        assert poll_for(lambda: trainer.proc.poll() is not None, 15)
    finally:
        trainer.close()
    other = _trainer(tmp_path, "time.sleep(60)\n", "other")
    try:
        with pytest.raises(TrainerStoppedError, match="its client left"):
            other.next(timeout=60, stop=lambda: "stopped because its client left")
        assert poll_for(lambda: pid_gone(other.proc.pid), 15)
    finally:
        other.close()


def test_a_command_reaches_the_trainer_on_its_stdin(tmp_path: pathlib.Path) -> None:
    trainer = _trainer(tmp_path, """
        command = protocol.parse(sys.stdin.readline().strip())
        protocol.emit(protocol.Report(step=command.step, metrics={}, elapsed=0.0))
    """)  # fmt: skip
    try:
        trainer.send(protocol.Report(step=42, metrics={}, elapsed=0.0))
        line = trainer.next(timeout=30)
        assert isinstance(line, protocol.Report) and line.step == 42
    finally:
        trainer.close()


# -- launch: the worker's checkpoint calls ----------------------------------------------------


def test_a_workers_checkpoint_is_read_back_whole_then_cleared(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "ckpt")
    assert launch.checkpoint_state(directory, "w0") is None
    meta: dict[str, Any] = {"iteration": 3, "job_key": "k1", "history": [{"loss": 0.5}]}
    CheckpointStore(directory).save("w0", b"weights-bytes", meta)
    found = launch.checkpoint_state(directory, "w0")
    assert found is not None and found["weights"] == b"weights-bytes"
    assert {k: found[k] for k in meta} == json.loads(json.dumps(meta))
    assert launch.checkpoint_state(directory, "w1") is None  # another worker's is its own
    launch.clear_checkpoint(directory)
    assert launch.checkpoint_state(directory, "w0") is None


# -- local_model ------------------------------------------------------------------------------


def test_fit_keywords_leave_out_what_dvml_feeds_itself() -> None:
    parsed = {"batch_size": 32, "epochs": 3, "shuffle": True, "steps_per_epoch": 9,
              "callbacks": [{"class_name": "TensorBoard"}], "class_weight": {0: 1.0}}  # fmt: skip
    assert local_model.fit_kwargs(parsed) == {"epochs": 3, "class_weight": {0: 1.0}, "verbose": 0}
    assert local_model.fit_kwargs({}) == {"epochs": 1, "verbose": 0}


# -- exits and watcher: a trainer's end and a departed worker, in words -----------------------


def test_an_exit_is_described_by_its_signal_error_or_code() -> None:
    from dvml.train.runtime.exits import KILLED_BY, describe_exit, meaningful_lines

    lines = ["", "I0000 00:00:1.5 12 port.cc:153] oneDNN custom operations are on", "a", "b"]
    assert meaningful_lines(lines) == ["a", "b"]
    assert meaningful_lines([str(i) for i in range(20)], keep=3) == ["17", "18", "19"]
    assert describe_exit(-9, {}, ["a"]).startswith(f"{KILLED_BY}KILL (signal 9)")
    # a signal without a name of its own: named by its number (was "SIGsignal 35")
    rt = int(signal.SIGRTMIN) + 1
    assert describe_exit(-rt, {}, []).startswith(f"{KILLED_BY}RTMIN+1 (signal {rt})")
    assert describe_exit(-200, {}, []).startswith(f"{KILLED_BY}? (signal 200)")
    # an error message wins over the last lines; a signal wins over both
    assert describe_exit(2, {"message": "boom"}, ["a"]) == "exit code 2, error: boom"
    assert describe_exit(-15, {"message": "boom"}, ["a"]).startswith(f"{KILLED_BY}TERM")
    assert describe_exit(0, {}, ["done?"]) == (
        "it exited (code 0) without reporting a result. Its last lines:\ndone?"
    )
    assert describe_exit(3, {}, []) == (
        "exit code 3. Its last lines:\n(it printed nothing but TensorFlow's start-up banner)"
    )


def test_a_peer_failure_is_told_from_a_trainers_own_and_a_departure_named() -> None:
    from dvml.cluster.workers import WorkerInfo
    from dvml.train.runtime.watcher import describe_departure, looks_like_peer_failure

    assert looks_like_peer_failure("UnavailableError: Socket closed")
    assert looks_like_peer_failure("CollectiveOpV2 was aborted: DeadlineExceeded")
    assert not looks_like_peer_failure("ValueError: Input 0 of layer dense is incompatible")
    gone = [WorkerInfo("tcp://10.0.0.2:1", "worker-1", "10.0.0.2", None, None, (), 1),
            WorkerInfo("tcp://10.0.0.3:1", "worker-2", "10.0.0.3", None, None, (), 2)]  # fmt: skip
    assert describe_departure(gone).startswith(
        "worker worker-1 on host 10.0.0.2, worker worker-2 on host 10.0.0.3 left the cluster "
        "during training"
    )
