"""Clusters: a LocalCluster that simulates several hosts, and attaching to a running cluster.

This package owns the processes (etcd, one vineyardd per worker, Dask scheduler and Nanny
workers), the worker ↔ vineyard instance mapping and the GPU inventory, and who may reach them:
Dask TLS (:mod:`dvml.cluster.security`) and etcd in a private network namespace
(:mod:`dvml.cluster.isolation`). It leaves placement to :mod:`dvml.placement` and storage to
:mod:`dvml.store`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dvml.cluster.attach import Cluster, connect
    from dvml.cluster.gpu import gpu_configuration
    from dvml.cluster.local_cluster import LocalCluster
    from dvml.cluster.workers import WorkerInfo, current_client

# Imported on first use, like dvml's own names: a trainer process imports
# dvml.cluster.connection and must not pay for LocalCluster, dask.config and the rest.
_EXPORTS: dict[str, str] = {
    "Cluster": "dvml.cluster.attach",
    "LocalCluster": "dvml.cluster.local_cluster",
    "WorkerInfo": "dvml.cluster.workers",
    "connect": "dvml.cluster.attach",
    "current_client": "dvml.cluster.workers",
    "gpu_configuration": "dvml.cluster.gpu",
}

__all__ = [
    "Cluster",
    "LocalCluster",
    "WorkerInfo",
    "connect",
    "current_client",
    "gpu_configuration",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dvml.cluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
