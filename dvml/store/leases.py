"""Dataset leases: a job that reads datasets holds a lease; drop and overwrite refuse.

Trainers (and any process reading through :func:`dvml.resolve.open_local`) keep zero-copy
views of a dataset's blobs in vineyardd's shared memory. Dropping or overwriting the dataset
frees those blobs at once, and the next pack reuses the memory: the readers then train on
garbage or on another dataset's values, silently. So a job holds a *lease* on every dataset it
reads for as long as it runs (``with holding(names, job=...)``: :func:`dvml.fit` and
:func:`dvml.fit_multiple` around the whole training), and :func:`dvml.datasets.drop`,
``overwrite=True`` of the preprocessors and ``dvml datasets drop`` refuse a leased dataset with
:class:`~dvml.exceptions.DatasetInUseError` naming the job, unless ``force=True`` (``--force``):
then the caller takes the responsibility (stop the job first; its readers would read freed
memory).

Where: one file per holding in ``<state_dir>/leases/`` (``dvml.cluster.state-dir``; the
directory 0700, the files 0600), written before the job reads anything and removed when it
ends. Each names the job, its process (pid, start time, host) and the datasets. A lease whose
process is gone (killed: it never removed its file) is ignored and removed by the next check,
so a dead holder blocks nothing; a lease from another host cannot be checked and counts as
held. Every process that uses the same state directory sees the leases: the processes of one
machine (a LocalCluster, ``dvml cluster up``), or several machines that share it.

The pure parts (:func:`lease_record`, :func:`holders`, :func:`in_use_message`) take and return
plain values; the rest reads and writes the files.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from dvml import config
from dvml.cluster.state import private_dir, private_file, process_start_time, same_process
from dvml.exceptions import ArgumentTypeError, DatasetInUseError

__all__ = [
    "LEASE_DIR",
    "check_not_leased",
    "holders",
    "holding",
    "in_use_message",
    "lease_record",
    "read_leases",
    "unleased",
]

LEASE_DIR = "leases"
"""The directory of the lease files, in the state directory."""


def _names(datasets: Iterable[Any]) -> list[str]:
    """The names of ``datasets``: names, objects with a ``name`` (a Dataset), or None (skipped)."""
    found: list[str] = []
    for item in datasets:
        if item is None:
            continue
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if not isinstance(name, str):
            raise ArgumentTypeError(
                f"A lease is taken on dataset names or Datasets. Received: {type(item).__name__} "
                f"{item!r:.80}."
            )
        if name not in found:
            found.append(name)
    return found


def lease_record(
    names: Sequence[str], job: str, pid: int, host: str, start_time: float | None, now: str
) -> dict[str, Any]:
    """The content of one lease file (pure)."""
    return {
        "datasets": list(names),
        "job": str(job),
        "pid": int(pid),
        "host": str(host),
        "start_time": start_time,
        "since": now,
    }


def holders(
    name: str, records: Iterable[Mapping[str, Any]], alive: Callable[[Mapping[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The leases of ``records`` on dataset ``name`` whose holder is ``alive`` (pure)."""
    return [dict(r) for r in records if name in r.get("datasets", ()) and alive(r)]


def in_use_message(name: str, action: str, held: Sequence[Mapping[str, Any]]) -> str:
    """The error for ``action`` (``"drop"``, ``"overwrite"``) of a leased dataset (pure)."""
    jobs = "; ".join(
        f"{r['job']} (pid {r['pid']} on {r['host']}, since {r['since']})" for r in held
    )
    return (
        f"Cannot {action} dataset {name!r}: it is in use by {jobs}, whose trainers read it "
        f"from shared memory; a {action} now would let them read freed memory. Received: "
        f"{action} of {name!r} with force=False. Wait for that job to end (or stop it), or "
        f"pass force=True (`--force` on the command line) to {action} it anyway."
    )


def _directory(state_dir: str | os.PathLike[str] | None) -> pathlib.Path:
    root = pathlib.Path(state_dir).expanduser() if state_dir else config.state_dir()
    return root / LEASE_DIR


def _alive_here(record: Mapping[str, Any]) -> bool:
    """Whether a lease's holder runs (a lease of another host cannot be checked: held)."""
    if record.get("host") != socket.gethostname():
        return True
    pid = record.get("pid")
    return isinstance(pid, int) and pid > 0 and same_process(pid, record.get("start_time"))


def read_leases(state_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every live lease in the state directory; the files of dead holders are removed."""
    directory = _directory(state_dir)
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    found = []
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed right now
        if not isinstance(record, dict):
            continue
        if _alive_here(record):
            found.append(record)
        else:
            with contextlib.suppress(OSError):
                path.unlink()  # its holder was killed before it could remove it
    return found


@contextlib.contextmanager
def _locked(state_dir: str | os.PathLike[str] | None) -> Iterator[pathlib.Path]:
    """The lease directory, its lock held: a lease is written, or a check and the drop that
    follows it run, never both at once (a fit cannot lease a dataset being dropped)."""
    directory = _directory(state_dir)
    private_dir(directory, root=directory.parent)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield directory
    finally:
        os.close(fd)  # releases the lock


def check_not_leased(
    name: str, action: str, force: bool = False, state_dir: str | os.PathLike[str] | None = None
) -> None:
    """Raise :class:`DatasetInUseError` when a live job holds a lease on ``name``.

    ``force=True`` skips the check: the caller stops the job (or accepts what its readers
    read).
    """
    if force:
        return
    held = holders(name, read_leases(state_dir), lambda r: True)
    if held:
        raise DatasetInUseError(in_use_message(name, action, held))


@contextlib.contextmanager
def unleased(
    name: str, action: str, force: bool = False, state_dir: str | os.PathLike[str] | None = None
) -> Iterator[None]:
    """Check that ``name`` is not leased, and keep new leases out while the block runs.

    Wrap the step that frees a dataset's memory (a drop, the replacement of an overwrite):
    a job starting meanwhile waits for the block before it takes its lease, and then finds
    the dataset gone (or the new one).
    """
    if force:
        yield
        return
    with _locked(state_dir):
        check_not_leased(name, action, False, state_dir)
        yield


@contextlib.contextmanager
def holding(
    datasets: Iterable[Any], job: str, state_dir: str | os.PathLike[str] | None = None
) -> Iterator[list[str]]:
    """Hold a lease on ``datasets`` (names, Datasets; None is skipped) for the ``with`` block.

    Parameters
    ----------
    datasets : iterable
        What the job reads.
    job : str
        Who holds it, as the refusal names it (``"dvml.fit of model 'digits_cnn'"``).
    state_dir : path, optional
        Default: ``dvml.cluster.state-dir``.

    Yields
    ------
    list of str
        The names leased.
    """
    names = _names(datasets)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    pid = os.getpid()
    record = lease_record(names, job, pid, socket.gethostname(), process_start_time(pid), now)
    with _locked(state_dir) as directory:
        path = directory / f"{pid}-{uuid.uuid4().hex[:12]}.json"
        tmp = path.with_suffix(".tmp")
        with private_file(tmp) as f:
            json.dump(record, f)
        os.replace(tmp, path)  # a reader sees the whole lease or none
    try:
        yield names
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
