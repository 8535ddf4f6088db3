"""``python -m benchmarks.soak``: cycles of start, pack, fit, kill something, recover, stop.

Each cycle starts a fresh 2-worker LocalCluster, packs the digits, trains the demo CNN for one
iteration, kills one process (in turn: a Dask worker, a trainer during a fit, a vineyardd),
recovers from it the way a user would, and stops the cluster. After every cycle it counts what
was left behind against the state before the first one:

- processes: descendants of this process still running (zombies and multiprocessing's resource
  tracker excepted);
- files: every entry under the temporary directory (recursively; the soak's own scratch
  directory, where the registry lives, excepted): cluster directories, vineyardd logs,
  TensorFlow's autograph files, anything;
- /dev/shm: bytes used and every entry (recursively);
- memory: this process's resident set size (after the first cycle, which loads the libraries).

It prints one line per cycle and a verdict, and exits 1 when processes, files or /dev/shm
leaked, or when the resident set grew by more than ``--max-rss-growth`` MiB from the end of the
first cycle to the end of the last. Issue #16 asks for 50 cycles (about 80 minutes here)::

    python -m benchmarks.soak --cycles 50

Run as root, it runs in a mount namespace of its own with a private, empty ``/dev/shm``
(``unshare --mount``) and a fresh ``TMPDIR``, so that what other programs on the machine create
or delete meanwhile is not counted (``--no-isolate`` to measure the machine's own directories).
``/tmp`` itself is not replaced: the checkout may live there.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

KINDS = ("worker", "trainer", "vineyardd")


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What exists now that a cycle could leak."""

    processes: dict[int, str]
    files: frozenset[str]
    shm_used: int
    shm_entries: frozenset[str]
    rss: int


def entries(root: str, skip: Sequence[str] = ()) -> frozenset[str]:
    """Every file, directory and link under ``root`` (recursively), but those under ``skip``.

    Not a list of known patterns: whatever a cycle leaves (a TensorFlow autograph file, a
    semaphore, a socket) is counted, including what nobody thought of when this was written.
    """
    skipped = {os.path.abspath(s) for s in skip}
    found: set[str] = set()
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(directory, d) not in skipped]
        found.update(os.path.join(directory, name) for name in [*dirs, *files])
    return frozenset(found)


def footprint(skip: Sequence[str] = ()) -> Footprint:
    """Measure the processes, files, /dev/shm and memory held now.

    ``files``: every entry under the temporary directory (``TMPDIR``: a fresh one when the
    soak runs isolated), but under ``skip`` (the soak's own scratch directory); ``/dev/shm``:
    its bytes used and every entry.
    """
    processes = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "multiprocessing.resource_tracker" not in cmdline:
            processes[proc.pid] = cmdline
    return Footprint(
        processes=processes,
        files=entries(tempfile.gettempdir(), skip),
        shm_used=shutil.disk_usage("/dev/shm").used,
        shm_entries=entries("/dev/shm"),
        rss=psutil.Process().memory_info().rss,
    )


def leaks(before: Footprint, after: Footprint) -> dict[str, Any]:
    """What ``after`` holds beyond ``before`` (processes, files, /dev/shm)."""
    return {
        "processes": {p: c for p, c in after.processes.items() if p not in before.processes},
        "files": sorted(after.files - before.files),
        "shm_bytes": max(0, after.shm_used - before.shm_used),
        "shm_entries": sorted(after.shm_entries - before.shm_entries),
    }


def _settled(
    before: Footprint, skip: Sequence[str], timeout: float = 20.0
) -> tuple[Footprint, dict[str, Any]]:
    """The footprint once processes had ``timeout`` seconds to exit, and its leaks."""
    deadline = time.monotonic() + timeout
    while True:
        now = footprint(skip)
        found = leaks(before, now)
        if not any(found.values()) or time.monotonic() > deadline:
            return now, found
        time.sleep(0.5)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    """Wait until ``pid`` exited (a zombie counts: its owner reaps it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)


def _trainer_pids() -> list[int]:
    """Trainers that run a job: a trainer's working directory holds its job.json from the
    handover on. An idle standby (no job yet) is left out: killing one only makes the fit
    start a fresh process, which is not the fault this cycle is about."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "dvml.train.runtime.trainer" in " ".join(proc.cmdline()) and os.path.exists(
                os.path.join(proc.cwd(), "job.json")
            ):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _fit(ds: Any, arch_id: int, registry: str, client: Any) -> Any:
    import dvml
    from dvml.examples import COMPILE_PARAMS

    return dvml.fit(ds, "soak_cnn", arch_id, COMPILE_PARAMS, "batch_size=32, epochs=1",
                    num_iterations=1, progress=False, overwrite=True, registry=registry,
                    client=client)  # fmt: skip


