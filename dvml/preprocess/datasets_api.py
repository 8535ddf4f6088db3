"""Datasets as first-class objects: list, describe, version, append, exists, drop.

Every call runs small tasks on the workers (which own the vineyard instances); no tensor data
reaches the client. :func:`append` packs new rows as a dataset's next version over its old
buffers; :func:`rebalance` spreads a dataset onto workers that joined;
:func:`describe` (``version=``) and :func:`versions` read the versions
(:mod:`dvml.store.versions`).

(The catalog functions live in :mod:`dvml.store.datasets`; appending packs rows, the
preprocessor's job, so the public namespace ``dvml.datasets`` is gathered here, one layer up.)
"""

from __future__ import annotations

from dvml.preprocess.api import append
from dvml.preprocess.rebalance import rebalance
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
    "rebalance",
    "resolve_dataset",
    "run_on",
    "versions",
    "vineyard_workers",
]
