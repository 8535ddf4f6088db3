"""``dvml.datasets``: the catalog functions of :mod:`dvml.store.datasets` and :func:`append`.

The store layer lists, describes and drops datasets; appending rows packs them, which is the
preprocessor's job, so the public namespace is gathered here, one layer up.
"""

from __future__ import annotations

from dvml.preprocess.api import append
from dvml.store.datasets import (
    Dataset,
    buffer_workers,
    describe,
    drop,
    exists,
    list,
    lost_buffers,
    resolve_dataset,
    run_on,
    versions,
    vineyard_workers,
)

__all__ = [
    "Dataset",
    "append",
    "buffer_workers",
    "describe",
    "drop",
    "exists",
    "list",
    "lost_buffers",
    "resolve_dataset",
    "run_on",
    "versions",
    "vineyard_workers",
]
