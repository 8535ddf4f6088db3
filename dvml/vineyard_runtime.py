"""``import vineyard`` for dvml's processes: without the subprocess vineyard runs at import.

Importing vineyard imports ``vineyard.deploy.ctl``, which runs the bundled ``vineyardctl``
binary (``vineyardctl -j``, its whole command line as JSON) to build a Python wrapper of it,
``vineyard.deploy.vineyardctl``. dvml never calls that wrapper, but every dvml process imports
vineyard: the client, each Dask worker, each trainer. The binary costs about 0.28 s of wall
time and as much CPU per process (measured: ``import vineyard`` 1.25 s against 0.98 s here),
which on a short job's two cores is part of its fixed costs (issue 29, B20).

:func:`import_vineyard` imports vineyard with a placeholder for ``vineyard.deploy.ctl`` whose
``vineyardctl`` builds the real wrapper on first use, and whose other attributes load the
real module: the same behaviour, paid only by the process that uses it. When vineyard is
already imported (by the user's code), it is returned as it is.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

__all__ = ["import_vineyard"]

_CTL = "vineyard.deploy.ctl"
_LOCK = threading.RLock()


def import_vineyard() -> Any:
    """The ``vineyard`` module, imported without running ``vineyardctl`` (see the module)."""
    module = sys.modules.get("vineyard")
    if module is not None:
        return module
    with _LOCK:
        if "vineyard" not in sys.modules and _CTL not in sys.modules:
            sys.modules[_CTL] = _LazyCtl(_CTL)
        return importlib.import_module("vineyard")


def _real_ctl() -> types.ModuleType:
    """Import the real ``vineyard.deploy.ctl`` in place of the placeholder (once)."""
    with _LOCK:
        current = sys.modules.get(_CTL)
        if isinstance(current, _LazyCtl):
            del sys.modules[_CTL]
            real = importlib.import_module(_CTL)
            real._register()
            deploy = sys.modules["vineyard.deploy"]
            deploy.ctl = real  # type: ignore[attr-defined]
            deploy.vineyardctl = real.vineyardctl  # type: ignore[attr-defined]
            return real
        return sys.modules[_CTL]


class _LazyCommand:
    """``vineyard.deploy.vineyardctl`` until it is used: calling it, or reading one of its
    subcommands (``vineyardctl.deploy. ...``), builds the real wrapper and goes to it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _real_ctl().vineyardctl(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if _is_dunder(name):
            raise AttributeError(name)
        return getattr(_real_ctl().vineyardctl, name)

    def __repr__(self) -> str:
        return "<vineyardctl wrapper, built on first use (dvml.vineyard_runtime)>"


class _LazyCtl(types.ModuleType):
    """The placeholder: what ``vineyard.deploy`` reads at import, without the subprocess."""

    vineyardctl = _LazyCommand()

    @staticmethod
    def _register() -> None:
        """vineyard.deploy calls it at import; the real one runs on first use."""

    def __getattr__(self, name: str) -> Any:  # anything else: the real module's
        if _is_dunder(name):
            raise AttributeError(name)
        return getattr(_real_ctl(), name)


def _is_dunder(name: str) -> bool:
    """Probes of a module's or object's dunders (``inspect.getmodule`` reads every module's
    ``__file__``; pickling and copying look for theirs) must not build the wrapper."""
    return name.startswith("__") and name.endswith("__")
