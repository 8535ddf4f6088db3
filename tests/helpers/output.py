"""What the Dask worker processes write to their fd 2 while a block of the test runs.

C++ libraries (vineyard's client, TensorFlow) write to fd 2 directly, past Python's
``sys.stderr`` and the workers' logging: only a redirect of the file descriptor itself, in
each worker process, catches them. The worker-side functions are module-level here so that
they pickle by reference.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["workers_stderr"]

_SAVED: dict[str, int] = {}  # on a worker: its own fd 2 while redirected


def _redirect_fd2(directory: str) -> str:
    """On a worker: send its fd 2 to a file of ``directory`` until :func:`_restore_fd2`."""
    path = os.path.join(directory, f"stderr-{os.getpid()}.txt")
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    _SAVED.setdefault("fd2", os.dup(2))
    os.dup2(fd, 2)
    os.close(fd)
    return path


def _restore_fd2() -> None:
    saved = _SAVED.pop("fd2", None)
    if saved is not None:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def workers_stderr(client: Any, directory: pathlib.Path) -> Iterator[Callable[[], str]]:
    """Redirect every worker's fd 2 into files of ``directory`` for the block.

    Yields a function that returns what they wrote so far (call it after the block, when the
    workers' fd 2 is theirs again).
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = client.run(_redirect_fd2, str(directory))
    try:
        yield lambda: "".join(pathlib.Path(p).read_text(errors="replace") for p in paths.values())
    finally:
        client.run(_restore_fd2, on_error="ignore")
