"""A Dask worker preload: a worker that loaded TensorFlow exits at once when it closes.

``evaluate``, ``predict`` and the feature cache run TensorFlow inside the worker processes.
At interpreter exit TensorFlow then spends ~3 s (more on a busy machine) tearing down its
modules and thread pools, after every ``atexit`` handler has run. The Nanny gives a closing
worker 4 s (``0.8`` of its 5 s close timeout), then logs "Worker process still alive after 4.0
seconds, killing" and SIGKILLs it: at :meth:`LocalCluster.close` in most runs that trained.

:func:`dask_setup` (run when the worker starts, before any TensorFlow import) registers one
``atexit`` handler. Handlers run last-registered first, so TensorFlow's own (its autograph
temporary files) have run by then; it runs the handlers registered before it (distributed's,
logging's, multiprocessing's), flushes stdout and stderr and leaves with ``os._exit``, skipping
only the slow teardown. A worker that never loaded TensorFlow exits normally.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

__all__ = ["PRELOAD", "dask_setup", "exit_without_teardown"]

PRELOAD = "dvml.cluster.worker_exit"
"""This module's name, as ``Nanny(preload=[...])`` takes it."""


def exit_without_teardown() -> None:
    """At exit: when TensorFlow is loaded, run the other handlers and leave with ``os._exit``."""
    if "tensorflow" not in sys.modules:
        return
    atexit.unregister(exit_without_teardown)
    atexit._run_exitfuncs()  # the handlers registered before this one, then none are left
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more can be written anyway
            pass
    os._exit(0)


def dask_setup(worker: Any) -> None:
    """Distributed's preload hook: register :func:`exit_without_teardown` once."""
    atexit.unregister(exit_without_teardown)  # a second preload must not register it twice
    atexit.register(exit_without_teardown)
