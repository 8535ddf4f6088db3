"""The one TensorFlow edge of dvml: start-up, thread budget, devices and models from specs.

Every other module reaches TensorFlow and tf-keras through this one (a test greps ``dvml/``
for imports of ``tensorflow`` or ``tf_keras`` and for ``TF_USE_LEGACY_KERAS`` elsewhere), so
the process-wide choices TensorFlow fixes at start-up are made in one place:

- ``TF_USE_LEGACY_KERAS=1`` before TensorFlow loads, so ``tf.keras`` is tf-keras (Keras 3
  fails under MultiWorkerMirroredStrategy, see COMPAT.md);
- the C++ log level (``TF_CPP_MIN_LOG_LEVEL``, default 2: warnings and errors only) and its
  start-up chatter: absl writes "All log messages before absl::InitializeLog()", oneDNN and
  ``cuInit ... UNKNOWN ERROR (303)`` lines to fd 2 whatever the log level says, so
  :func:`quiet_startup` sends fd 2 to a file while TensorFlow loads and starts, and passes on
  only what is not chatter (everything, when loading failed); ``dvml.tf.show-startup-log``
  turns this off;
- the thread budget: intra-op, inter-op and OpenMP threads from the cores of the host divided
  by the TensorFlow processes that share it (:func:`thread_budget`, pure), unless the user set
  ``dvml.train.intra-op-threads`` / ``inter-op-threads``;
- GPU visibility (see :func:`start`);
- models built from a spec (JSON, weights, custom objects, compile arguments) and a
  per-process cache of them with a lock (:class:`ModelCache`). Registered custom functions
  are compiled against this module's TensorFlow by
  :func:`dvml.registry.custom.custom_objects_from_sources` (the registry sits above this
  module in the layers).

Importing this module imports neither TensorFlow nor tf-keras: :func:`tensorflow` and
:func:`keras` do, on first use.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dvml.exceptions import ArgumentError

__all__ = [
    "ModelCache",
    "ThreadBudget",
    "budget_from_env",
    "build_model",
    "device_for",
    "host_cores",
    "is_startup_chatter",
    "keras",
    "local_budget",
    "preimport",
    "process_environment",
    "quiet_startup",
    "show_startup_log",
    "start",
    "tensorflow",
    "thread_budget",
    "trainer_environment",
]

WORKERS_ON_HOST_ENV = "DVML_WORKERS_ON_HOST"
"""Set by dvml's cluster launchers: how many Dask workers share this worker's host."""

STDERR_CAPTURED_ENV = "DVML_STDERR_CAPTURED"
"""Set by the trainer launcher: this process's fd 2 goes to a log file that it reads."""

_THREAD_ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


# --------------------------------------------------------------------------- thread budget


@dataclass(frozen=True)
class ThreadBudget:
    """Threads of one TensorFlow process: intra-op pool, inter-op pool, OpenMP."""

    intra: int
    inter: int
    omp: int

    def environment(self) -> dict[str, str]:
        """The environment variables that carry this budget into a new process."""
        return dict(zip(_THREAD_ENV, map(str, (self.intra, self.inter, self.omp)), strict=True))


