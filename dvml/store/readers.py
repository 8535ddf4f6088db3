"""Objects that readers in this process hold views of, and deletes deferred until they let go.

A reader (evaluate, predict, the feature cache) maps a dataset's tensors from the local
vineyardd and works on zero-copy views. A drop or an overwrite of that dataset in the same
worker process (another task thread) deletes the tensors through the process's one shared
vineyard connection; vineyardd then frees their blobs at once and hands the memory to the next
object, and the reader would read freed memory, then another dataset's bytes. So a reader pins
the ids it maps (:func:`pin`), a delete of a pinned id is deferred (:func:`split_pinned`), and
the last reader to let go (:func:`unpin`) gets the ids whose delete is now due. Readers keep
seeing the old data; its memory is freed when the last of them closes.

Only readers in THIS process are known here: a trainer process (a fit) that reads a dataset
while a worker drops it is not protected (README, "Safety").
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

__all__ = ["pin", "split_pinned", "unpin"]

_lock = threading.Lock()
_readers: Counter[int] = Counter()
_deferred: set[int] = set()


def pin(ids: Iterable[int]) -> list[int]:
    """Count one more reader of each of ``ids``; return them, to pass to :func:`unpin`."""
    pinned = [int(i) for i in ids]
    with _lock:
        _readers.update(pinned)
    return pinned


def unpin(ids: Iterable[int]) -> list[int]:
    """Count one reader less of each of ``ids``; return those whose deferred delete is due."""
    due = []
    with _lock:
        for i in ids:
            _readers[i] -= 1
            if _readers[i] <= 0:
                del _readers[i]
                if i in _deferred:
                    _deferred.discard(i)
                    due.append(i)
    return due


def split_pinned(ids: Iterable[int]) -> tuple[list[int], list[int]]:
    """Split ``ids`` into those free to delete now and those that readers hold (deferred).

    The held ones are remembered: :func:`unpin` returns them once their last reader is gone.
    """
    now, later = [], []
    with _lock:
        for raw in ids:
            i = int(raw)
            if _readers[i] > 0:
                _deferred.add(i)
                later.append(i)
            else:
                _readers.pop(i, None)  # the Counter lookup above may have added a zero
                now.append(i)
    return now, later
