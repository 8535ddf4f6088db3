"""Name the missing ``if __name__ == "__main__":`` guard when a script starts a LocalCluster.

Dask starts every worker (a Nanny's process) with multiprocessing's *spawn* method, which
re-runs the user's main script in the new process under the name ``__mp_main__``. A script
that creates a ``LocalCluster`` at module level, unguarded, then starts a second cluster inside
every worker process, and Dask only reports "Nanny failed to start". These checks say what is
really wrong instead: :func:`refuse_in_spawned_import` in the worker process (before it starts
any daemon) and :func:`unguarded_main_hint` in the user's process, for the start error.
"""

from __future__ import annotations

import multiprocessing
import re
import sys

from dvml.exceptions import ClusterStartError

__all__ = ["refuse_in_spawned_import", "unguarded_main_hint"]

_GUARD = re.compile(r"""^\s*if\s+__name__\s*==\s*["']__main__["']\s*:""", re.MULTILINE)
_ADVICE = (
    'Put the code that starts the cluster under `if __name__ == "__main__":` (or in a function '
    "called from there): Dask starts each worker process by re-running the main script, as "
    "Python's multiprocessing 'spawn' start method does."
)


def refuse_in_spawned_import() -> None:
    """Refuse to start a cluster while a spawned process re-runs the main script.

    Raises
    ------
    ClusterStartError
        When called during multiprocessing's import of the parent's main module.
    """
    if "__mp_main__" in sys.modules and multiprocessing.current_process().name != "MainProcess":
        raise ClusterStartError(
            "dvml.LocalCluster() was called while a Dask worker process was re-running your "
            f"script {_main_file() or '(the main module)'} to start (its module-level code "
            f"ran again). {_ADVICE}"
        )


def unguarded_main_hint() -> str:
    """A sentence naming the missing guard when the main script has none, else ``""``."""
    path = _main_file()
    if path is None:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError:
        return ""
    if _GUARD.search(source):
        return ""
    return f' Your script {path} has no `if __name__ == "__main__":` guard. {_ADVICE}'


def _main_file() -> str | None:
    """The main script's path (None in a notebook, a REPL or ``python -c``)."""
    # In a spawned process re-running the script, the script is "__mp_main__".
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return str(path) if path and str(path).endswith(".py") else None
