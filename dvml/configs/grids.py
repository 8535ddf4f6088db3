"""MADlib's grid language, the one that ``model_configs`` and every search method read.

``compile_params_grid`` and ``fit_params_grid`` map a parameter to a list of choices, given as
dicts or as the text of a Python dict (read as literals, never evaluated):
``{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'],
'lr': [0.001, 0.01]}], 'metrics': ['accuracy']}`` and ``{'batch_size': [8, 16], 'epochs':
[1]}``. In the compile grid ``optimizer_params_list`` is a list of dicts, each naming
``'optimizer'`` class(es) and that optimizer's own arguments. For random search (and the
searches) a numeric choice may be a range ``[low, high, 'linear' | 'log' | 'log_near_one']``.

:func:`parse_grids` reads and checks both grids once, with the messages every caller shows;
:func:`grid_axes` expands a grid search; :class:`dvml.configs.search_space.SearchSpace` draws
from the same grids for random search, Hyperband, hyperopt and ASHA. Pure: no I/O.
"""

from __future__ import annotations

import ast
import itertools
import math
import numbers
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from dvml.configs.literals import MAX_DEPTH, MAX_LENGTH, bracket_depth
from dvml.exceptions import ArgumentError, ArgumentTypeError

__all__ = [
    "DISTRIBUTIONS",
    "INT_KEYS",
    "MAX_CONFIGS",
    "METRIC_KEYS",
    "OPTIMIZER_PARAMS_LIST",
    "SEARCHES",
    "SIGNIFICANT",
    "check_distributions",
    "choice_value",
    "grid_axes",
    "grid_size",
    "has_distribution",
    "is_distribution",
    "merged",
    "optimizer_choice",
    "parse_grid",
    "parse_grids",
    "refuse_distributions",
    "rounded",
]


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
METRIC_KEYS = ("metrics", "weighted_metrics")
SIGNIFICANT = 6  # digits kept of a sampled float, so the strings stay readable


