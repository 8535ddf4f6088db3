"""Model configurations from grids: MADlib's ``generate_model_configs`` and
``load_model_selection_table``, pure.

A model configuration is one row of MADlib's model selection table: ``mst_key`` (1, 2, ...),
``model_id`` (an architecture id), ``compile_params`` and ``fit_params`` (MADlib-style
strings). This module builds those rows from

- grids in MADlib's format (:func:`plan_configs`), given as dicts or as the string of a Python
  dict: ``{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer':
  ['Adam'], 'lr': [0.001, 0.01]}], 'metrics': ['accuracy']}`` and ``{'batch_size': [8, 16],
  'epochs': [1]}``, searched exhaustively (``search="grid"``) or by sampling ``num_configs``
  configurations (``search="random"``, with ``[low, high, 'linear' | 'log' | 'log_near_one']``
  distributions for numbers);
- lists of parameter strings, every combination (:func:`cross_configs`);
- rows a user wrote (:func:`check_config_rows`).

Every string is parsed by :mod:`dvml.train.params` before it is returned, so a configuration
that a trainer would refuse is refused here, naming the entry. Strings generated from grids are
written in canonical form (``lr`` becomes ``learning_rate``); strings a user wrote are kept as
written (MADlib keeps the text: a ``WHERE compile_params = $$...$$`` lookup must find them).
Duplicates, parameters equal once parsed whatever their key order, are dropped. Plain values
in, plain values out: no registry, no TensorFlow; :mod:`dvml.train.model_selection` stores
the rows.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
import numbers
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError, ParameterError
from dvml.train import params as p

__all__ = [
    "COLUMNS",
    "DISTRIBUTIONS",
    "MAX_CONFIGS",
    "OPTIMIZER_PARAMS_LIST",
    "SEARCHES",
    "ModelConfig",
    "check_arch_ids",
    "check_config_rows",
    "cross_configs",
    "kept_texts",
    "parse_grid",
    "plan_configs",
]

COLUMNS = ("mst_key", "model_id", "compile_params", "fit_params")
"""The columns of a model selection table, in MADlib's order."""

SEARCHES = ("grid", "random")
DISTRIBUTIONS = ("linear", "log", "log_near_one")
"""Random-search distributions of a numeric parameter written ``[low, high, name]``."""

OPTIMIZER_PARAMS_LIST = "optimizer_params_list"
"""The compile-grid key whose dicts give an optimizer and its own arguments' choices."""

MAX_CONFIGS = 10_000
"""Most configurations one table may hold (a grid's product is checked before expanding)."""

# Parameters Keras wants as integers: a distribution over them draws integers.
INT_KEYS = frozenset(
    {
        "batch_size",
        "epochs",
        "steps_per_epoch",
        "validation_steps",
        "validation_freq",
        "initial_epoch",
        "verbose",
        "steps_per_execution",
        "ema_overwrite_frequency",
    }
)
# Compile keys whose value is a list of metrics: a string choice means a list of one.
_METRIC_KEYS = ("metrics", "weighted_metrics")
_SIGNIFICANT = 6  # digits kept of a sampled float, so the strings stay readable


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One row of a model selection table."""

    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- inputs


def check_arch_ids(arch_ids: Any) -> list[int]:
    """``arch_ids`` as a sorted list of distinct ints (MADlib sorts and de-duplicates them).

    Raises
    ------
    ArgumentTypeError, ArgumentError
        When it is not an int or a non-empty list of ints.
    """
    items = [arch_ids] if isinstance(arch_ids, numbers.Integral) else arch_ids
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise ArgumentTypeError(
            f"arch_ids must be an architecture id or a list of ids. Received: "
            f"{type(arch_ids).__name__} {arch_ids!r:.80}. Pass the ids dvml.load_keras_model "
            "returned, e.g. arch_ids=[1, 2]."
        )
    ids = list(items)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if bad:
        raise ArgumentTypeError(
            f"arch_ids must hold integer ids only. Received: {bad[0]!r} in arch_ids="
            f"{ids!r:.80}. Pass the ids dvml.load_keras_model returned."
        )
    if not ids:
        raise ArgumentError(
            "arch_ids must name at least one architecture. Received: arch_ids=[]. Pass the "
            "ids dvml.load_keras_model returned."
        )
    return sorted({int(i) for i in ids})


def _plain(value: Any, where: str) -> Any:
    """A value of a grid as plain literals (lists for tuples), or an ArgumentError."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise ArgumentError(
                f"{where} holds a number that is not finite. Received: {value!r}. Use finite "
                "numbers."
            )
        return number
    if isinstance(value, list | tuple):
        return [_plain(v, where) for v in value]
    if isinstance(value, Mapping):
        result = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ArgumentError(
                    f"{where} has a key that is not a string. Received: {k!r}. Use parameter "
                    "names as keys."
                )
            result[k] = _plain(v, f"{where}[{k!r}]")
        return result
    raise ArgumentTypeError(
        f"{where} holds a {type(value).__name__}, which is not a plain value. Received: "
        f"{value!r:.80}. Use strings, numbers, booleans, None, lists and dicts."
    )


