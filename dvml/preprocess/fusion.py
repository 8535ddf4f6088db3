"""One task per source partition: the prepare step fused with the source's own tasks.

A pack prepares every partition of a Dask collection (read, decode, validate). Built as a
separate layer on top of the source, that is one prepare task per partition plus the source's
tasks for it (for a dict of arrays: one for x, one for y), each scheduled on its own, and half
of the prepare tasks fetch a block from the other worker first. At hundreds of small partitions
that per-task cost is most of the pack (issue 17: ~2 ms a task on two workers). Here each
prepare task absorbs the source tasks that only it needs, so a partition is read and prepared
in one task, where it is read, with nothing moved between workers. Source tasks that several
partitions share (a rechunk input, a common parameter) stay tasks of their own. Where the
partitions' sizes are known (Dask arrays) and small, one task prepares several consecutive
partitions (:func:`~dvml.placement.routes.batch_sizes`), so the pack's cost grows with the
bytes, not with the partitions; each stays a partition of its own (its rows, its seed).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentError

__all__ = ["exclusive_ancestors", "one_task_per_block"]

_SHARED = -1


def exclusive_ancestors(
    dependencies: Mapping[Hashable, Collection[Hashable]], outputs: Sequence[Hashable]
) -> list[list[Hashable]]:
    """For each output, the keys it depends on (transitively) that no other output needs.

    Parameters
    ----------
    dependencies
        Each key of the graph and the keys it depends on. A dependency that is not a key of
        the mapping (a future, a key computed elsewhere) is never fused.
    outputs
        The keys to fuse into, one per partition.

    Returns
    -------
    list of list
        For each output in order, its exclusive ancestors, each after the keys it depends on
        (an execution order). Keys that several outputs need, and keys that no output needs,
        are in none of the lists.
    """
    position = {key: i for i, key in enumerate(outputs)}
    # The part of the graph the outputs need, and each key's dependents within it.
    pending: dict[Hashable, int] = {}
    stack = list(outputs)
    seen = set(outputs)
    while stack:
        key = stack.pop()
        for dep in dependencies.get(key, ()):
            if dep not in dependencies:
                continue
            pending[dep] = pending.get(dep, 0) + 1
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    # Walk from the outputs towards the roots; a key is visited once all its dependents
    # were, so its owner (the one output that needs it, or _SHARED) is final by then.
    owner: dict[Hashable, int] = dict(position)
    ready = [key for key in outputs if not pending.get(key)]
    visited: list[Hashable] = []
    while ready:
        key = ready.pop()
        visited.append(key)
        for dep in dependencies.get(key, ()):
            if dep not in dependencies:
                continue
            previous = owner.get(dep)
            owner[dep] = owner[key] if previous is None or previous == owner[key] else _SHARED
            pending[dep] -= 1
            if pending[dep] == 0:
                ready.append(dep)
    members: list[list[Hashable]] = [[] for _ in outputs]
    for key in reversed(visited):  # dependencies before their dependents
        index = owner[key]
        if index != _SHARED and key not in position:
            members[index].append(key)
    return members


def one_task_per_block(
    name: str, fn: Any, blocks: Sequence[Sequence[Any]], sizes: Sequence[int] | None = None
) -> list[Any]:
    """``fn`` of every block, one task per batch of blocks, with their exclusive sources.

    ``blocks[i]`` are Delayed objects of the source (``to_delayed()``), as many for every
    block; ``fn`` takes their values positionally. ``sizes``
    (:func:`~dvml.placement.routes.batch_sizes`; default: one block each) cuts the blocks
    into batches of consecutive blocks. Each returned Delayed is ONE task that computes its
    batch's exclusive source tasks (:func:`exclusive_ancestors`) and returns
    ``[fn(*blocks[i]) for i in the batch]`` (:func:`~dvml.preprocess.tasks.prepare_batch`).

    ``delayed(fn)(block)`` would also merge and cull the whole source graph once per call:
    quadratic in the partitions (seconds at 500 partitions). Here the source graph is merged
    and materialized once.
    """
    # dask._task_spec is private, but the graph format of every dask in our pin (>=2026.1).
    from dask._task_spec import Task, TaskRef, convert_legacy_graph
    from dask.base import tokenize
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    from dvml.preprocess.tasks import prepare_batch

    sizes = [1] * len(blocks) if sizes is None else list(sizes)
    arity = {len(row) for row in blocks}
    if sum(sizes) != len(blocks) or min(sizes, default=1) < 1 or len(arity) > 1:
        raise ArgumentError(
            f"Every block needs as many inputs and the batch sizes must be positive and add up "
            f"to the {len(blocks)} blocks. Received: sizes={sizes}, inputs per block {arity}."
        )
    # Not pure, as delayed() is not by default: a second run computes its parts afresh.
    layer = f"{name}-{tokenize(fn, [[b.key for b in row] for row in blocks], uuid.uuid4())}"
    sources = {id(b.dask): b for row in blocks for b in row}
    graph = convert_legacy_graph(dict(HighLevelGraph.merge(*(b.dask for b in sources.values()))))
    outputs = [(layer, i) for i in range(len(sizes))]
    first = 0
    for key, size in zip(outputs, sizes, strict=True):
        refs = [TaskRef(b.key) for row in blocks[first : first + size] for b in row]
        graph[key] = Task(key, prepare_batch, fn, len(blocks[0]), *refs)
        first += size
    fused = exclusive_ancestors({k: t.dependencies for k, t in graph.items()}, outputs)
    tasks = dict(graph)
    for key, members in zip(outputs, fused, strict=True):
        for member in members:
            del tasks[member]
        tasks[key] = Task.fuse(*(graph[m] for m in members), graph[key], key=key)
    # One HighLevelGraph for all: dask copies a plain dict graph per Delayed it computes (and
    # ships every copy), but an HLG's layers are shared.
    needed = HighLevelGraph({layer: _needed(tasks, outputs)}, {layer: set()})  # type: ignore[dict-item]
    return [Delayed(key, needed, layer=layer) for key in outputs]


def _needed(tasks: dict[Hashable, Any], outputs: Sequence[Hashable]) -> dict[Hashable, Any]:
    """The tasks the outputs need (the merged source may hold others: its other columns)."""
    out: dict[Hashable, Any] = {}
    stack = list(outputs)
    while stack:
        key = stack.pop()
        if key in out or key not in tasks:
            continue
        out[key] = tasks[key]
        stack.extend(tasks[key].dependencies)
    return out