def plain_value(value: Any, where: str) -> Any:
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
        return [plain_value(v, where) for v in value]
    if isinstance(value, Mapping):
        result = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ArgumentError(
                    f"{where} has a key that is not a string. Received: {k!r}. Use parameter "
                    "names as keys."
                )
            result[k] = plain_value(v, f"{where}[{k!r}]")
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
        if len(text) > MAX_LENGTH or bracket_depth(text) > MAX_DEPTH:
            raise ArgumentError(
                f"{what} is too long or nests too deeply (at most {MAX_LENGTH} characters and "
                f"{MAX_DEPTH} levels of brackets). Received: {text[:60]!r}... Write a smaller "
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
    plain = plain_value(grid, what)
    for key, choices in plain.items():
        if not isinstance(choices, list) or not choices:
            raise ArgumentError(
                f"{what}[{key!r}] must be a non-empty list of choices. Received: {key!r}: "
                f"{choices!r:.80}. Write {{{key!r}: [{choices!r:.40}]}} for a single value."
            )
    return plain


def distribution(key: str, choices: list[Any], where: str) -> tuple[float, float, str] | None:
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


def is_distribution(value: Any) -> bool:
    """Whether ``value`` is written as a range ``[low, high, name]``."""
    return (
        isinstance(value, list)
        and len(value) > 1
        and isinstance(value[-1], str)
        and value[-1] in DISTRIBUTIONS
        and all(isinstance(c, int | float) and not isinstance(c, bool) for c in value[:-1])
    )


def check_optimizer_dicts(choices: list[Any], where: str, compile_keys: Collection[str]) -> None:
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


def rounded(value: float) -> float:
    """A drawn number with :data:`SIGNIFICANT` digits, so that the strings stay readable."""
    return float(f"{value:.{SIGNIFICANT}g}")


def choice_value(key: str, value: Any) -> Any:
    """A chosen grid value as the parameter's value: a metric name means a list of one."""
    if key in METRIC_KEYS and not isinstance(value, list):
        return [value]
    return value


def optimizer_choice(choice: Mapping[str, Any]) -> dict[str, Any]:
    """One choice of an ``optimizer_params_list`` dict as an optimizer spec."""
    config = {k: v for k, v in choice.items() if k != "optimizer"}
    return {"class_name": choice["optimizer"], "config": config}


def grid_axes(grid: Mapping[str, list[Any]], where: str) -> list[list[dict[str, Any]]]:
    """One list of partial parameter dicts per grid key; their product is the grid."""
    axes = []
    for key, choices in grid.items():
        if key == OPTIMIZER_PARAMS_LIST:
            axis = []
            for entry in choices:
                names = list(entry)
                for combo in itertools.product(*(entry[n] for n in names)):
                    choice = dict(zip(names, combo, strict=True))
                    axis.append({"optimizer": optimizer_choice(choice)})
            axes.append(axis)
        else:
            axes.append([{key: choice_value(key, c)} for c in choices])
    return axes


def grid_size(grid: Mapping[str, list[Any]]) -> int:
    """How many combinations a grid search of ``grid`` makes."""
    size = 1
    for key, choices in grid.items():
        if key == OPTIMIZER_PARAMS_LIST:
            size *= sum(math.prod(len(v) for v in entry.values()) for entry in choices)
        else:
            size *= len(choices)
    return size


def refuse_distributions(grid: Mapping[str, list[Any]], where: str) -> None:
    """Refuse a range in a grid search, which only random search can draw from."""
    for name, values in _entries(grid):
        if is_distribution(values):
            raise ArgumentError(
                f"{where}[{name!r}] is a distribution, which only random search can "
                f"sample. Received: {name!r}: {values!r}. Pass search='random' with "
                "num_configs, or list the values to try."
            )


def merged(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The partial parameter dicts of one grid combination, as one dict."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


def has_distribution(grid: Mapping[str, list[Any]]) -> bool:
    """Whether any choice of the grid is a range."""
    return any(is_distribution(values) for _, values in _entries(grid))


def parse_grids(
    compile_params_grid: str | Mapping[str, Any] | None,
    fit_params_grid: str | Mapping[str, Any] | None,
) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Both grids read and checked (:func:`parse_grid`, ``optimizer_params_list``'s dicts).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        On a malformed grid, an optimizer dict without ``'optimizer'`` or repeating a compile
        key, or ``optimizer_params_list`` in the fit grid.
    """
    compile_grid = parse_grid(compile_params_grid, "compile_params_grid")
    fit_grid = parse_grid(fit_params_grid, "fit_params_grid")
    if OPTIMIZER_PARAMS_LIST in compile_grid:
        keys = [k for k in compile_grid if k != OPTIMIZER_PARAMS_LIST]
        check_optimizer_dicts(compile_grid[OPTIMIZER_PARAMS_LIST], "compile_params_grid", keys)
    if OPTIMIZER_PARAMS_LIST in fit_grid:
        raise ArgumentError(
            "fit_params_grid has optimizer_params_list, which belongs to compile_params_grid. "
            f"Received: fit_params_grid keys {list(fit_grid)}. Move it to compile_params_grid."
        )
    return compile_grid, fit_grid


def _entries(grid: Mapping[str, list[Any]]) -> Iterable[tuple[str, list[Any]]]:
    """Every ``(parameter, choices)`` of a grid, the optimizer dicts' arguments included."""
    for key, choices in grid.items():
        for entry in choices if key == OPTIMIZER_PARAMS_LIST else [{key: choices}]:
            yield from entry.items()


def check_distributions(
    compile_grid: Mapping[str, list[Any]], fit_grid: Mapping[str, list[Any]]
) -> None:
    """Refuse a malformed range in either grid, before anything is drawn.

    Raises
    ------
    ArgumentError
        Naming the grid and the parameter: a range of other than three items, ``low`` not
        below ``high``, a ``log`` range reaching 0, a ``log_near_one`` range outside [0, 1).
    """
    for grid, where in ((compile_grid, "compile_params_grid"), (fit_grid, "fit_params_grid")):
        for name, values in _entries(grid):
            distribution(name, values, where)
