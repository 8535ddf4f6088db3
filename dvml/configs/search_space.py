"""MADlib's grids as a search space that a sampler draws one configuration at a time from.

The grids are MADlib's (:mod:`dvml.configs.grids` reads and checks them, with the messages
``model_configs`` shows): ``compile_params_grid`` with ``optimizer_params_list`` (a list of
dicts, each naming ``'optimizer'`` classes and that optimizer's arguments) and
``fit_params_grid``; a value
is a list of choices or a range ``[low, high, 'linear' | 'log' | 'log_near_one']``. The space is
a flat list of :class:`Dimension` s:

- ``model_id``: which architecture (an index into the sorted ids);
- ``compile.<key>`` and ``fit.<key>``: a choice (an index into the list) or a number;
- ``optimizer``: which dict of ``optimizer_params_list`` (an index), and for dict ``k`` its
  arguments ``optimizer.<k>.<arg>``, which exist only when ``optimizer`` is ``k`` (a
  conditional dimension: TPE learns each optimizer's arguments apart).

A sampler fills the dimensions through a :class:`Draw` (random, or Optuna's trial for TPE) and
:meth:`SearchSpace.config` turns the values into canonical MADlib strings, parsed as a trainer
would. The one engine of every draw: ``model_configs(search="random")``, Hyperband, hyperopt and
ASHA all draw through :meth:`SearchSpace.sample` (a seeded :class:`RandomDraw` draws what
``model_configs``' random search drew before the two were one). The values are plain JSON
(indices and numbers), so a journal can hold them. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from dvml.configs.grids import (
    DISTRIBUTIONS,
    INT_KEYS,
    OPTIMIZER_PARAMS_LIST,
    check_distributions,
    choice_value,
    grid_size,
    has_distribution,
    optimizer_choice,
    parse_grids,
    rounded,
)
from dvml.configs.model_config import ConfigTable, ModelConfig, canonical_texts, check_arch_ids
from dvml.exceptions import ArgumentError

__all__ = ["Dimension", "Draw", "RandomDraw", "SearchSpace"]


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One parameter of the space: a choice among ``choices`` or a number in a range."""

    name: str
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    distribution: str | None = None
    """``'linear'``, ``'log'`` or ``'log_near_one'`` for a number; None for a choice."""
    integer: bool = False
    parent: tuple[str, int] | None = None
    """``(dimension, index)``: this one exists only when that choice was made."""

    @property
    def is_choice(self) -> bool:
        return self.distribution is None


class Draw(Protocol):
    """What a sampler gives the space: a choice index, or a number of a range dimension."""

    def choice(self, dim: Dimension) -> int: ...

    def number(self, dim: Dimension) -> float: ...


