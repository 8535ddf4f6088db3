"""One fit per model name at a time: an exclusive lock file in the state directory.

Two fits of one model share its checkpoint directory (``state_dir/checkpoints/MODEL-KEY``):
the second would resume from the first's checkpoints (training nothing when the first had
finished) and both would register a version. A fit therefore holds ``flock`` on
``state_dir/locks/fit-<name>.lock`` from before it looks for a checkpoint until its model is
saved. The kernel drops the lock when the process dies, so a killed client leaves no stale
lock. The file records who holds it (pid, host, job, start) for the error message.
``flock`` is per open file, so two fits in one process exclude each other too.

``dvml.fit_multiple`` and ``dvml.automl`` hold the same kind of lock on their ``model_output``
(:func:`holding_output`, one name space for both: they write the same run and models), so two
equal calls never share checkpoints or register over each other.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from dvml.cluster.state import private_dir
from dvml.exceptions import FitRunningError

__all__ = ["holding_model", "holding_output", "lock_path"]


def lock_path(state_dir: Path, model: str) -> Path:
    """The lock file of ``model``: a readable prefix and a hash (any name is a safe path)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[:60].lstrip(".")
    digest = hashlib.sha256(model.encode()).hexdigest()[:12]
    return state_dir / "locks" / f"fit-{safe}-{digest}.lock"


@contextlib.contextmanager
def holding_model(state_dir: Path, model: str, job: str) -> Iterator[None]:
    """Hold the fit lock of ``model`` for the ``with`` block.

    Raises
    ------
    FitRunningError
        Another fit of ``model`` (in this or another process) holds it; names that fit.
    """
    with _holding(
        state_dir,
        model,
        job,
        lambda holder: (
            f"Model {model!r} is being trained by another fit ({holder}). Nothing was "
            "started. Wait for that fit to end (or stop it), or train under another model "
            "name."
        ),
    ):
        yield


@contextlib.contextmanager
def holding_output(state_dir: Path, model_output: str, job: str, call: str) -> Iterator[None]:
    """Hold the lock of the ``fit_multiple``/``automl`` run ``model_output`` for the block.

    Parameters
    ----------
    state_dir : Path
        The client's state directory (config ``dvml.cluster.state-dir``).
    model_output : str
        The run's name; one lock for ``fit_multiple`` and ``automl``, apart from ``fit``'s.
    job : str
        Who holds it, for the refusal of a second call (the call and its job key).
    call : str
        The call asking (``"dvml.fit_multiple"``), for the message.

    Raises
    ------
    FitRunningError
        Another ``fit_multiple`` or ``automl`` of ``model_output`` holds it; names that job.
    """
    with _holding(
        state_dir,
        f"selection-{model_output}",
        job,
        lambda holder: (
            f"{call} refused: the run {model_output!r} is being trained by another call "
            f"({holder}); both would share its checkpoints and register the same models. "
            f"Nothing was started. Received: model_output={model_output!r}. Wait for that "
            "call to end (or stop it), or choose another model_output."
        ),
    ):
        yield


@contextlib.contextmanager
def _holding(state_dir: Path, name: str, job: str, refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold ``flock`` on the lock file of ``name``; ``refusal(holder)`` is the message when
    another holder has it."""
    path = lock_path(state_dir, name)
    private_dir(path.parent, root=state_dir)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FitRunningError(refusal(_holder(fd))) from None
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "job": job,
            "model": name,
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """Who holds the lock, from the file's contents (written right after it was taken)."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        owner = {}
    if not owner:
        return "it is just starting"
    return (
        f"job {owner.get('job')}, pid {owner.get('pid')} on host {owner.get('host')}, "
        f"started {owner.get('started')}"
    )