def _kill_trainer_during_fit(ds: Any, arch_id: int, registry: str, client: Any) -> str:
    """Kill a trainer of the running fit; the fit fails naming it; refit."""
    import dvml

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            _fit(ds, arch_id, registry, client)
            outcome["fit"] = "finished"
        except dvml.DvmlError as error:
            outcome["fit"] = f"failed: {type(error).__name__}"

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    killed = None
    while killed is None and thread.is_alive() and time.monotonic() < deadline:
        for pid in _trainer_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                killed = pid
                break
            except ProcessLookupError:
                continue
        time.sleep(0.05)
    thread.join(600)
    _fit(ds, arch_id, registry, client)  # the rerun resumes or trains again, and must finish
    return f"trainer {killed} killed, fit {outcome.get('fit', 'hung')}, refit ok"


def cycle(kind: str, registry: str) -> str:
    """One cycle: start, pack, fit, kill ``kind``, recover, stop. Returns what happened."""
    import dvml
    from dvml.examples import digits_cnn_json, digits_frame

    with dvml.LocalCluster(n_workers=2, vineyard_memory="128MiB", set_as_default=False) as cluster:
        client = cluster.client
        ds = dvml.training_preprocessor(digits_frame(), y="label", x="pixels",
                                        normalizing_const=16.0, name="soak_digits",
                                        client=client)  # fmt: skip
        arch_id = dvml.load_keras_model(digits_cnn_json(), name="soak-cnn", registry=registry)
        if kind == "worker":
            pid = cluster.processes()["dask worker worker-1"]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the Nanny restarts it
                if (
                    cluster.processes().get("dask worker worker-1", pid) != pid
                    and len(client.scheduler_info()["workers"]) == 2
                ):
                    break
                time.sleep(0.2)
            _fit(ds, arch_id, registry, client)
            what = f"worker-1 (pid {pid}) killed and restarted, fit ok"
        elif kind == "trainer":
            what = _kill_trainer_during_fit(ds, arch_id, registry, client)
        else:
            _fit(ds, arch_id, registry, client)
            pid = cluster.processes()["vineyardd of worker-1"]
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
            status = dvml.datasets.list(client).set_index("name").loc["soak_digits", "status"]
            dvml.datasets.drop("soak_digits", client)
            what = f"vineyardd of worker-1 killed, dataset {status}, dropped"
    return what


def run(cycles: int, max_rss_growth_mib: float, say: Callable[[str], None] = print) -> bool:
    """Run ``cycles`` cycles; print one line each and a verdict; return whether none leaked."""
    first_rss = None
    clean = True
    with tempfile.TemporaryDirectory(prefix="dvml-soak-") as scratch:
        before = footprint([scratch])  # the registry's files come and go in the scratch
        registry = "sqlite:///" + os.path.join(scratch, "registry.db")
        for i in range(cycles):
            kind = KINDS[i % len(KINDS)]
            started = time.monotonic()
            what = cycle(kind, registry)
            after, found = _settled(before, [scratch])
            first_rss = after.rss if first_rss is None else first_rss
            leaked = {k: v for k, v in found.items() if v}
            clean = clean and not leaked
            say(f"cycle {i + 1:3d}/{cycles} {kind:9s} {time.monotonic() - started:5.1f}s "
                f"rss {after.rss / 2**20:7.1f} MiB  {what}"
                + (f"  LEAKED {leaked}" if leaked else ""))  # fmt: skip
    growth = (after.rss - first_rss) / 2**20 if cycles else 0.0
    say(f"resident set growth from cycle 1 to {cycles}: {growth:.1f} MiB "
        f"(allowed {max_rss_growth_mib:.0f})")  # fmt: skip
    clean = clean and growth <= max_rss_growth_mib
    say("soak: no leak" if clean else "soak: LEAKS found (see above)")
    return clean


ISOLATED_ENV = "DVML_SOAK_ISOLATED"


def isolated_command(argv: Sequence[str]) -> list[str]:
    """This soak again, in a new mount namespace with an empty private /dev/shm."""
    inner = " ".join(["exec", sys.executable, "-m", "benchmarks.soak", *argv])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs tmpfs /dev/shm && {inner}"]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cycles", type=int, default=50, help="cycles to run (default 50).")
    parser.add_argument(
        "--max-rss-growth", type=float, default=200.0, metavar="MIB",
        help="resident-set growth allowed over the run (default 200 MiB).",
    )  # fmt: skip
    parser.add_argument("--no-isolate", action="store_true",
                        help="count in the machine's own /tmp and /dev/shm (default as root: "
                        "a private mount namespace).")  # fmt: skip
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not args.no_isolate and os.geteuid() == 0 and not os.environ.get(ISOLATED_ENV):
        with tempfile.TemporaryDirectory(prefix="dvml-soak-tmp-") as tmp:
            env = {**os.environ, ISOLATED_ENV: "1", "TMPDIR": tmp}
            return subprocess.run(isolated_command(argv), env=env, check=False).returncode
    return 0 if run(args.cycles, args.max_rss_growth) else 1


if __name__ == "__main__":
    raise SystemExit(main())