class RandomDraw:
    """Uniform choices, and numbers uniform in the range's own scale (log, or log of 1 - x)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choice(self, dim: Dimension) -> int:
        return self.rng.randrange(len(dim.choices))

    def number(self, dim: Dimension) -> float:
        low, high = dim.low, dim.high
        if dim.distribution == "linear":
            return self.rng.uniform(low, high)
        if dim.distribution == "log":
            return 10 ** self.rng.uniform(math.log10(low), math.log10(high))
        # log_near_one: values crowd towards 1 (momentum, beta_1, ...)
        return 1.0 - 10 ** self.rng.uniform(math.log10(1.0 - high), math.log10(1.0 - low))


def _is_range(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[-1], str)
        and value[-1] in DISTRIBUTIONS
        and all(isinstance(c, int | float) and not isinstance(c, bool) for c in value[:-1])
    )


def _dimension(name: str, key: str, values: list[Any], parent: tuple[str, int] | None) -> Dimension:
    if _is_range(values):
        return Dimension(
            name,
            low=float(values[0]),
            high=float(values[1]),
            distribution=values[2],
            integer=key in INT_KEYS,
            parent=parent,
        )
    return Dimension(name, choices=tuple(values), parent=parent)


class SearchSpace:
    """The configurations MADlib's grids describe, drawn one at a time.

    Parameters
    ----------
    arch_ids : int or list of int
    compile_params_grid, fit_params_grid : dict, str or None
        MADlib's grids (see :func:`dvml.configs.config_plans.plan_configs`); ranges allowed.
    custom_names : collection of str
        Custom loss/metric names the configurations may use.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        On a malformed grid or range, as :func:`~dvml.configs.config_plans.plan_configs` raises.
    """

    def __init__(
        self,
        arch_ids: int | Sequence[int],
        compile_params_grid: str | Mapping[str, Any] | None,
        fit_params_grid: str | Mapping[str, Any] | None,
        custom_names: Collection[str] = (),
    ) -> None:
        ids = check_arch_ids(arch_ids)
        compile_grid, fit_grid = parse_grids(compile_params_grid, fit_params_grid)
        check_distributions(compile_grid, fit_grid)
        self._setup(ids, compile_grid, fit_grid, frozenset(custom_names))
        # One draw proves that a configuration parses (a grid without a loss fails here).
        self.config(self.sample(RandomDraw(random.Random(0))))

    @classmethod
    def checked(
        cls,
        ids: list[int],
        compile_grid: dict[str, list[Any]],
        fit_grid: dict[str, list[Any]],
        custom_names: Collection[str],
    ) -> SearchSpace:
        """The space of grids already read and checked (:func:`~dvml.configs.grids.parse_grids`,
        :func:`~dvml.configs.grids.check_distributions`), without a proving draw."""
        space = cls.__new__(cls)
        space._setup(ids, compile_grid, fit_grid, frozenset(custom_names))
        return space

    def _setup(
        self,
        ids: list[int],
        compile_grid: dict[str, list[Any]],
        fit_grid: dict[str, list[Any]],
        custom_names: frozenset[str],
    ) -> None:
        self.ids = ids
        self.custom_names = custom_names
        self.compile_grid = compile_grid
        self.fit_grid = fit_grid
        dims = [Dimension("model_id", choices=tuple(self.ids))]
        for key, values in self.compile_grid.items():
            if key == OPTIMIZER_PARAMS_LIST:
                dims.append(Dimension("optimizer", choices=tuple(range(len(values)))))
                for k, entry in enumerate(values):
                    for arg, choices in entry.items():
                        dims.append(
                            _dimension(f"optimizer.{k}.{arg}", arg, choices, ("optimizer", k))
                        )
            else:
                dims.append(_dimension(f"compile.{key}", key, values, None))
        for key, values in self.fit_grid.items():
            dims.append(_dimension(f"fit.{key}", key, values, None))
        self.dims: tuple[Dimension, ...] = tuple(dims)
        self._by_name = {d.name: d for d in self.dims}

    def grids(self) -> dict[str, Any]:
        """The space as plain values (for a journal's header)."""
        return {
            "arch_ids": list(self.ids),
            "compile_params_grid": self.compile_grid,
            "fit_params_grid": self.fit_grid,
            "custom_names": sorted(self.custom_names),
        }

    def header(self) -> dict[str, Any]:
        """The space for a journal's header: the grids as JSON text, so that their keys keep
        the order they were given in (the journal's JSON sorts the keys of its dicts, and the
        order of the keys is the order of the dimensions, hence of the draws)."""
        g = self.grids()
        for key in ("compile_params_grid", "fit_params_grid"):
            g[key] = json.dumps(g[key])
        return g

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> SearchSpace:
        """The space :meth:`header` wrote (grids as dicts are taken as they are)."""
        g = dict(header)
        for key in ("compile_params_grid", "fit_params_grid"):
            if isinstance(g.get(key), str) and g[key].lstrip().startswith(("{", "null")):
                g[key] = json.loads(g[key])
        return cls(**g)

    def sample(self, draw: Draw) -> dict[str, Any]:
        """One point: dimension name → choice index or number (active dimensions only)."""
        values: dict[str, Any] = {}
        for dim in self.dims:
            if dim.parent is not None and values.get(dim.parent[0]) != dim.parent[1]:
                continue
            if dim.is_choice:
                values[dim.name] = int(draw.choice(dim))
            else:
                values[dim.name] = self._number(dim, draw.number(dim))
        return values

    @staticmethod
    def _number(dim: Dimension, value: float) -> float | int:
        if dim.integer:
            return int(min(max(round(value), math.ceil(dim.low)), math.floor(dim.high)))
        return min(max(rounded(value), dim.low), dim.high)

    def _value(self, name: str, values: Mapping[str, Any]) -> Any:
        dim = self._by_name[name]
        value = values[name]
        return dim.choices[value] if dim.is_choice else value

    def config(self, values: Mapping[str, Any]) -> tuple[int, str, str]:
        """``(model_id, compile_params, fit_params)`` of a point, in canonical MADlib strings.

        Raises
        ------
        ArgumentError
            When the point misses a dimension, or its parameters are refused by the parser.
        """
        missing = [
            d.name
            for d in self.dims
            if d.name not in values and (d.parent is None or values.get(d.parent[0]) == d.parent[1])
        ]
        if missing:
            raise ArgumentError(
                f"A configuration misses the parameters {missing}. Received: {dict(values)!r:.200}"
                ". Draw it with SearchSpace.sample()."
            )
        model_id = int(self._value("model_id", values))
        compile_raw: dict[str, Any] = {}
        for key in self.compile_grid:
            if key == OPTIMIZER_PARAMS_LIST:
                k = values["optimizer"]
                choice = {
                    arg: self._value(f"optimizer.{k}.{arg}", values)
                    for arg in self.compile_grid[key][k]
                }
                compile_raw["optimizer"] = optimizer_choice(choice)
            else:
                compile_raw[key] = choice_value(key, self._value(f"compile.{key}", values))
        fit_raw = {key: self._value(f"fit.{key}", values) for key in self.fit_grid}
        return model_id, *canonical_texts(compile_raw, fit_raw, self.custom_names)

    def distinct_configs(self, num_configs: int, seed: int | None) -> list[ModelConfig]:
        """``num_configs`` distinct configurations drawn with a seeded :class:`RandomDraw`,
        ``mst_key`` from 1 (``model_configs(search="random")`` and Hyperband's brackets).

        Raises
        ------
        ArgumentError
            When the space (without ranges) holds fewer configurations, or the draws find too
            few distinct ones.
        """
        if not has_distribution(self.compile_grid) and not has_distribution(self.fit_grid):
            size = len(self.ids) * grid_size(self.compile_grid) * grid_size(self.fit_grid)
            if num_configs > size:
                raise ArgumentError(
                    f"Random search cannot draw {num_configs} distinct configurations from "
                    f"{size} possible ones. Received: num_configs={num_configs}. Ask for at "
                    f"most {size}, use search='grid', or give a distribution [low, high, 'log']."
                )
        draw = RandomDraw(random.Random(seed))
        table = ConfigTable()
        draws = 0
        limit = 50 * num_configs + 100  # duplicates of a small discrete space are drawn again
        while len(table.rows) < num_configs and draws < limit:
            draws += 1
            table.add(*self.config(self.sample(draw)))
        if len(table.rows) < num_configs:
            raise ArgumentError(
                f"Random search found only {len(table.rows)} distinct configurations in {draws} "
                f"draws. Received: num_configs={num_configs}. Ask for fewer, or widen the grids."
            )
        return table.configs()
