"""What the whole-job benchmarks (B19, B20) share: sides run as fresh processes, the Ray peer.

Each side is ONE fresh process (``python -m MODULE SIDE DIR`` in dvml's environment, or
``benchmarks/ray_peer.py MODE DIR`` in Ray's own, ``./scripts/peer-ray``) that reads the shared
inputs from ``DIR`` and writes ``DIR/result-SIDE.json``. The parent measures its wall time from
spawn to exit; a run for a memory row (``run_side(..., memory=True)``) also samples the memory
of its whole process tree (a LocalCluster's workers, vineyardd, etcd and trainers, or Ray's
raylet and workers, are all descendants) as if the tree ran alone (:func:`tree_memory`).
Several rows of one benchmark read their figures from the same runs (:func:`take`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import Skipped

__all__ = [
    "ROOT",
    "SAMPLE_S",
    "SPAWNED",
    "cleanup",
    "dvml_command",
    "ray_command",
    "ray_python",
    "run_side",
    "since_spawn",
    "take",
    "tree_memory",
    "write_inputs",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_S = 0.2
PAGEMAP_READ = 1 << 20  # pages per read of /proc/PID/pagemap
SPAWNED = "DVML_BENCH_SPAWNED"  # the parent's time.time() at spawn: every side's phase clock


def since_spawn() -> Callable[[], float]:
    """In a side's process: a clock of the seconds since the parent spawned it (phases)."""
    spawned = float(os.environ.get(SPAWNED) or time.time())
    return lambda: round(time.time() - spawned, 4)


def ray_python() -> str:
    """The Python of Ray's own environment: ``$DVML_RAY_PYTHON`` or ``.venv-ray``.

    Raises :class:`benchmarks.harness.Skipped` (a RuntimeError) when it is not installed: the
    rows that need Ray are then skipped, with the command that installs it."""
    path = os.environ.get("DVML_RAY_PYTHON") or os.path.join(ROOT, ".venv-ray", "bin", "python")
    if not os.access(path, os.X_OK):
        raise Skipped(
            f"The Ray peer is not installed: no executable {path!r}. Run ./scripts/peer-ray "
            "(Ray Train + Ray Data in their own environment, .venv-ray) or set DVML_RAY_PYTHON "
            "to the Python of an environment that has ray[data,train], tensorflow and tf_keras."
        )
    return path


def write_inputs(directory: str, copies: int, epochs: int, batch: int, workers: int) -> int:
    """The shared inputs of every side: ``data.npz``, ``valid.npz`` (B4's digits) and
    ``job.json`` (the model's JSON, epochs, per-worker batch, workers); the training rows."""
    import numpy as np

    from benchmarks import b4_end_to_end as b4
    from dvml.examples import digits_cnn_json

    train, valid = b4.digits_frames(copies)
    for name, frame in (("data", train), ("valid", valid)):
        np.savez(
            os.path.join(directory, f"{name}.npz"),
            x=np.stack(frame["pixels"].to_list()).astype("float32"),
            y=frame["label"].to_numpy().astype("int64"),
        )
    job = {"model_json": digits_cnn_json(), "epochs": epochs, "batch": batch // workers,
           "workers": workers}  # fmt: skip
    with open(os.path.join(directory, "job.json"), "w") as f:
        json.dump(job, f)
    return len(train)


def cleanup(context: dict[str, Any]) -> None:
    """A benchmark's cleanup: remove the inputs' directory (``context["directory"]``)."""
    shutil.rmtree(context["directory"], ignore_errors=True)


