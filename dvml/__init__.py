"""dvml: Dask + Vineyard as one in-memory data and compute system for deep learning.

Dask graphs preprocess and pack data into vineyard objects placed on chosen workers;
TensorFlow MultiWorkerMirroredStrategy trainers read their local partitions zero-copy.

``import dvml`` is fast and has no side effects: every public name is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Cluster": "dvml.cluster",
    "LocalCluster": "dvml.cluster",
    "WorkerInfo": "dvml.cluster",
    "connect": "dvml.cluster",
    "gpu_configuration": "dvml.cluster",
    "DvmlError": "dvml.exceptions",
}

__all__ = sorted([*_EXPORTS, "__version__"])

if TYPE_CHECKING:
    from dvml.cluster import Cluster, LocalCluster, WorkerInfo, connect, gpu_configuration
    from dvml.exceptions import DvmlError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dvml' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
