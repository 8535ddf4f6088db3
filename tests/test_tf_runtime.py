"""The one TensorFlow edge: nothing else in dvml starts TensorFlow, and the pure thread budget."""

from __future__ import annotations

import ast
import os
import pathlib
import threading

import pytest

from dvml import tf_runtime
from dvml.tf_runtime import ThreadBudget, budget_from_env, thread_budget, trainer_environment

DVML = pathlib.Path(tf_runtime.__file__).parent
EDGE = pathlib.Path(tf_runtime.__file__)


def _tensorflow_touches(path: pathlib.Path) -> list[str]:
    """Imports of tensorflow / tf_keras (at any depth, lazy ones too) and TF_USE_LEGACY_KERAS."""
    text = path.read_text()
    where = path.relative_to(DVML.parent) if path.is_relative_to(DVML.parent) else path.name
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("tensorflow", "tf_keras", "keras"):
                found.append(f"{where}:{node.lineno}: import {name}")
    # The variable as code uses it (a key of os.environ); prose that names it is fine.
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and node.value == "TF_USE_LEGACY_KERAS":
            found.append(f"{where}:{node.lineno}: TF_USE_LEGACY_KERAS")
    return found


def test_only_the_edge_module_touches_tensorflow_start_up() -> None:
    offenders = [
        hit
        for path in sorted(DVML.rglob("*.py"))
        if path != EDGE
        for hit in _tensorflow_touches(path)
    ]
    assert not offenders, (
        "TensorFlow start-up belongs in dvml/tf_runtime.py only; use tf_runtime.tensorflow() "
        "or tf_runtime.keras() instead:\n" + "\n".join(offenders)
    )


def test_the_grep_finds_a_lazy_import(tmp_path: pathlib.Path) -> None:
    # The check must see imports inside functions, or it proves nothing.
    sample = tmp_path / "probe.py"
    sample.write_text(
        "def f():\n    import tf_keras as k\n    from tensorflow import math\n"
        "os.environ['TF_USE_LEGACY_KERAS'] = '1'\n"
    )
    hits = _tensorflow_touches(sample)
    assert len(hits) == 3
    assert [h.split(": ", 1)[1] for h in hits[:2]] == ["import tf_keras", "import tensorflow"]


@pytest.mark.parametrize(
    ("cores", "processes", "intra", "inter", "expected"),
    [
        (2, 2, None, None, ThreadBudget(1, 1, 1)),  # this machine: two trainers, two cores
        (2, 1, None, None, ThreadBudget(2, 2, 2)),
        (16, 4, None, None, ThreadBudget(4, 4, 4)),
        (16, 3, None, None, ThreadBudget(5, 5, 5)),  # the remainder stays unused
        (2, 4, None, None, ThreadBudget(1, 1, 1)),  # more trainers than cores: at least 1
        (1, 1, None, None, ThreadBudget(1, 1, 1)),
        (16, 4, 8, None, ThreadBudget(8, 4, 8)),  # the user's intra wins, OpenMP follows it
        (16, 4, None, 2, ThreadBudget(4, 2, 4)),
        (2, 2, 3, 3, ThreadBudget(3, 3, 3)),  # the user may oversubscribe on purpose
    ],
)
def test_thread_budget(
    cores: int, processes: int, intra: int | None, inter: int | None, expected: ThreadBudget
) -> None:
    assert thread_budget(cores, processes, intra, inter) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cores": 0, "processes_on_host": 1}, "cores must be a positive int"),
        ({"cores": 2, "processes_on_host": 0}, "processes_on_host must be a positive int"),
        ({"cores": 2, "processes_on_host": True}, "processes_on_host must be a positive int"),
        ({"cores": 2, "processes_on_host": 1, "intra": 0}, "intra-op-threads must be"),
        ({"cores": 2, "processes_on_host": 1, "inter": "2"}, "Received: inter-op-threads='2'"),
    ],
)
def test_thread_budget_rejects(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        thread_budget(**kwargs)  # type: ignore[arg-type]


def test_budget_round_trips_through_the_environment() -> None:
    budget = ThreadBudget(3, 2, 3)
    env = trainer_environment({"PATH": "/bin"}, budget, use_gpus=False)
    assert env["TF_NUM_INTRAOP_THREADS"] == "3" and env["OMP_NUM_THREADS"] == "3"
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert budget_from_env(env) == budget
    assert budget_from_env({}) is None


def test_gpu_trainer_keeps_its_visible_gpus() -> None:
    env = trainer_environment({"CUDA_VISIBLE_DEVICES": "1"}, None, use_gpus=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "TF_NUM_INTRAOP_THREADS" not in env


def test_configured_threads_reach_the_local_budget() -> None:
    import dask.config

    with dask.config.set({"dvml.train.intra-op-threads": 7, "dvml.train.inter-op-threads": None}):
        budget = tf_runtime.local_budget(processes_on_host=1)
    assert budget.intra == 7 and budget.omp == 7
    assert budget.inter == tf_runtime.host_cores()


def test_model_cache_builds_once_under_concurrency() -> None:
    cache = tf_runtime.ModelCache(2)
    builds: list[str] = []
    gate = threading.Barrier(4)

    def build(key: str) -> str:
        builds.append(key)
        return key.upper()

    def task() -> None:
        gate.wait()
        cache.get("a", lambda: build("a"))

    threads = [threading.Thread(target=task) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["a"]
    cache.get("b", lambda: build("b"))
    cache.get("c", lambda: build("c"))  # evicts "a", the least recently used
    assert cache.get("a", lambda: build("a")) == "A"
    assert builds == ["a", "b", "c", "a"] and len(cache) == 2


def test_startup_chatter_is_recognised() -> None:
    """#13 item 9: the lines TensorFlow's C++ side prints at start-up, whatever the log level."""
    from dvml.tf_runtime import is_startup_chatter

    chatter = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795441220.672660    9195 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1795441220.679176    9195 cudart_stub.cc:31] Could not find cuda drivers",
        "E0000 00:00:1795441230.259678    9195 cuda_platform.cc:52] failed call to cuInit: "
        "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
        "W1123 14:02:03.123456  123 tensorflow/core/framework/local_rendezvous.cc:404] x",
    ]
    assert all(is_startup_chatter(line) for line in chatter)
    others = ["dvml: error: something", "Traceback (most recent call last):", "I0000 is fine"]
    assert not any(is_startup_chatter(line) for line in others)


def test_quiet_startup_hides_only_chatter() -> None:
    """fd 2 of a fresh process that starts TensorFlow through the edge: nothing but what
    Python itself wrote (checked in a subprocess: fd 2 is process-wide)."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from dvml import tf_runtime\n"
        "with tf_runtime.quiet_startup():\n"
        "    os.write(2, b'I0000 00:00:1.5  7 port.cc:1] chatter\\n')\n"
        "    os.write(2, b'kept line\\n')\n"
        "tf_runtime.tensorflow()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["kept line"], out.stderr
