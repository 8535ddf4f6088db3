"""The trainer process: ``python -m dvml.train.runtime.trainer JOB.json | --standby``.

One process per trainer, for every kind of job: it reads a job file and runs the job's
*program*: ``"fit"`` (:mod:`dvml.train.runtime.sync_program`: one model, every trainer in
lock-step), ``"serve"`` (:mod:`dvml.train.runtime.serve_program`: train or evaluate any
model it is sent, one command at a time, until stdin closes) or ``"user"``
(:mod:`dvml.train.runtime.user_program`: the user's own ``train_fn``). The process exits when its
program ends, so GPU memory is released after every job, and when its worker dies
(:func:`~dvml.train.runtime.orphan.exit_with_parent`).

A trainer is started fresh or as a *standby* (``--standby``), usually forked from its
machine's *zygote* (``--zygote SOCKET``, :mod:`dvml.cluster.zygote`), which imported what
every job needs once for all the trainers of the machine. A standby imports TensorFlow and
tf-keras at once (forked: has them already), without starting TensorFlow's runtime, and then
waits on stdin for one
:class:`~dvml.train.runtime.protocol.Handover` line. ``TF_CONFIG``, the thread budget,
device visibility and the temporary directory are still open then, so they are set per job;
the standby runs that one job and exits like a fresh trainer. It exits without running
anything when stdin closes (its worker went away).

Start-up is timed (:class:`~dvml.train.runtime.startup.Startup`). Lines on stdout that start
with ``DVML `` are the protocol (:mod:`dvml.train.runtime.protocol`); everything else is
TensorFlow's chatter.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

from dvml import tf_runtime
from dvml.train.runtime.orphan import exit_with_parent
from dvml.train.runtime.protocol import Failed, Handover, emit, parse
from dvml.train.runtime.startup import MODULE_START, Startup

# dvml.registry.* is imported where it is used: the registry package loads pandas, SQLAlchemy
# and dask.config, which a trainer process does not need to start training.

__all__ = ["main", "run_program"]


def run_program(job: dict[str, Any], startup: Startup) -> None:
    """Run the job's program (``"fit"``, ``"serve"`` or ``"user"``)."""
    program = job.get("program", "fit")
    if program == "serve":
        from dvml.train.runtime.serve_program import serve

        serve(job)
    elif program == "user":
        from dvml.train.runtime.user_program import run

        run(job, startup)
    else:
        from dvml.train.runtime.sync_program import run

        run(job, startup)
        if job.get("serve_after"):
            # A CPU fit's trainer goes on as its client's inference session on this worker
            # (dvml.train.runtime.sessions.adopt): evaluate and predict after the fit pay no
            # TensorFlow import. The fit's model and views are gone with run()'s frame.
            import gc

            from dvml.train.runtime.serve_program import serve

            gc.collect()
            serve({**job, "training": None, "validation": None})


# A standby imports at a lower CPU priority: it should take the cores only when nothing else
# (an evaluate, a pack, another fit's trainer) wants them. Only its import thread is niced
# (Linux nice values are per thread), so the job runs at the priority the trainer started with.
STANDBY_NICE = 10


def _standby_imports(imports: dict[str, float]) -> None:
    """(The standby's import thread.) Import what every job needs, at a lower priority."""
    imports["tid"] = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.nice(STANDBY_NICE)
    imports["nice"] = float(os.getpriority(os.PRIO_PROCESS, 0))  # this thread's
    imports.update(tf_runtime.preimport())
    t0 = time.perf_counter()
    # What every job reads with (this module imported dvml's resolvers already): vineyard
    # (first: without its vineyardctl subprocess), the weights codec and the model averaging,
    # imported while waiting.
    from dvml.vineyard_runtime import import_vineyard

    import_vineyard()
    import dvml.registry.weights
    import dvml.train.runtime.averaging
    import dvml.train.runtime.sync_program  # noqa: F401

    imports["import_dvml"] = time.perf_counter() - t0
    imports["ready"] = time.time()


