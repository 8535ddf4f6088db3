"""What every workflow shares: arguments, logging, the run lock, the journal and exit codes.

Files in the state directory (``state_dir`` in the job file, default
``<dvml cluster.state-dir>/workflows``), for workflow ``retrain`` and job name ``digits``:

``retrain-digits.lock``
    Held with ``fcntl.flock`` for the whole run; it records the holder's pid. The kernel
    releases it when the process ends, however it ends, so a crash never leaves it stuck.
``retrain-digits.journal.json``
    Written when a run starts, updated at each phase, removed when the run succeeds. Found at
    start, it means the previous run was killed or failed: its phase and the staging objects
    that existed before it tell the next run what to clean up.
``retrain-digits.state.json``
    What the last successful run did (data fingerprint, datasets, outcome): a scheduled run
    with no new data does nothing, and a re-run reuses datasets built from the same data.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dvml.exceptions import LockHeldError  # a DvmlError; re-exported for the workflows

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_LOCKED",
    "EXIT_OK",
    "LockHeldError",
    "RunContext",
    "RunLock",
    "digest",
    "run_workflow",
]

EXIT_OK = 0  # done: trained (promoted or not), refreshed, or nothing new to do
EXIT_FAILED = 1  # the run failed; what it published is consistent and a re-run is safe
EXIT_CONFIG = 2  # bad arguments or job file: nothing was started
EXIT_LOCKED = 3  # another run of the same job holds the lock: nothing was started


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def digest(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (what makes two runs "the same")."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class RunLock:
    """An exclusive ``fcntl.flock`` on ``path``, recording the holder's pid and start time.

    The file is never deleted (deleting a flock'ed file lets two processes lock two different
    files of the same name); only its content changes.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._fd: int | None = None

    def holder(self) -> dict[str, Any] | None:
        """What the file records about its last holder (None when never locked)."""
        try:
            text = self.path.read_text()
        except OSError:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def is_held(self) -> bool:
        """Whether another process holds the lock now (takes and drops it when free)."""
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def acquire(self, what: str) -> None:
        """Take the lock or raise :class:`LockHeldError` naming the lock file and holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            holder = self.holder() or {}
            pid = holder.get("pid", "unknown")
            raise LockHeldError(
                f"Another {what} run holds the lock {self.path} (pid {pid}, started "
                f"{holder.get('started', 'at an unknown time')}): refusing to run twice at "
                f"once. Wait for pid {pid} to finish; the lock is released when it exits."
            ) from None
        record = {"pid": os.getpid(), "started": _now(), "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _write_json(path: pathlib.Path, value: Mapping[str, Any]) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: pathlib.Path) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # a file we cannot read is treated as absent; the run rewrites it
    return value if isinstance(value, dict) else None


@dataclasses.dataclass
class RunContext:
    """One run of a workflow: its arguments, job file, files and logger."""

    workflow: str
    args: argparse.Namespace
    job: dict[str, Any]
    config_path: pathlib.Path
    state_dir: pathlib.Path
    log: logging.Logger
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])
    started: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def base_dir(self) -> pathlib.Path:
        """Relative paths in the job file are relative to its directory."""
        return self.config_path.resolve().parent

    def _file(self, suffix: str) -> pathlib.Path:
        return self.state_dir / f"{self.workflow}-{self.job['name']}.{suffix}"

    @property
    def lock(self) -> RunLock:
        return RunLock(self._file("lock"))

    @property
    def journal_path(self) -> pathlib.Path:
        return self._file("journal.json")

    @property
    def state_path(self) -> pathlib.Path:
        return self._file("state.json")

    def read_journal(self) -> dict[str, Any] | None:
        return _read_json(self.journal_path)

    def journal(self, phase: str, **extra: Any) -> None:
        """Record the phase this run is in (kept if the run is killed)."""
        current = self.read_journal() or {}
        if current.get("run_id") != self.run_id:
            current = {"run_id": self.run_id, "pid": os.getpid(), "started": _now()}
        current.update(extra, phase=phase, updated=_now())
        _write_json(self.journal_path, current)

    def clear_journal(self) -> None:
        try:
            self.journal_path.unlink()
        except FileNotFoundError:
            pass

    def read_state(self) -> dict[str, Any]:
        return _read_json(self.state_path) or {}

    def write_state(self, state: Mapping[str, Any]) -> None:
        _write_json(self.state_path, state)

    def lock_line(self) -> str:
        """The lock file and whether a run holds it now (for plans)."""
        lock = self.lock
        if lock.is_held():
            return f"lock {lock.path} (held now by pid {(lock.holder() or {}).get('pid')})"
        return f"lock {lock.path} (free)"

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def build_parser(workflow: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m workflows.{workflow}",
        description=description,
        epilog="Exit codes: 0 done (or nothing new), 1 the run failed (a re-run is safe), "
        "2 invalid arguments or config (nothing started), 3 another run holds the lock. "
        "See workflows/README.md.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the YAML job file.")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config and show the plan; start, write and lock nothing.",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="run even when the newest data was already handled by the last successful run.",
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDR",
        help="attach to this scheduler instead of the config's cluster section.",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the lock, journal and state files live (default: the config's state_dir, "
        "else <dvml cluster.state-dir>/workflows).",
    )
    parser.add_argument("--log-file", metavar="FILE", help="also append the log to this file.")
    parser.add_argument("--debug", action="store_true", help="log tracebacks of failures.")
    return parser


def _logger(workflow: str, log_file: str | None) -> logging.Logger:
    log = logging.getLogger(f"workflows.{workflow}")
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(
        "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z"
    )
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        path = pathlib.Path(log_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path))
    for handler in handlers:
        handler.setFormatter(formatter)
        log.addHandler(handler)
    return log


def _state_dir(args: argparse.Namespace, job: Mapping[str, Any]) -> pathlib.Path:
    if args.state_dir:
        return pathlib.Path(args.state_dir).expanduser()
    if job.get("state_dir"):
        return pathlib.Path(os.path.expanduser(job["state_dir"]))
    from dvml import config

    return config.state_dir() / "workflows"


def fit_memory_plan(ctx: RunContext) -> None:
    """The memory plan of a job file's pack and fit, on the running cluster it would use
    (``dvml fit --config FILE --dry-run`` prints the same): nothing is started or written."""
    from dvml.cli.train_cmd import dry_run_memory

    args = argparse.Namespace(scheduler=ctx.args.scheduler, state_dir=None, registry=None)
    try:
        dry_run_memory(args, dict(ctx.job), ctx.base_dir)
    except Exception as exc:  # the steps are shown; a plan that cannot be made is said
        print(f"Memory plan: not computed: {type(exc).__name__}: {exc}")


Plan = Callable[[RunContext], list[str]]
Run = Callable[[RunContext], int]


def run_workflow(
    workflow: str,
    description: str,
    schema: Mapping[str, Any],
    plan: Plan,
    run: Run,
    argv: Sequence[str] | None,
    memory: Callable[[RunContext], None] | None = None,
) -> int:
    """Parse arguments, check the job file, then show the plan (``--dry-run``) or run it.

    ``memory`` prints the job's memory plan after the steps of a dry run
    (:func:`fit_memory_plan` for a job file with a model to fit).

    The run holds the lock and keeps the journal; every failure is logged as one line (with
    the traceback under ``--debug``) and turned into an exit code.
    """
    parser = build_parser(workflow, description)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    log = _logger(workflow, args.log_file)
    # TensorFlow's C++ start-up chatter would bury the one-line-per-step log.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from dvml.exceptions import ConfigError
    from dvml.jobs.yaml_schema import load

    try:
        job = load(args.config, schema)
    except ConfigError as exc:
        log.error("invalid config, nothing was started: %s", exc)
        return EXIT_CONFIG
    ctx = RunContext(workflow, args, job, pathlib.Path(args.config), _state_dir(args, job), log)
    if args.dry_run:
        try:
            lines = plan(ctx)
        except Exception as exc:  # a source that does not exist, an unreadable file...
            log.error(
                "dry run: the plan cannot be made: %s: %s",
                type(exc).__name__,
                exc,
                exc_info=args.debug,
            )
            return EXIT_FAILED
        print(f"Plan for {workflow} {job['name']!r} (dry run: nothing was started or written):")
        for line in lines:
            print(f"  - {line}")
        if memory is not None:
            memory(ctx)
        return EXIT_OK

    lock = ctx.lock
    try:
        lock.acquire(f"{workflow} {job['name']!r}")
    except LockHeldError as exc:
        log.error("%s", exc)
        return EXIT_LOCKED
    log.info(
        "run %s of %s %r started (pid %d, lock %s)",
        ctx.run_id,
        workflow,
        job["name"],
        os.getpid(),
        lock.path,
    )
    try:
        code = run(ctx)
    except KeyboardInterrupt:
        log.error(
            "interrupted: the journal %s tells the next run what to clean up", ctx.journal_path
        )
        return EXIT_FAILED
    except Exception as exc:
        journal = ctx.read_journal()
        phase = (journal or {}).get("phase", "start")
        if journal is not None:  # the next run cleans up after it, and says why
            ctx.journal(phase, failed=type(exc).__name__)
        log.error(
            "failed in phase %r after %.1fs: %s: %s. Published datasets and models are "
            "consistent; run again to retry.",
            phase,
            ctx.elapsed(),
            type(exc).__name__,
            str(exc).rstrip("."),
            exc_info=args.debug,
        )
        return EXIT_FAILED
    finally:
        lock.release()
    return code


def recover(ctx: RunContext, client: Any) -> list[str]:
    """Clean up after a killed run, then start this run's journal; return the staging runs.

    Orphaned trainers (of any fit whose client is gone: they would hold the workers' threads)
    are stopped, and other tasks of dead clients are waited for. When the journal of a
    previous run of this job is found, the staging objects that appeared while it ran are
    deleted: they belong to a preprocessing (or featurization) it never finished.
    """
    from dvml.jobs.job_cluster import (
        abort_orphaned_trainers,
        drop_staging,
        staging_runs,
        wait_for_released_tasks,
    )

    aborted = abort_orphaned_trainers(client)
    if aborted:
        ctx.log.info(
            "stopped %d orphaned trainer task(s) whose client is gone: %s",
            len(aborted),
            ", ".join(aborted),
        )
    # Tasks of a killed client (packing, featurizing) may still put objects: let them end first.
    waited = wait_for_released_tasks(client)
    if waited:
        ctx.log.info("waited for %d task(s) of a killed client to end", len(waited))
    previous = ctx.read_journal()
    if previous is not None:
        ended = f"failed ({previous['failed']})" if previous.get("failed") else "did not finish"
        ctx.log.warning(
            "previous run %s (pid %s) %s (last phase %r at %s): cleaning up",
            previous.get("run_id"),
            previous.get("pid"),
            ended,
            previous.get("phase"),
            previous.get("updated"),
        )
        before = set(previous.get("staging_before") or [])
        stale = sorted(set(staging_runs(client)) - before)
        if stale:
            count = drop_staging(client, stale)
            ctx.log.info(
                "deleted %d staging object(s) of unpublished preprocessing run(s) %s",
                count,
                ", ".join(stale),
            )
    staging = sorted(staging_runs(client))
    ctx.journal("started", staging_before=staging)
    return staging
