"""A trainer exits when the worker that started it dies.

Trainers run in their own session (so that a launcher can stop the whole process group), so
nothing kills them when their Dask worker is killed: a trainer blocked in a collective op on
a lost peer would then live on, holding its port, memory and GPU, with no launcher left to
enforce its timeout. A daemon thread watches the parent pid instead (for a trainer forked by
its machine's zygote, :mod:`dvml.cluster.zygote`, the pid of the worker that asked for it).
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable

from dvml.cluster.zygote import PARENT_ENV

__all__ = ["EXIT_ORPHANED", "exit_with_parent"]

EXIT_ORPHANED = 75


def exit_with_parent(interval: float = 1.0) -> threading.Thread:
    """Start a daemon thread that ends this process when its worker is gone: its parent,
    or for a trainer forked by a zygote, the worker that asked for it (``PARENT_ENV``)."""
    requester = os.environ.get(PARENT_ENV)
    parent = int(requester) if requester else os.getppid()
    gone = _gone(parent) if requester else lambda: os.getppid() != parent

    def watch() -> None:
        while True:
            time.sleep(interval)
            if gone():  # re-parented, or the requester ended: the worker died
                print(
                    f"dvml trainer {os.getpid()}: its worker (pid {parent}) died; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, name="dvml-exit-with-parent", daemon=True)
    thread.start()
    return thread


def _gone(pid: int) -> Callable[[], bool]:
    """Whether process ``pid`` (not this one's parent) ended: its pidfd turns readable, so a
    recycled pid is not mistaken for it."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda: True
    except (AttributeError, OSError):  # no pidfd (before Linux 5.3): by pid
        return lambda: not os.path.exists(f"/proc/{pid}")
    return lambda: bool(select.select([fd], [], [], 0)[0])
