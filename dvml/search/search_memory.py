"""The configurations that bound a model search's memory plan (Hyperband, hyperopt, ASHA).

A search draws its configurations as it runs, but its space is known before any trainer
starts: the architectures, the optimizers and the batch sizes it can draw. Its hopper job
(:class:`~dvml.train.hop_job.HopJob`) is planned on the space's *largest* points: one per
architecture and optimizer entry, each at the largest ``batch_size`` the space allows
(:func:`largest_points`), repeated up to the number of configurations the search trains
(every one is kept compiled in each trainer it visits): Hyperband's and hyperopt's count, and
ASHA's ``max_configs`` (the most trials it starts; a ``time_budget_s`` may stop it sooner).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from dvml.configs.search_space import Dimension, SearchSpace

if TYPE_CHECKING:
    from dvml.registry.database import Registry
    from dvml.train.runtime.plan import Job

__all__ = ["bounding_configs", "largest_points"]

_BATCH = "fit.batch_size"


class _Largest:
    """A draw of one architecture and optimizer entry, at the largest batch size."""

    def __init__(self, arch: int, optimizer: int) -> None:
        self.arch, self.optimizer = arch, optimizer

    def choice(self, dim: Dimension) -> int:
        if dim.name == "model_id":
            return self.arch
        if dim.name == "optimizer":
            return self.optimizer
        if dim.name == _BATCH:
            return max(range(len(dim.choices)), key=lambda i: float(dim.choices[i]))
        return 0

    def number(self, dim: Dimension) -> float:
        return dim.high if dim.name == _BATCH else dim.low


def largest_points(space: SearchSpace) -> list[tuple[int, str, str]]:
    """``(model_id, compile_params, fit_params)`` of one point per architecture and optimizer
    entry of ``space``, at its largest ``batch_size``. Pure."""
    dims = {d.name: d for d in space.dims}
    optimizers = len(dims["optimizer"].choices) if "optimizer" in dims else 1
    points = []
    for arch, opt in itertools.product(range(len(space.ids)), range(optimizers)):
        points.append(space.config(space.sample(_Largest(arch, opt))))
    return points


def bounding_configs(
    reg: Registry, space: SearchSpace, job: Job, count: int
) -> list[dict[str, Any]]:
    """The trainer configurations (``model_json``, parsed params) a search of ``count``
    configurations over ``space`` is planned by: :func:`largest_points`, repeated to
    ``count``."""
    from dvml.train.runtime.plan import model_spec

    specs = [
        model_spec(reg, model_id, compile_params, fit_params, job.train,
                   list(job.custom_sources)).config()
        for model_id, compile_params, fit_params in largest_points(space)
    ]  # fmt: skip
    return list(itertools.islice(itertools.cycle(specs), max(count, len(specs))))