def parse_grid(grid: str | Mapping[str, Any] | None, what: str) -> dict[str, list[Any]]:
    """A compile or fit grid as a dict of key → list of choices.

    Parameters
    ----------
    grid : str, dict or None
        A dict, or its text in MADlib's form (``"{'batch_size': [8, 16], 'epochs': [1]}"``),
        read as literals only (never evaluated). None or ``{}`` is no parameters.
    what : str
        ``"compile_params_grid"`` or ``"fit_params_grid"``, for messages.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        When the text is not a dict literal, or a value is not a non-empty list.
    """
    if grid is None:
        return {}
    if isinstance(grid, str):
        text = grid.strip()
        if not text:
            return {}
        if len(text) > p.MAX_LENGTH or p.bracket_depth(text) > p.MAX_DEPTH:
            raise ArgumentError(
                f"{what} is too long or nests too deeply (at most {p.MAX_LENGTH} characters and "
                f"{p.MAX_DEPTH} levels of brackets). Received: {text[:60]!r}... Write a smaller "
                "grid."
            )
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
            raise ArgumentError(
                f"{what} is not the text of a dict of literal values ({type(exc).__name__}). "
                f"Received: {text[:80]!r}. Write it like \"{{'batch_size': [8, 16], 'epochs': "
                '[1]}", with quoted names.'
            ) from None
        grid = value
    if not isinstance(grid, Mapping):
        raise ArgumentTypeError(
            f"{what} must be a dict of parameter name to a list of choices, or its text. "
            f"Received: {type(grid).__name__} {grid!r:.80}. For example {{'batch_size': [8, 16]}}."
        )
    plain = _plain(grid, what)
    for key, choices in plain.items():
        if not isinstance(choices, list) or not choices:
            raise ArgumentError(
                f"{what}[{key!r}] must be a non-empty list of choices. Received: {key!r}: "
                f"{choices!r:.80}. Write {{{key!r}: [{choices!r:.40}]}} for a single value."
            )
    return plain


def _distribution(key: str, choices: list[Any], where: str) -> tuple[float, float, str] | None:
    """``(low, high, name)`` when ``choices`` is ``[low, high, name]``, else None."""
    last = choices[-1]
    if not (isinstance(last, str) and last in DISTRIBUTIONS and len(choices) > 1):
        return None
    numbers_only = all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices[:-1])
    if not numbers_only:
        return None
    if len(choices) != 3:
        raise ArgumentError(
            f"{where}[{key!r}] looks like a distribution but has {len(choices)} items. "
            f"Received: {choices!r}. Write [low, high, {last!r}]."
        )
    low, high = float(choices[0]), float(choices[1])
    problem = None
    if not low < high:
        problem = "low must be smaller than high"
    elif last == "log" and low <= 0:
        problem = "a 'log' distribution needs 0 < low"
    elif last == "log_near_one" and not (low >= 0 and high < 1):
        problem = "a 'log_near_one' distribution needs 0 <= low < high < 1"
    if problem:
        raise ArgumentError(
            f"{where}[{key!r}] is not a valid distribution: {problem}. Received: {choices!r}. "
            f"Write [low, high, {last!r}]."
        )
    return low, high, last


def _is_distribution(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 1
        and isinstance(value[-1], str)
        and value[-1] in DISTRIBUTIONS
        and all(isinstance(c, int | float) and not isinstance(c, bool) for c in value[:-1])
    )


