"""User code shipped to the trainers as cloudpickle bytes (as Dask ships tasks)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["pickle_by_value"]

# Modules every trainer imports itself: pickled by reference.
_INSTALLED = ("__main__", "builtins", "dvml", "tensorflow", "tf_keras")


def pickle_by_value(fn: Callable[..., Any]) -> bytes:
    """``fn`` as cloudpickle bytes, BY VALUE with the rest of its module: the trainers cannot
    import a test module, a script or a package that is only on the client."""
    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    top = module.__name__.split(".")[0] if module is not None else "builtins"
    by_value = top not in _INSTALLED
    if module is not None and by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps(fn))
    finally:
        if module is not None and by_value:
            cloudpickle.unregister_pickle_by_value(module)
