"""GPU inventory in the spirit of MADlib's ``gpu_configuration``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dvml.cluster.workers import discover_workers, gpu_index

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

__all__ = ["gpu_configuration"]

COLUMNS = ["hostname", "worker", "worker_name", "gpu_index", "gpu_descr"]


def gpu_configuration(client: Client | None = None) -> pd.DataFrame:
    """One row per GPU of the cluster: host, worker and description.

    Real GPUs are found on each worker with ``nvidia-smi -L`` (no GPU memory is taken);
    GPUs declared for a simulated :class:`~dvml.LocalCluster` are reported as declared.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster to inspect; the default client when None.

    Returns
    -------
    pandas.DataFrame
        Columns ``hostname, worker, worker_name, gpu_index, gpu_descr``; empty (with those
        columns) on a cluster without GPUs.
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for info in discover_workers(client):
        for i, descr in enumerate(info.gpus):
            rows.append(
                {
                    "hostname": info.host,
                    "worker": info.address,
                    "worker_name": info.name,
                    "gpu_index": gpu_index(descr) if gpu_index(descr) is not None else i,
                    "gpu_descr": descr,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)
