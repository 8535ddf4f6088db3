"""Clusters: a LocalCluster that simulates several hosts, and attaching to a running cluster.

This package owns the processes (etcd, one vineyardd per worker, Dask scheduler and Nanny
workers), the worker ↔ vineyard instance mapping and the GPU inventory. It leaves placement to
:mod:`dvml.placement` and storage to :mod:`dvml.store`.
"""

from dvml.cluster.attach import Cluster, connect, current_client
from dvml.cluster.gpu import gpu_configuration
from dvml.cluster.local_cluster import LocalCluster
from dvml.cluster.workers import WorkerInfo

__all__ = [
    "Cluster",
    "LocalCluster",
    "WorkerInfo",
    "connect",
    "current_client",
    "gpu_configuration",
]
