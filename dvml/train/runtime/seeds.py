"""The one seed function of every trainer (shuffles and initialisations from the job's seed)
and the data position: where a job's reading of its rows stands.

Kept apart from the planner: trainer processes import it, and it needs only numpy (and dvml's
errors).
"""

from __future__ import annotations

import numpy as np

from dvml.exceptions import ArgumentError

__all__ = ["data_position", "shuffle_seed"]


def shuffle_seed(seed: int, *, iteration: int = 0, model: int = 0, worker: int = 0) -> int:
    """The seed of one shuffle (or initialisation): of ``model`` on ``worker`` in ``iteration``.

    Independent streams for every combination, from the job's ``seed``
    (:class:`numpy.random.SeedSequence`, as :func:`dvml.placement.planner.partition_seed` does
    for the partitions), so no two trainers or models shuffle alike.
    """
    spawn_key = (int(iteration), int(model), int(worker))
    return int(np.random.SeedSequence(int(seed), spawn_key=spawn_key).generate_state(1)[0])


def data_position(iteration: int, epochs_per_iteration: int) -> dict[str, int]:
    """Where ``iteration`` (1-based) starts reading: the first epoch it trains.

    A trainer's batches of epoch ``e`` are a function of its seed and ``e`` alone
    (:class:`~dvml.resolve.batches.BatchPlan`), so this is all a resume needs: iteration ``i``
    trains epochs ``(i - 1) * E`` to ``i * E - 1`` of the job's one endless sequence of
    epochs, whether the job ran through or restarted before ``i``. Checkpoints record the
    position of the next iteration (``data_position``), so every epoch is trained once.
    """
    if iteration < 1 or epochs_per_iteration < 1:
        raise ArgumentError(
            "An iteration is numbered from 1 and trains at least one epoch. Received: "
            f"iteration={iteration}, epochs_per_iteration={epochs_per_iteration}. Pass the "
            "1-based iteration and fit_params' epochs."
        )
    return {"iteration": int(iteration), "epoch": (int(iteration) - 1) * int(epochs_per_iteration)}
