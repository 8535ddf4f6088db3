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
    "DistributionRules": "dvml.placement",
    "Dataset": "dvml.store.datasets",
    "training_preprocessor": "dvml.preprocess.api",
    "validation_preprocessor": "dvml.preprocess.api",
}

# public sub-namespaces, imported on first use: dvml.datasets.list(), ...
_MODULES: dict[str, str] = {
    "datasets": "dvml.store.datasets",
}

__all__ = sorted([*_EXPORTS, *_MODULES, "__version__"])

if TYPE_CHECKING:
    from dvml.cluster import Cluster, LocalCluster, WorkerInfo, connect, gpu_configuration
    from dvml.exceptions import DvmlError
    from dvml.placement import DistributionRules
    from dvml.preprocess.api import training_preprocessor, validation_preprocessor
    from dvml.store import datasets
    from dvml.store.datasets import Dataset


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'dvml' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
