"""``dvml.tf_dataset``: this worker's LOCAL rows of a packed dataset as a ``tf.data.Dataset``.

The public read for tools that launch their own processes: the same zero-copy pipeline the
trainers use (:mod:`dvml.resolve.tfdata`), on the buffers of the dataset that this worker's
vineyardd holds. It must run where the data is: in a ``dvml.run`` trainer, a Dask task pinned
to a worker that holds buffers (``client.submit(fn, workers=[address])``), or any process
started on such a host with ``VINEYARD_IPC_SOCKET`` set to that worker's vineyardd socket.
"""

from __future__ import annotations

from typing import Any

from dvml.exceptions import DataError
from dvml.resolve.partitions import open_local
from dvml.resolve.tfdata import evaluation_dataset, training_dataset

__all__ = ["tf_dataset"]


def tf_dataset(
    name: str, batch_size: int = 32, *, shuffle: bool = True, repeat: bool = True, seed: int = 0
) -> Any:
    """This worker's local rows of dataset ``name`` as ``(x, y)`` batches, zero-copy.

    Parameters
    ----------
    name : str
        A dataset packed by :func:`dvml.training_preprocessor` (or a feature cache).
    batch_size : int
        Rows per batch (one copy per batch out of shared memory; never of the dataset).
    shuffle : bool
        Reshuffle the rows every epoch, from ``seed``.
    repeat : bool
        True: endless, ``local rows // batch_size`` batches per epoch (take as many steps as
        you need: with several trainers, the same number on each). False: every local row
        once, in order (evaluation).
    seed : int
        The shuffle's seed.

    Returns
    -------
    tf.data.Dataset
        ``(x, y)`` batches read from this worker's shared memory.

    Raises
    ------
    DataError
        This worker holds no rows of ``name`` (run it where the data is).
    """
    parts = open_local(name, require=False)
    if parts.rows == 0:
        parts.close()
        raise DataError(
            f"This process's vineyardd holds no rows of dataset {name!r}. Received: a worker "
            "without its buffers. Call dvml.tf_dataset in a task pinned to a worker that holds "
            "them (dvml.datasets.describe(name).layout lists them), or in a dvml.run trainer."
        )
    if not repeat:
        return evaluation_dataset(parts, batch_size)
    steps = max(1, parts.rows // batch_size)
    return training_dataset(parts, batch_size, steps, seed, shuffle)
