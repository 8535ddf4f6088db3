"""The one seed function of every trainer: shuffles and initialisations from the job's seed.

Kept apart from the planner: trainer processes import it, and it needs nothing but numpy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["shuffle_seed"]


def shuffle_seed(seed: int, *, iteration: int = 0, model: int = 0, worker: int = 0) -> int:
    """The seed of one shuffle (or initialisation): of ``model`` on ``worker`` in ``iteration``.

    Independent streams for every combination, from the job's ``seed``
    (:class:`numpy.random.SeedSequence`, as :func:`dvml.placement.planner.partition_seed` does
    for the partitions), so no two trainers or models shuffle alike.
    """
    spawn_key = (int(iteration), int(model), int(worker))
    return int(np.random.SeedSequence(int(seed), spawn_key=spawn_key).generate_state(1)[0])