def _resident_frames(pid: int) -> Any:
    """The physical page frames resident in process ``pid`` (``/proc/PID/pagemap``; the frame
    numbers read as 0 without CAP_SYS_ADMIN), each once."""
    import numpy as np

    present, frame = np.uint64(1 << 63), np.uint64((1 << 55) - 1)
    page = os.sysconf("SC_PAGE_SIZE")
    with open(f"/proc/{pid}/maps") as f:
        ranges = [[int(a, 16) for a in line.split(None, 1)[0].split("-")] for line in f]
    chunks = []
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        for start, end in ranges:
            if start >= 1 << 47:  # [vsyscall]: not in the page tables
                continue
            # 8 bytes per page; at most 8 MiB per read (a vineyardd maps its whole arena)
            for first in range(start // page, end // page, PAGEMAP_READ):
                count = min(PAGEMAP_READ, end // page - first)
                entries = np.frombuffer(os.pread(fd, count * 8, first * 8), dtype=np.uint64)
                chunks.append(entries[(entries & present) != 0] & frame)
    finally:
        os.close(fd)
    return np.unique(np.concatenate(chunks)) if chunks else np.zeros(0, np.uint64)


def tree_memory(pid: int) -> dict[str, int]:
    """The memory of process ``pid`` and its descendants AS IF THEY RAN ALONE, in bytes by a
    short name (:func:`_kind`; processes of one kind are added up).

    Every physical page resident in the tree counts once, split evenly among the tree's
    processes that map it: the PSS each process would have with no process outside the tree.
    The kernel's PSS (``smaps_rollup``) also splits a page with processes OUTSIDE the tree, so
    a tree's PSS drops when an unrelated process maps the same pages: the benchmark harness,
    which has imported TensorFlow for other rows, took ~280 MiB of TensorFlow's library pages
    off a plain tf-keras process (507 MiB of PSS in the harness, 786 MiB alone) and less off
    dvml's tree, whose processes share those pages among themselves. Reads
    ``/proc/PID/pagemap``, which gives frame numbers only to a privileged (root) reader.
    """
    import numpy as np
    import psutil

    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    kinds, frames = [], []
    for proc in tree:
        try:
            frames.append(_resident_frames(proc.pid))
        except (FileNotFoundError, ProcessLookupError):  # gone between the listing and the read
            continue
        kinds.append(_kind(proc, pid))
    if not frames:
        return {}
    every = np.concatenate(frames)
    if every.size and not every.any():
        raise RuntimeError(
            "Cannot read physical page numbers from /proc/PID/pagemap (they read as 0 without "
            "CAP_SYS_ADMIN): run the memory benchmarks as root."
        )
    _, inverse, mapped_by = np.unique(every, return_inverse=True, return_counts=True)
    shares = 1.0 / mapped_by[inverse]
    bounds = np.cumsum([0, *(len(f) for f in frames)])
    page = os.sysconf("SC_PAGE_SIZE")
    found: dict[str, int] = {}
    for k, kind in enumerate(kinds):
        own = float(shares[bounds[k] : bounds[k + 1]].sum())
        found[kind] = found.get(kind, 0) + round(own * page)
    return found


def _kind(proc: Any, root: int) -> str:
    """``side`` (the side's own process), ``trainer``, ``standby trainer``, ``dask worker``...:
    what a process of the tree is, from its command line."""
    import psutil

    if proc.pid == root:
        return "side process"
    try:
        line = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    for marker, kind in (
        ("--standby", "trainer (standby)"), ("dvml.train.runtime.trainer", "trainer"),
        ("spawn_main", "dask worker"), ("vineyardd", "vineyardd"), ("etcd", "etcd"),
        ("raylet", "ray raylet"), ("gcs_server", "ray gcs"), ("ray::", "ray worker"),
    ):  # fmt: skip
        if marker in line:
            return kind
    return os.path.basename(proc.name()) or "other"


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` and every descendant (a peer's daemons outlive a killed parent)."""
    import psutil

    try:
        tree = [*psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    process.kill()
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()
    psutil.wait_procs(tree, timeout=10)


def run_side(
    command: list[str], directory: str, side: str, timeout: float = 1800, memory: bool = False
) -> dict[str, Any]:
    """Run ``command`` as a fresh process; its ``result-SIDE.json`` plus ``wall_s`` (spawn to
    exit) and ``to_model_s`` (spawn to its ``phases["model"]``: the trained or evaluated model).

    With ``memory``, its process tree's memory is sampled (:func:`tree_memory`, about 0.1
    CPU-s per TensorFlow process and sample: keep those runs apart from the timed ones) and
    the result has ``peak_memory_bytes`` and ``peak_memory_by_kind`` (that sample by kind of
    process)."""
    result_path = os.path.join(directory, f"result-{side}.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    log_path = os.path.join(directory, f"{side}.log")
    peak, breakdown = 0, {}
    with open(log_path, "w") as log:
        # Its temporary files (TensorFlow's autograph modules, which a process that leaves
        # with os._exit never deletes) go with the benchmark's directory (cleanup()).
        tmp = os.path.join(directory, f"tmp-{side}")
        os.makedirs(tmp, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": ROOT, SPAWNED: repr(time.time()), "TMPDIR": tmp}
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=directory, env=env, stdout=log, stderr=log)
        try:
            while process.poll() is None:
                sample = tree_memory(process.pid) if memory else {}
                if sum(sample.values()) > peak:
                    peak, breakdown = sum(sample.values()), sample
                if time.perf_counter() - start > timeout:
                    raise RuntimeError(f"The {side} side ran past {timeout:.0f} s: {command}")
                time.sleep(SAMPLE_S)
        finally:
            if process.poll() is None:  # a timeout or an interrupt: the whole tree goes
                _kill_tree(process)
        wall = time.perf_counter() - start
    if process.returncode != 0 or not os.path.exists(result_path):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(
            f"The {side} side failed (rc {process.returncode}): {' '.join(command)}. Its "
            f"output ends with: {tail}"
        )
    with open(result_path) as f:
        result = dict(json.load(f))
    result.update(wall_s=wall, to_model_s=result["phases"]["model"])
    if memory:
        result.update(peak_memory_bytes=peak, peak_memory_by_kind=breakdown)
    return result


def dvml_command(module: str, side: str, directory: str) -> list[str]:
    """``python -m MODULE SIDE DIR`` in this (dvml's) environment."""
    return [sys.executable, "-m", module, side, directory]


def ray_command(python: str, mode: str, directory: str) -> list[str]:
    """The Ray peer in Ray's environment."""
    return [python, os.path.join(ROOT, "benchmarks", "ray_peer.py"), mode, directory]


def take(
    context: dict[str, Any], row: str, side: str, run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Row ``row``'s next run of ``side``: the runs earlier rows of the same benchmark made,
    in order (so that every row's figures come from the same processes), then new ones
    (``run()``) where those are used up. A run that raises is not counted: the row's next call
    tries again, and ``context["runs"]`` lists only the runs that succeeded."""
    runs = context.setdefault("runs", {}).setdefault(side, [])
    taken = context.setdefault("taken", {})
    index = taken.get((row, side), 0)
    if index == len(runs):
        try:
            runs.append(run())
        finally:
            if not runs:  # no side's run has succeeded: details() must not see an empty list
                del context["runs"][side]
    taken[(row, side)] = index + 1
    return dict(runs[index])
