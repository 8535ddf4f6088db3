"""What the packing benchmarks share about the cluster each of them starts."""

from __future__ import annotations

from typing import Any

__all__ = ["drop_and_close"]


def drop_and_close(cluster: Any, name: str) -> None:
    """A benchmark's cleanup: drop the dataset ``name`` if it exists, then close ``cluster``."""
    import dvml
    from dvml.exceptions import DatasetNotFoundError

    try:
        dvml.datasets.drop(name, client=cluster.client)
    except DatasetNotFoundError:
        pass
    finally:
        cluster.close()