def _optimizer_dicts(choices: list[Any], where: str, compile_keys: Collection[str]) -> None:
    """Check ``optimizer_params_list``: dicts that each name 'optimizer' (MADlib's rules)."""
    for i, entry in enumerate(choices):
        at = f"{where}[{OPTIMIZER_PARAMS_LIST!r}][{i}]"
        if not isinstance(entry, dict) or not entry:
            raise ArgumentError(
                f"{at} must be a non-empty dict of optimizer argument to choices. Received: "
                f"{entry!r:.80}. For example {{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}}."
            )
        if "optimizer" not in entry:
            raise ArgumentError(
                f"{at} has no 'optimizer' key. Received: {entry!r:.80}. Name the optimizer "
                "class(es) there, e.g. 'optimizer': ['Adam', 'SGD']."
            )
        shared = sorted(set(entry) & set(compile_keys))
        if shared:
            raise ArgumentError(
                f"{at} repeats {shared} given outside it. Received: {entry!r:.80}. The "
                "optimizer and its arguments go inside optimizer_params_list only."
            )
        for key, values in entry.items():
            if not isinstance(values, list) or not values:
                raise ArgumentError(
                    f"{at}[{key!r}] must be a non-empty list of choices. Received: "
                    f"{values!r:.80}. Write {{{key!r}: [{values!r:.40}]}} for a single value."
                )


# --------------------------------------------------------------------------- one configuration


def _choice_value(key: str, value: Any) -> Any:
    """A chosen grid value as the parameter's value: a metric name means a list of one."""
    if key in _METRIC_KEYS and not isinstance(value, list):
        return [value]
    return value


def _optimizer(choice: Mapping[str, Any]) -> dict[str, Any]:
    config = {k: v for k, v in choice.items() if k != "optimizer"}
    return {"class_name": choice["optimizer"], "config": config}


def _canonical(
    compile_params: str | Mapping[str, Any],
    fit_params: str | Mapping[str, Any] | None,
    custom_names: Collection[str],
) -> tuple[str, str]:
    """Both parameter sets parsed and written back in canonical form; ParameterError if not."""
    compiled = p.parse_compile_params(compile_params, custom_names=custom_names)
    if "loss" not in compiled:
        raise ParameterError(
            "The compile parameters give no loss, so the model cannot be trained. Received: "
            f"{compile_params!r:.120}. Add loss='categorical_crossentropy' (or another loss)."
        )
    return p.format_params(compiled), p.format_params(p.parse_fit_params(fit_params))


def _refused(exc: ParameterError, source: str, compile_text: Any, fit_text: Any) -> ArgumentError:
    parts = [
        f"{key}={_text(value)!r:.200}"
        for key, value in (("compile_params", compile_text), ("fit_params", fit_text))
        if value is not None
    ]
    return ArgumentError(
        f"A configuration from {source} is refused: {exc} Configuration: {', '.join(parts)}. "
        f"Fix that entry of {source}."
    )


def _text(params: Any) -> Any:
    if isinstance(params, Mapping):
        try:
            return p.format_params(params)
        except ParameterError:
            return params
    return params


class _Table:
    """Rows in order, without duplicates; mst_key numbers them from 1.

    A row is a duplicate when its parameters are equal once parsed, whatever their key order
    or spacing (MADlib's test); the first text given is the one kept.
    """

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str, str], tuple[int, str, str]] = {}

    def add(
        self, model_id: int, compile_text: str, fit_text: str, key: tuple[str, str] | None = None
    ) -> bool:
        row = (model_id, *(key or (compile_text, fit_text)))
        if row in self.rows:
            return False
        self.rows[row] = (model_id, compile_text, fit_text)
        return True

    def configs(self) -> list[ModelConfig]:
        return [ModelConfig(i, *row) for i, row in enumerate(self.rows.values(), start=1)]


# --------------------------------------------------------------------------- grid search


def _axes(grid: Mapping[str, list[Any]], where: str) -> list[list[dict[str, Any]]]:
    """One list of partial parameter dicts per grid key; their product is the grid."""
    axes = []
    for key, choices in grid.items():
        if key == OPTIMIZER_PARAMS_LIST:
            axis = []
            for entry in choices:
                names = list(entry)
                for combo in itertools.product(*(entry[n] for n in names)):
                    choice = dict(zip(names, combo, strict=True))
                    axis.append({"optimizer": _optimizer(choice)})
            axes.append(axis)
        else:
            axes.append([{key: _choice_value(key, c)} for c in choices])
    return axes


def _grid_size(grid: Mapping[str, list[Any]]) -> int:
    size = 1
    for key, choices in grid.items():
        if key == OPTIMIZER_PARAMS_LIST:
            size *= sum(math.prod(len(v) for v in entry.values()) for entry in choices)
        else:
            size *= len(choices)
    return size


