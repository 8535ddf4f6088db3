"""The one TensorFlow edge: nothing else in dvml starts TensorFlow, and the pure thread budget."""

from __future__ import annotations

import ast
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