def _normal_priority(tid: int) -> bool:
    """Give a still-importing thread this thread's priority back (False: not permitted; an
    unprivileged process may not lower a nice value, so the import ends at +10)."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, 0))
    except OSError:
        return False
    return True


def _standby() -> tuple[dict[str, Any], dict[str, float]] | None:
    """Import TensorFlow (in a niced thread), and wait for one job line on stdin meanwhile.

    Returns None when stdin closes (the worker went away) before a job came.
    """
    imports: dict[str, float] = {}
    loader = threading.Thread(
        target=_standby_imports, args=(imports,), name="dvml-standby-imports", daemon=True
    )
    loader.start()
    line = sys.stdin.readline()
    came = time.time()
    if not line:
        if loader.is_alive():  # do not tear the interpreter down under a half-done import
            sys.stdout.flush()
            os._exit(0)
        return None
    message = parse(line.rstrip("\n"))
    if not isinstance(message, Handover):
        print(f"dvml standby: not a handover line: {line[:200]!r}", file=sys.stderr, flush=True)
        return None
    if loader.is_alive():  # the job came first: finish the import at the job's priority
        imports["reniced"] = float(_normal_priority(int(imports.get("tid", 0))))
    loader.join()
    imports.pop("tid", None)
    if "ready" not in imports:  # the import failed in its thread: let the job's import say why
        imports.update(tf_runtime.preimport())
        imports["ready"] = time.time()
    # Before TensorFlow's runtime starts: TF_CONFIG, thread budget, visible devices.
    _job_environment(message.env)
    os.chdir(message.cwd)
    with open(message.job_path) as f:
        job = json.load(f)
    ready = imports.pop("ready")
    imports["idle"] = max(0.0, came - ready)  # waited for a job with TensorFlow imported
    imports["waited_for_imports"] = max(0.0, ready - came)  # the job waited for the import
    return job, {k: round(v, 4) for k, v in imports.items()}


def _job_environment(env: dict[str, str]) -> None:
    """Set the job's environment; its TMPDIR also for :mod:`tempfile`, which may have cached
    the standby's (TensorFlow's autograph writes its generated files there)."""
    os.environ.update(env)
    if env.get("TMPDIR"):
        tempfile.tempdir = env["TMPDIR"]


def _zygote_imports() -> None:
    """(The zygote, before it forks.) The standby's imports, in a niced thread: the forks
    come from the main thread, which keeps its priority."""
    imports: dict[str, float] = {}
    loader = threading.Thread(target=_standby_imports, args=(imports,), name="dvml-zygote-imports")
    loader.start()
    loader.join()
    print(f"dvml zygote {os.getpid()}: imported {imports}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--zygote":
        from dvml.cluster.zygote import serve

        return serve(argv[1], _zygote_imports, lambda: main(["--standby"]))
    if len(argv) != 1:
        print(
            "usage: python -m dvml.train.runtime.trainer JOB.json | --standby | --zygote SOCKET",
            file=sys.stderr,
        )
        return 2
    exit_with_parent()  # never outlive the worker that started this trainer (or standby)
    if argv[0] == "--standby":
        got = _standby()
        if got is None:
            return 0
        job, imports = got
        startup = Startup(job.get("launched_at"), imports)
        startup.mark("handover")
    else:
        with open(argv[0]) as f:
            job = json.load(f)
        startup = Startup(job.get("launched_at"), None)
        startup.seconds["process_start"] = round(MODULE_START - startup.launched_at, 4)
        startup.last = MODULE_START
        startup.seconds.update({k: round(v, 4) for k, v in tf_runtime.preimport().items()})
        startup.last = time.time()
    try:
        run_program(job, startup)
    except Exception as exc:
        emit(Failed(type=type(exc).__name__, message=str(exc), fatal=True))
        if getattr(exc, "reported_in_full", False):
            # The user's traceback is in the message: the trainer's and the zygote's frames
            # printed after it would only bury it.
            return 1
        raise
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written (weights, checkpoint, TensorBoard's files closed at the end of
    # each fit) and the launcher has the "done" line. The interpreter's teardown (TensorFlow's
    # gRPC server of the collectives, its thread pools, every module) took 4.7-6.7 s more on
    # 2 loaded cores, all of it inside the fit's wall time: skip it. An exception still exits
    # the usual way, above, with its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