def _refuse_distributions(grid: Mapping[str, list[Any]], where: str) -> None:
    for key, choices in grid.items():
        entries = choices if key == OPTIMIZER_PARAMS_LIST else [{key: choices}]
        for entry in entries:
            for name, values in entry.items():
                if _is_distribution(values):
                    raise ArgumentError(
                        f"{where}[{name!r}] is a distribution, which only random search can "
                        f"sample. Received: {name!r}: {values!r}. Pass search='random' with "
                        "num_configs, or list the values to try."
                    )


def _merge(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


# --------------------------------------------------------------------------- random search


def _round(value: float) -> float:
    return float(f"{value:.{_SIGNIFICANT}g}")


def _sample(key: str, choices: list[Any], rng: random.Random, where: str) -> Any:
    dist = _distribution(key, choices, where)
    if dist is None:
        return rng.choice(choices)
    low, high, name = dist
    if name == "linear":
        value = rng.uniform(low, high)
    elif name == "log":
        value = 10 ** rng.uniform(math.log10(low), math.log10(high))
    else:  # log_near_one: values crowd towards 1 (momentum, beta_1, ...)
        value = 1.0 - 10 ** rng.uniform(math.log10(1.0 - high), math.log10(1.0 - low))
    if key in INT_KEYS:
        return min(max(round(value), math.ceil(low)), math.floor(high))
    return min(max(_round(value), low), high)


def _sample_params(grid: Mapping[str, list[Any]], rng: random.Random, where: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, choices in grid.items():
        if key == OPTIMIZER_PARAMS_LIST:
            entry = rng.choice(choices)
            choice = {k: _sample(k, v, rng, where) for k, v in entry.items()}
            params["optimizer"] = _optimizer(choice)
        else:
            params[key] = _choice_value(key, _sample(key, choices, rng, where))
    return params


def _has_distribution(grid: Mapping[str, list[Any]]) -> bool:
    for key, choices in grid.items():
        entries = choices if key == OPTIMIZER_PARAMS_LIST else [{key: choices}]
        if any(_is_distribution(v) for entry in entries for v in entry.values()):
            return True
    return False


# --------------------------------------------------------------------------- public planners


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
        :func:`dvml.train.params.parse_compile_params`).

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
    compile_grid = parse_grid(compile_params_grid, "compile_params_grid")
    fit_grid = parse_grid(fit_params_grid, "fit_params_grid")
    if OPTIMIZER_PARAMS_LIST in compile_grid:
        keys = [k for k in compile_grid if k != OPTIMIZER_PARAMS_LIST]
        _optimizer_dicts(compile_grid[OPTIMIZER_PARAMS_LIST], "compile_params_grid", keys)
    if OPTIMIZER_PARAMS_LIST in fit_grid:
        raise ArgumentError(
            "fit_params_grid has optimizer_params_list, which belongs to compile_params_grid. "
            f"Received: fit_params_grid keys {list(fit_grid)}. Move it to compile_params_grid."
        )
    names = frozenset(custom_names)
    if search == "grid":
        if num_configs is not None or seed is not None:
            raise ArgumentError(
                "num_configs and seed are for random search; a grid search tries every "
                f"combination. Received: num_configs={num_configs!r}, seed={seed!r}. Leave them "
                "out, or pass search='random'."
            )
        for grid, where in ((compile_grid, "compile_params_grid"), (fit_grid, "fit_params_grid")):
            _refuse_distributions(grid, where)
        size = len(ids) * _grid_size(compile_grid) * _grid_size(fit_grid)
        if size > MAX_CONFIGS:
            raise ArgumentError(
                f"The grid has {size} configurations, more than the {MAX_CONFIGS} a table may "
                f"hold. Received: {len(ids)} architecture(s), compile_params_grid with "
                f"{_grid_size(compile_grid)} and fit_params_grid with {_grid_size(fit_grid)} "
                "combinations. Use fewer choices, or search='random' with num_configs."
            )
        return _grid(ids, compile_grid, fit_grid, names)
    return _random(ids, compile_grid, fit_grid, num_configs, seed, names)


def _grid(
    ids: list[int],
    compile_grid: Mapping[str, list[Any]],
    fit_grid: Mapping[str, list[Any]],
    names: frozenset[str],
) -> list[ModelConfig]:
    compile_axes = _axes(compile_grid, "compile_params_grid")
    fit_axes = _axes(fit_grid, "fit_params_grid")
    compiled = []
    for combo in itertools.product(*compile_axes):
        raw = _merge(combo)
        try:
            compiled.append(_canonical(raw, None, names)[0])
        except ParameterError as exc:
            raise _refused(exc, "compile_params_grid", raw, None) from None
    fitted = []
    for combo in itertools.product(*fit_axes):
        raw = _merge(combo)
        try:
            fitted.append(p.format_params(p.parse_fit_params(raw)))
        except ParameterError as exc:
            raise _refused(exc, "fit_params_grid", None, raw) from None
    table = _Table()
    for model_id, compile_text, fit_text in itertools.product(ids, compiled, fitted):
        table.add(model_id, compile_text, fit_text)
    return table.configs()


def _random(
    ids: list[int],
    compile_grid: Mapping[str, list[Any]],
    fit_grid: Mapping[str, list[Any]],
    num_configs: int | None,
    seed: int | None,
    names: frozenset[str],
) -> list[ModelConfig]:
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
    for grid, where in ((compile_grid, "compile_params_grid"), (fit_grid, "fit_params_grid")):
        for key, choices in grid.items():  # malformed distributions fail before any draw
            entries = choices if key == OPTIMIZER_PARAMS_LIST else [{key: choices}]
            for entry in entries:
                for name, values in entry.items():
                    _distribution(name, values, where)
    if not _has_distribution(compile_grid) and not _has_distribution(fit_grid):
        size = len(ids) * _grid_size(compile_grid) * _grid_size(fit_grid)
        if num_configs > size:
            raise ArgumentError(
                f"Random search cannot draw {num_configs} distinct configurations from "
                f"{size} possible ones. Received: num_configs={num_configs}. Ask for at most "
                f"{size}, use search='grid', or give a distribution [low, high, 'log']."
            )
    rng = random.Random(seed)
    table = _Table()
    draws = 0
    limit = 50 * num_configs + 100  # duplicates of a small discrete space are drawn again
    while len(table.rows) < num_configs and draws < limit:
        draws += 1
        model_id = rng.choice(ids)
        compile_raw = _sample_params(compile_grid, rng, "compile_params_grid")
        fit_raw = _sample_params(fit_grid, rng, "fit_params_grid")
        try:
            compile_text, _ = _canonical(compile_raw, None, names)
        except ParameterError as exc:
            raise _refused(exc, "compile_params_grid", compile_raw, fit_raw) from None
        try:
            fit_text = p.format_params(p.parse_fit_params(fit_raw))
        except ParameterError as exc:
            raise _refused(exc, "fit_params_grid", compile_raw, fit_raw) from None
        table.add(model_id, compile_text, fit_text)
    if len(table.rows) < num_configs:
        raise ArgumentError(
            f"Random search found only {len(table.rows)} distinct configurations in {draws} "
            f"draws. Received: num_configs={num_configs}. Ask for fewer, or widen the grids."
        )
    return table.configs()


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
    table = _Table()
    for model_id, (c_text, c_key), (f_text, f_key) in itertools.product(ids, compiled, fitted):
        table.add(model_id, c_text, f_text, (c_key, f_key))
    return table.configs()


def kept_texts(
    compile_params: str | Mapping[str, Any],
    fit_params: str | Mapping[str, Any] | None,
    custom_names: Collection[str],
) -> tuple[tuple[str, str], tuple[str, str]]:
    """The texts a table keeps (a string as the user wrote it, MADlib keeps the text) and
    the parameters' keys, equal for the same parameters in any order (:func:`params_key`).

    Raises
    ------
    ParameterError
        As :func:`dvml.train.params.parse_compile_params` / ``parse_fit_params`` do.
    """
    compiled = p.parse_compile_params(compile_params, custom_names=custom_names)
    if "loss" not in compiled:
        _canonical(compile_params, None, custom_names)  # raises: no loss
    fitted = p.parse_fit_params(fit_params)
    texts = (p.params_text(compile_params, compiled), p.params_text(fit_params, fitted))
    return texts, (p.params_key(compiled), p.params_key(fitted))


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
                fitted = p.parse_fit_params(entry)
                text, key = p.params_text(entry, fitted), p.params_key(fitted)
            else:
                (text, _), (key, _) = kept_texts(entry, None, names)
        except ParameterError as exc:
            raise ArgumentError(
                f"{what}[{i}] is refused: {exc} Received: {what}[{i}]={entry!r:.200}. Fix that "
                "entry."
            ) from None
        result.setdefault(key, text)
    return [(text, key) for key, text in result.items()]


def _checked_row(
    where: str, row: Any, required: set[str], custom_names: Collection[str]
) -> tuple[int, tuple[str, str], tuple[str, str]]:
    """One row's columns, architecture id and canonical parameter texts (or a clear error)."""
    if not isinstance(row, Mapping):
        raise ArgumentTypeError(
            f"{where} of the model selection table must be a dict. Received: "
            f"{type(row).__name__} {row!r:.80}."
        )
    unknown = sorted(str(k) for k in set(row) - set(COLUMNS))
    missing = sorted(required - set(row))
    if unknown or missing:
        raise ArgumentError(
            f"{where} of the model selection table has the wrong columns: missing "
            f"{missing}, unknown {unknown}. Received: {dict(row)!r:.200}. The columns are "
            f"{list(COLUMNS)} (mst_key optional)."
        )
    model_id = row["model_id"]
    if isinstance(model_id, bool) or not isinstance(model_id, numbers.Integral):
        raise ArgumentTypeError(
            f"{where}: model_id must be one integer architecture id. Received: "
            f"{type(model_id).__name__} {model_id!r:.80}."
        )
    model_id = int(model_id)
    try:
        texts, keys = kept_texts(row["compile_params"], row["fit_params"], custom_names)
    except ParameterError as exc:
        raise ArgumentError(
            f"{where} of the model selection table is refused: {exc} Received: "
            f"{dict(row)!r:.200}. Fix that row."
        ) from None
    return model_id, texts, keys


def check_config_rows(
    rows: Iterable[Mapping[str, Any]], custom_names: Collection[str] = ()
) -> list[ModelConfig]:
    """Check a model selection table a user wrote: the rows as :class:`ModelConfig`.

    Parameters
    ----------
    rows : iterable of dict
        Each with ``model_id``, ``compile_params`` (str or dict), ``fit_params`` (str, dict or
        None) and optionally ``mst_key`` (all rows or none; numbered from 1 when absent).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the row: a missing or unknown column, a bad id, repeated ``mst_key`` values,
        two equal configurations, or parameters the parser refuses.
    """
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Iterable):
        raise ArgumentTypeError(
            f"A model selection table must be a list of rows (dicts) or a DataFrame. "
            f"Received: {type(rows).__name__}. Each row has model_id, compile_params and "
            "fit_params."
        )
    items = list(rows)
    if not items:
        raise ArgumentError(
            "The model selection table has no rows. Received: 0 rows. Give at least one "
            "configuration."
        )
    required = set(COLUMNS) - {"mst_key"}
    with_key = 0
    configs = []
    seen_keys: dict[int, int] = {}
    seen: dict[tuple[int, str, str], int] = {}
    for i, row in enumerate(items):
        where = f"row {i}"
        model_id, (compile_text, fit_text), keys = _checked_row(where, row, required, custom_names)
        if row.get("mst_key") is not None:
            with_key += 1
            key = row["mst_key"]
            if isinstance(key, bool) or not isinstance(key, numbers.Integral) or key < 1:
                raise ArgumentError(
                    f"{where}: mst_key must be a positive integer. Received: mst_key={key!r}."
                )
            key = int(key)
            if key in seen_keys:
                raise ArgumentError(
                    f"{where} repeats mst_key={key} of row {seen_keys[key]}. Received: "
                    f"mst_key={key} twice. Give every row its own mst_key, or none."
                )
            seen_keys[key] = i
        else:
            key = i + 1
        triple = (model_id, *keys)  # equal parameters in any key order are the same row
        if triple in seen:
            raise ArgumentError(
                f"{where} is the same configuration as row {seen[triple]}. Received: "
                f"model_id={model_id}, compile_params={compile_text!r:.120}, fit_params="
                f"{fit_text!r}. Remove one of them."
            )
        seen[triple] = i
        configs.append(ModelConfig(key, model_id, compile_text, fit_text))
    if 0 < with_key < len(items):
        raise ArgumentError(
            f"mst_key is given in {with_key} of {len(items)} rows. Received: some rows without "
            "mst_key. Give it in every row, or in none (then rows are numbered from 1)."
        )
    if len(configs) > MAX_CONFIGS:
        raise ArgumentError(
            f"The table has {len(configs)} rows, more than {MAX_CONFIGS}. Give fewer rows."
        )
    return sorted(configs, key=lambda c: c.mst_key)
