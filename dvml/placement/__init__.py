"""Placement: which workers hold a dataset, and which rows go into which buffer.

This package owns the distribution rules (MADlib's ``distribution_rules``: keywords, worker or
host lists, tables) and the pure planner that maps input partitions to packed buffers on the
target workers. It takes plain values (row counts, :class:`~dvml.cluster.WorkerInfo` lists) and
returns plain values; it never talks to Dask or vineyard. The memory plan of a pack
(:mod:`dvml.placement.memory`) is pure too: bytes per vineyardd against the room each reports.
Discovering workers is left to :mod:`dvml.cluster`, running the plan to :mod:`dvml.preprocess`.
"""

from dvml.placement.memory import MemoryPlan, PlanRow, VineyarddRoom, plan_pack
from dvml.placement.planner import (
    BufferPlan,
    Layout,
    PiecePlan,
    default_buffer_size,
    partition_seed,
    plan_layout,
    plan_pieces,
    split_partition,
)
from dvml.placement.rules import DistributionRules, describe_resolution, resolve_rules

__all__ = [
    "BufferPlan",
    "DistributionRules",
    "Layout",
    "MemoryPlan",
    "PiecePlan",
    "PlanRow",
    "VineyarddRoom",
    "default_buffer_size",
    "describe_resolution",
    "partition_seed",
    "plan_layout",
    "plan_pack",
    "plan_pieces",
    "resolve_rules",
    "split_partition",
]
