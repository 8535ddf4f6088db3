"""Model configurations from grids and lists: MADlib's ``generate_model_configs`` and
``load_model_selection_table``, pure.

:func:`plan_configs` searches the grids (:mod:`dvml.configs.grids`) exhaustively
(``search="grid"``) or draws ``num_configs`` distinct configurations from them
(``search="random"``, with the search space's own draws, :mod:`dvml.configs.search_space`,
those of Hyperband, hyperopt and ASHA); :func:`cross_configs` takes every combination of lists
of parameter strings. Strings generated from grids are written in canonical form (``lr``
becomes ``learning_rate``); strings a user wrote are kept as written. Duplicates, parameters
equal once parsed whatever their key order, are dropped. Plain values in, plain values out: no
registry, no TensorFlow; :mod:`dvml.train.model_selection` stores the rows.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dvml.configs.fit_params import parse_fit_params
from dvml.configs.grids import (
    MAX_CONFIGS,
    SEARCHES,
    check_distributions,
    grid_axes,
    grid_size,
    merged,
    parse_grids,
    refuse_distributions,
)
from dvml.configs.model_config import (
    ConfigTable,
    ModelConfig,
    canonical_texts,
    check_arch_ids,
    kept_texts,
    refused,
)
from dvml.configs.param_text import format_params, params_key, params_text
from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError, ArgumentTypeError, ParameterError

__all__ = ["cross_configs", "plan_configs"]


def plan_configs(
    arch_ids: int | Sequence[int],
    compile_params_grid: str | Mapping[str, Any] | None,
    fit_params_grid: str | Mapping[str, Any] | None,
    search: str = "grid",
    num_configs: int | None = None,
    seed: int | None = None,
    custom_names: Collection[str] = (),
) -> list[ModelConfig]:
    """The configurations of MADlib's ``generate_model_configs``.

    Parameters
    ----------
    arch_ids : int or list of int
        Architecture ids (sorted, duplicates dropped).
    compile_params_grid, fit_params_grid : dict, str or None
        Parameter name → list of choices (see :func:`parse_grid`). In the compile grid,
        ``optimizer_params_list`` is a list of dicts, each naming ``'optimizer'`` class(es) and
        that optimizer's arguments: ``[{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}]``. A
        ``metrics`` choice is a metric name (a list of one) or a list of metrics. For random
        search a numeric choice may be a distribution ``[low, high, 'linear' | 'log' |
        'log_near_one']``; integer parameters (``batch_size``, ``epochs``, ...) then get
        integers, other samples keep 6 significant digits.
    search : {"grid", "random"}
        Every combination (architecture, then compile, then fit choices; the last key varies
        fastest), or ``num_configs`` distinct samples.
    num_configs : int, optional
        Random search only: how many configurations (required there).
    seed : int, optional
        Random search only: the same seed gives the same configurations.
    custom_names : collection of str
        Custom loss/metric names the configurations may use (see
        :func:`dvml.configs.compile_params.parse_compile_params`).

    Returns
    -------
    list of ModelConfig
        ``mst_key`` from 1; parameters in canonical form; no duplicates.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        On a malformed grid, a distribution in a grid search, too many configurations, or a
        configuration the parameter parser refuses (naming it and the grid it came from).
    """
    ids = check_arch_ids(arch_ids)
    if search not in SEARCHES:
        raise ArgumentError(
            f"search must be one of {list(SEARCHES)}. Received: search={search!r}. Use 'grid' "
            "for every combination or 'random' for num_configs samples."
        )
    compile_grid, fit_grid = parse_grids(compile_params_grid, fit_params_grid)
    names = frozenset(custom_names)
    if search == "random":
        return _random(ids, compile_grid, fit_grid, num_configs, seed, names)
    if num_configs is not None or seed is not None:
        raise ArgumentError(
            "num_configs and seed are for random search; a grid search tries every "
            f"combination. Received: num_configs={num_configs!r}, seed={seed!r}. Leave them "
            "out, or pass search='random'."
        )
    refuse_distributions(compile_grid, "compile_params_grid")
    refuse_distributions(fit_grid, "fit_params_grid")
    size = len(ids) * grid_size(compile_grid) * grid_size(fit_grid)
    if size > MAX_CONFIGS:
        raise ArgumentError(
            f"The grid has {size} configurations, more than the {MAX_CONFIGS} a table may "
            f"hold. Received: {len(ids)} architecture(s), compile_params_grid with "
            f"{grid_size(compile_grid)} and fit_params_grid with {grid_size(fit_grid)} "
            "combinations. Use fewer choices, or search='random' with num_configs."
        )
    return _grid(ids, compile_grid, fit_grid, names)


def _grid(
    ids: list[int],
    compile_grid: Mapping[str, list[Any]],
    fit_grid: Mapping[str, list[Any]],
    names: frozenset[str],
) -> list[ModelConfig]:
    compile_axes = grid_axes(compile_grid, "compile_params_grid")
    fit_axes = grid_axes(fit_grid, "fit_params_grid")
    compiled = [
        canonical_texts(merged(combo), None, names)[0] for combo in itertools.product(*compile_axes)
    ]
    fitted = [_fit_text(merged(combo)) for combo in itertools.product(*fit_axes)]
    table = ConfigTable()
    for model_id, compile_text, fit_text in itertools.product(ids, compiled, fitted):
        table.add(model_id, compile_text, fit_text)
    return table.configs()


def _fit_text(raw: Mapping[str, Any]) -> str:
    try:
        return format_params(parse_fit_params(raw))
    except ParameterError as exc:
        raise refused(exc, "fit_params_grid", None, raw) from None


def _random(
    ids: list[int],
    compile_grid: Mapping[str, list[Any]],
    fit_grid: Mapping[str, list[Any]],
    num_configs: int | None,
    seed: int | None,
    names: frozenset[str],
) -> list[ModelConfig]:
    """``num_configs`` distinct draws of the search space (the searches' engine), seeded."""
    if isinstance(num_configs, bool) or not isinstance(num_configs, numbers.Integral):
        raise ArgumentError(
            f"Random search needs num_configs, a positive integer. Received: num_configs="
            f"{num_configs!r}. Pass e.g. num_configs=8."
        )
    if not 0 < num_configs <= MAX_CONFIGS:
        raise ArgumentError(
            f"num_configs must be between 1 and {MAX_CONFIGS}. Received: num_configs="
            f"{num_configs}. Ask for fewer configurations."
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ArgumentTypeError(
            f"seed must be an integer or None. Received: {type(seed).__name__} {seed!r}."
        )
    check_distributions(compile_grid, fit_grid)  # a malformed range fails before any draw
    space = SearchSpace.checked(ids, compile_grid, fit_grid, names)
    return space.distinct_configs(int(num_configs), seed)


def cross_configs(
    arch_ids: int | Sequence[int],
    compile_params_list: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]],
    fit_params_list: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]] | None,
    custom_names: Collection[str] = (),
) -> list[ModelConfig]:
    """Every combination of ids and parameter strings (MADlib's ``load_model_selection_table``).

    Parameters
    ----------
    arch_ids : int or list of int
    compile_params_list, fit_params_list : str, dict, or a list of them
        Each entry is one complete parameter set, such as ``"loss='mse', optimizer='adam'"``.
        Entries equal after parsing count once.

    Returns
    -------
    list of ModelConfig
        Ordered by architecture, then compile, then fit parameters.
    """
    ids = check_arch_ids(arch_ids)
    compiled = _canonical_list(compile_params_list, "compile_params_list", names=custom_names)
    fitted = _canonical_list(fit_params_list, "fit_params_list", names=None)
    size = len(ids) * len(compiled) * len(fitted)
    if size > MAX_CONFIGS:
        raise ArgumentError(
            f"The lists make {size} configurations, more than the {MAX_CONFIGS} a table may "
            "hold. Received: "
            f"{len(ids)} architectures x {len(compiled)} x {len(fitted)}. Give fewer entries."
        )
    table = ConfigTable()
    for model_id, (c_text, c_key), (f_text, f_key) in itertools.product(ids, compiled, fitted):
        table.add(model_id, c_text, f_text, (c_key, f_key))
    return table.configs()


def _canonical_list(
    entries: Any, what: str, names: Collection[str] | None
) -> list[tuple[str, str]]:
    if entries is None:
        entries = [""]
    if isinstance(entries, str | Mapping):
        entries = [entries]
    if not isinstance(entries, Sequence) or not entries:
        raise ArgumentTypeError(
            f"{what} must be a parameter string, a dict, or a non-empty list of them. "
            f"Received: {type(entries).__name__} {entries!r:.80}."
        )
    result: dict[str, str] = {}  # key -> the first text written for it
    for i, entry in enumerate(entries):
        try:
            if names is None:
                fitted = parse_fit_params(entry)
                text, key = params_text(entry, fitted), params_key(fitted)
            else:
                (text, _), (key, _) = kept_texts(entry, None, names)
        except ParameterError as exc:
            raise ArgumentError(
                f"{what}[{i}] is refused: {exc} Received: {what}[{i}]={entry!r:.200}. Fix that "
                "entry."
            ) from None
        result.setdefault(key, text)
    return [(text, key) for key, text in result.items()]
