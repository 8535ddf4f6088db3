"""Reading a dataset's LOCAL partitions in a trainer: shared-memory views and tf.data.

This package owns resolving buffers through the local vineyardd's IPC socket (never fetching
remote blobs) and feeding them to TensorFlow one batch at a time. Training itself is
:mod:`dvml.train`'s job.
"""

from dvml.resolve.batches import BatchPlan, steps_per_epoch
from dvml.resolve.by_id import read_buffer
from dvml.resolve.partitions import LocalPartitions, open_local

__all__ = ["BatchPlan", "LocalPartitions", "open_local", "read_buffer", "steps_per_epoch"]
