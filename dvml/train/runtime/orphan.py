"""A trainer exits when the worker that started it dies.

Trainers run in their own session (so that a launcher can stop the whole process group), so
nothing kills them when their Dask worker is killed: a trainer blocked in a collective op on
a lost peer would then live on, holding its port, memory and GPU, with no launcher left to
enforce its timeout. A daemon thread watches the parent pid instead.
"""

from __future__ import annotations

import os
import sys
import threading
import time

__all__ = ["EXIT_ORPHANED", "exit_with_parent"]

EXIT_ORPHANED = 75


def exit_with_parent(interval: float = 1.0) -> threading.Thread:
    """Start a daemon thread that ends this process when its parent process is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:  # re-parented: the launcher (the worker) died
                print(
                    f"dvml trainer {os.getpid()}: its worker (pid {parent}) died; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, name="dvml-exit-with-parent", daemon=True)
    thread.start()
    return thread