def _threads(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(
            f"{name} must be a positive int, or null for automatic. Received: {name}={value!r}. "
            f"Set dvml.train.{name} to a thread count or null."
        )
    return value


def thread_budget(
    cores: int, processes_on_host: int, intra: int | None = None, inter: int | None = None
) -> ThreadBudget:
    """Threads for one TensorFlow process among ``processes_on_host`` on ``cores`` cores.

    TensorFlow sizes both of its pools for every core of the host, so two trainers on two
    cores run four pools and spend their time switching (47 ms per step here, 23 ms with one
    thread each). Each process gets its share of the cores (at least 1) for both pools and
    OpenMP; ``intra`` / ``inter`` given by the user win (OpenMP follows ``intra``).

    Parameters
    ----------
    cores : int
        Cores this host lets the process use (``os.sched_getaffinity``).
    processes_on_host : int
        TensorFlow processes that run at once on the host (trainers of one fit, or workers).
    intra, inter : int or None
        The user's thread counts (``dvml.train.intra-op-threads`` / ``inter-op-threads``);
        None means automatic.
    """
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ArgumentError(f"cores must be a positive int. Received: cores={cores!r}.")
    if (
        isinstance(processes_on_host, bool)
        or not isinstance(processes_on_host, int)
        or processes_on_host < 1
    ):
        raise ArgumentError(
            "processes_on_host must be a positive int. Received: "
            f"processes_on_host={processes_on_host!r}."
        )
    share = max(1, cores // processes_on_host)
    intra = _threads("intra-op-threads", intra) or share
    inter = _threads("inter-op-threads", inter) or share
    return ThreadBudget(intra=intra, inter=inter, omp=intra)


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and taskset set)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _configured_threads() -> tuple[int | None, int | None]:
    # dask.config directly, not dvml.config: this module sits below it in the layers. Both
    # keys default to null (automatic), which a missing key means too.
    import dask.config

    return (
        dask.config.get("dvml.train.intra-op-threads", None),
        dask.config.get("dvml.train.inter-op-threads", None),
    )


def local_budget(processes_on_host: int | None = None) -> ThreadBudget:
    """The budget of TensorFlow run inside this process (a Dask worker's inference task).

    ``processes_on_host`` defaults to the Dask workers on this host (``DVML_WORKERS_ON_HOST``,
    set by dvml's launchers; 1 when unknown).
    """
    if processes_on_host is None:
        try:
            processes_on_host = max(1, int(os.environ.get(WORKERS_ON_HOST_ENV, "1")))
        except ValueError:
            processes_on_host = 1
    intra, inter = _configured_threads()
    return thread_budget(host_cores(), processes_on_host, intra, inter)


def budget_from_env(env: Mapping[str, str] | None = None) -> ThreadBudget | None:
    """The budget a launcher put into this process's environment, or None."""
    env = os.environ if env is None else env
    try:
        intra = int(env["TF_NUM_INTRAOP_THREADS"])
        inter = int(env["TF_NUM_INTEROP_THREADS"])
    except (KeyError, ValueError):
        return None
    omp = env.get("OMP_NUM_THREADS", "")
    return ThreadBudget(intra=intra, inter=inter, omp=int(omp) if omp.isdigit() else intra)


# --------------------------------------------------------------------------- environment


def process_environment(log_level: str = "2") -> dict[str, str]:
    """Variables every process that may load TensorFlow needs before it does (Dask workers).

    gRPC (the trainers' collectives) logs errors only, unless the user's environment says
    otherwise.
    """
    env = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": log_level}
    env["GRPC_VERBOSITY"] = os.environ.get("GRPC_VERBOSITY", "ERROR")
    return env


def trainer_environment(
    base: Mapping[str, str], budget: ThreadBudget | None, use_gpus: bool
) -> dict[str, str]:
    """The environment of a trainer subprocess: tf-keras, log level, threads, GPU visibility.

    A trainer without ``use_gpus`` gets ``CUDA_VISIBLE_DEVICES=-1``: it is a fresh process, so
    hiding every GPU cannot leak into later work, and TensorFlow then takes no GPU memory.
    """
    env = dict(base)
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    if budget is not None:
        env.update(budget.environment())
    if not use_gpus:
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    return env


# --------------------------------------------------------------------------- start-up chatter

# What TensorFlow's C++ side writes to fd 2 while it loads and starts, before (or regardless
# of) TF_CPP_MIN_LOG_LEVEL: absl/glog lines ("I0000 00:00:1795441220.672660 9195 port.cc:153]
# oneDNN ..."), absl's banner, and the CPU feature guard's second line.
_CHATTER = re.compile(
    r"^(?:[IWEF]\d{4} \d+:\d+:\d+\.\d+\s+\d+ [\w.\-/]+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|WARNING: Logging before InitGoogleLogging\(\)"
    r"|To enable the following instructions: .*rebuild TensorFlow)"
)


def is_startup_chatter(line: str) -> bool:
    """Whether ``line`` is TensorFlow's C++ start-up logging (not a Python message)."""
    return _CHATTER.match(line) is not None


def show_startup_log() -> bool:
    """``dvml.tf.show-startup-log`` (default False): let TensorFlow's start-up output through."""
    # dask.config directly, not dvml.config: this module sits below it in the layers.
    import dask.config

    return bool(dask.config.get("dvml.tf.show-startup-log", False))


@contextlib.contextmanager
def quiet_startup() -> Iterator[None]:
    """Send fd 2 to a file for the block; then pass on every line that is not chatter.

    TensorFlow's C++ code writes to the file descriptor, not to ``sys.stderr``, so only a
    redirection of fd 2 catches it. What other threads write meanwhile is passed on when the
    block ends; if the block raises, everything is (TensorFlow's output then explains why).
    Does nothing when ``dvml.tf.show-startup-log`` is true, or in a process whose fd 2 is a
    file already (``DVML_STDERR_CAPTURED=1``: a trainer, whose error quotes that file).
    """
    if show_startup_log() or os.environ.get(STDERR_CAPTURED_ENV) == "1":
        yield
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    failed = True
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
            failed = False
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            lines = log.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(x for x in lines if failed or not is_startup_chatter(x))
            if kept:
                os.write(2, kept.encode())


# --------------------------------------------------------------------------- start-up

_LOCK = threading.RLock()
_STARTED: dict[str, Any] = {}


def preimport() -> dict[str, float]:
    """Import TensorFlow and tf-keras WITHOUT initialising TensorFlow's runtime.

    A standby trainer calls this while it waits for a job: the thread pools, the visible
    devices and ``TF_CONFIG`` are still open until :func:`start`. Returns the seconds each
    import took (``import_tensorflow``, ``import_tf_keras``).
    """
    import importlib
    import time

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with quiet_startup():
        t0 = time.perf_counter()
        importlib.import_module("tensorflow")
        t1 = time.perf_counter()
        importlib.import_module("tf_keras")
        t2 = time.perf_counter()
    return {"import_tensorflow": t1 - t0, "import_tf_keras": t2 - t1}


def start(budget: ThreadBudget | None = None) -> Any:
    """Start TensorFlow in this process once, and return the ``tensorflow`` module.

    The first call fixes the process-wide settings: the thread budget (``budget``, else the
    one in the environment a launcher set, else :func:`local_budget`) and GPU visibility. Later
    calls return at once; a budget given then is ignored (TensorFlow cannot resize its pools).

    GPU visibility: the GPUs this process may see are the ones its launcher left visible
    (``CUDA_VISIBLE_DEVICES`` of a worker that owns GPUs; ``-1`` for a trainer without
    ``use_gpus``). TensorFlow fixes visible devices when its runtime initialises, so they are
    NOT chosen per task: every task of a worker process shares one runtime. All of the
    worker's GPUs stay visible, with memory growth on (a task that never uses a GPU takes no
    GPU memory), and each task picks its device with :func:`device_for`: a task without
    ``use_gpus`` runs under ``tf.device('/CPU:0')``. (Setting ``CUDA_VISIBLE_DEVICES`` from
    the first task, as dvml once did, hid the GPUs from every later task of the worker.)
    """
    with _LOCK:
        if "tf" in _STARTED:
            return _STARTED["tf"]
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        budget = budget or budget_from_env() or local_budget()
        # OpenMP reads its variable when its runtime loads, i.e. with TensorFlow's kernels.
        os.environ.setdefault("OMP_NUM_THREADS", str(budget.omp))
        with quiet_startup():  # the import and the device listing (cuInit) log to fd 2
            import tensorflow as tf

            try:
                tf.config.threading.set_intra_op_parallelism_threads(budget.intra)
                tf.config.threading.set_inter_op_parallelism_threads(budget.inter)
            except RuntimeError:  # the runtime is up already (started outside dvml): keep it
                pass
            try:
                gpus = tf.config.list_physical_devices("GPU")
                for gpu in gpus:
                    tf.config.experimental.set_memory_growth(gpu, True)
                tf.config.set_visible_devices(gpus, "GPU")
            except RuntimeError:
                pass
            import tf_keras

        _STARTED["tf"], _STARTED["keras"], _STARTED["budget"] = tf, tf_keras, budget
        return tf


def tensorflow() -> Any:
    """The ``tensorflow`` module, TensorFlow started (see :func:`start`)."""
    return _STARTED.get("tf") or start()


def keras() -> Any:
    """The ``tf_keras`` module, TensorFlow started (see :func:`start`)."""
    if "keras" not in _STARTED:
        start()
    return _STARTED["keras"]


def started_budget() -> ThreadBudget | None:
    """The thread budget TensorFlow started with in this process (None before start)."""
    return _STARTED.get("budget")


def device_for(use_gpus: bool) -> str:
    """``"/GPU:0"`` when ``use_gpus`` and this process sees a GPU, else ``"/CPU:0"``."""
    tf = tensorflow()
    if use_gpus and tf.config.list_logical_devices("GPU"):
        return "/GPU:0"
    return "/CPU:0"


# --------------------------------------------------------------------------- models


def build_model(
    model_json: str,
    weights: Sequence[Any] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    compile_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """A tf-keras model from its JSON, with ``weights`` (a list of arrays), compiled with
    ``compile_kwargs`` (from :func:`dvml.configs.compile_kwargs`) when given.

    Build it inside the device or distribution-strategy scope its variables belong to.
    """
    custom = dict(custom_objects or {})
    model = keras().models.model_from_json(model_json, custom_objects=custom)
    if weights is not None:
        model.set_weights(list(weights))
    if compile_kwargs:
        model.compile(**compile_kwargs)
    return model


class ModelCache:
    """Models built once per process and reused by later tasks, least recently used out.

    Dask runs tasks on several threads of one worker: the lock makes two tasks that want the
    same model build it once (a backbone can take seconds and much memory).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        """The cached value of ``key``, or ``build()`` stored under it."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            value = build()
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
