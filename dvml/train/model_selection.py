"""Model selection tables in the registry: MADlib's ``generate_model_configs`` and
``load_model_selection_table``, for training many configurations at once.

:func:`model_configs` and :func:`model_selection_table` plan the configurations with the pure
:mod:`dvml.configs` (every parameter string parsed up front) and store them in the
model registry under a name; :func:`describe_model_configs` reads a table back and
:func:`resolve_model_configs` turns whatever a caller was given (a name, a DataFrame, a list
of dicts) into one checked table, for :func:`dvml.fit_multiple`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from dvml import configs as cs
from dvml.configs import ModelConfig
from dvml.deprecation import renamed
from dvml.exceptions import ArgumentTypeError, RegistryError
from dvml.names import check_name
from dvml.registry.database import opened_registry

if TYPE_CHECKING:
    from dvml.registry import Registry

__all__ = [
    "checked_configs",
    "describe_model_configs",
    "drop_model_configs",
    "list_model_configs",
    "model_configs",
    "model_selection_table",
    "resolve_model_configs",
]

Grid = str | Mapping[str, Any] | None
ParamsList = str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]] | None


def _frame(configs: Sequence[ModelConfig]) -> pd.DataFrame:
    frame = pd.DataFrame([c.as_dict() for c in configs], columns=list(cs.COLUMNS))
    return frame.astype({"mst_key": "int64", "model_id": "int64"})


def _custom_names(custom_objects: Collection[str] | None) -> list[str]:
    if custom_objects is None:
        return []
    if isinstance(custom_objects, str) or not all(isinstance(n, str) for n in custom_objects):
        raise ArgumentTypeError(
            f"custom_objects must be a list of registered function names. Received: "
            f"{custom_objects!r:.80}. For example custom_objects=['my_loss']."
        )
    return list(custom_objects)


def _default_name(configs: Sequence[ModelConfig], custom: list[str]) -> str:
    # Named by its content: building the same table again finds it instead of adding a copy.
    text = json.dumps([[c.as_dict() for c in configs], custom], sort_keys=True)
    return f"configs-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _store(
    configs: Sequence[ModelConfig],
    name: str | None,
    *,
    search: str | None,
    seed: int | None,
    source: Mapping[str, Any],
    custom: list[str],
    description: str | None,
    replace: bool,
    registry: Registry | str | None,
) -> pd.DataFrame:
    rows = list(configs)
    name = _default_name(configs, custom) if name is None else name
    try:
        with opened_registry(registry) as reg:
            if custom:
                reg.custom_function_sources(custom)  # RegistryNotFoundError names a missing one
            if not replace and name in set(reg.list_model_selections()["name"]):
                # MADlib appends to a model selection table that exists (new rows only).
                stored = reg.model_selection(name)
                custom = sorted({*stored.attrs["custom_objects"], *custom})
                appended = appended_rows(_stored_configs(stored), rows, custom)
                if appended is None:
                    return stored  # nothing new
                rows = appended
                search, seed = stored.attrs.get("search"), stored.attrs.get("seed")
                description = description or stored.attrs.get("description")
                replace = True
            reg.save_model_selection(
                name,
                rows,
                search=search,
                seed=seed,
                source=source,
                custom_objects=custom,
                description=description,
                replace=replace,
            )
            return reg.model_selection(name)
    except RegistryError:
        with opened_registry(registry) as reg:
            stored_meanwhile = not replace and name in set(reg.list_model_selections()["name"])
        if not stored_meanwhile:
            raise
        # Another process stored a table of this name between the check and the save (the
        # same grid built by concurrent jobs): append to it as if it had been first.
        return _store(configs, name, search=search, seed=seed, source=source, custom=custom,
                      description=description, replace=False, registry=registry)  # fmt: skip


def appended_rows(
    stored: Sequence[ModelConfig], new: Sequence[ModelConfig], custom: list[str]
) -> list[ModelConfig] | None:
    """``stored`` and the rows of ``new`` that it lacks (equal parameters in any key order are
    the same row), numbered on from its largest ``mst_key``; None when nothing is new."""

    def key(row: ModelConfig) -> tuple[Any, ...]:
        _, keys = cs.kept_texts(row.compile_params, row.fit_params, custom)
        return (row.model_id, *keys)

    seen = {key(r) for r in stored}
    result = list(stored)
    next_key = max((r.mst_key for r in stored), default=0) + 1
    for row in new:
        k = key(row)
        if k in seen:
            continue
        seen.add(k)
        result.append(dataclasses.replace(row, mst_key=next_key))
        next_key += 1
    return result if len(result) > len(stored) else None


def _stored_configs(frame: pd.DataFrame) -> list[ModelConfig]:
    """A stored table's rows, as the registry holds them (checked when they were stored)."""
    return [
        ModelConfig(int(r["mst_key"]), int(r["model_id"]), r["compile_params"], r["fit_params"])
        for r in frame.to_dict("records")
    ]


def model_configs(
    arch_ids: int | Sequence[int],
    compile_params_grid: Grid,
    fit_params_grid: Grid,
    search: str = "grid",
    num_configs: int | None = None,
    seed: int | None = None,
    name: str | None = None,
    *,
    custom_objects: Collection[str] | None = None,
    description: str | None = None,
    replace: bool = False,
    registry: Registry | str | None = None,
) -> pd.DataFrame:
    """Generate model configurations by grid or random search and store them (MADlib's
    ``generate_model_configs``).

    Parameters
    ----------
    arch_ids : int or list of int
        Architecture ids from :func:`dvml.load_keras_model`; each must be in the registry.
    compile_params_grid : dict or str
        Compile parameter name → list of choices, as a dict or its text in MADlib's form:
        ``{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer':
        ['Adam', 'SGD'], 'lr': [0.001, 0.01]}], 'metrics': ['accuracy']}``. Each dict of
        ``optimizer_params_list`` names ``'optimizer'`` class(es) and choices for that
        optimizer's own arguments (``lr`` is written ``learning_rate``). A ``metrics`` choice
        is one metric name or a list of metrics. A loss is required.
    fit_params_grid : dict, str or None
        Fit parameter name → list of choices: ``{'batch_size': [8, 16], 'epochs': [1]}``.
    search : {"grid", "random"}
        ``"grid"``: every combination (architecture, then compile, then fit choices).
        ``"random"``: ``num_configs`` distinct samples; a numeric choice may then be a
        distribution ``[low, high, 'linear']``, ``[low, high, 'log']`` (uniform in log10,
        e.g. ``'lr': [0.0001, 0.1, 'log']``) or ``[low, high, 'log_near_one']`` (for values
        near 1, such as momentum); integer parameters (``batch_size``, ``epochs``) get
        integers, other samples keep 6 significant digits.
    num_configs : int, optional
        Random search: the number of configurations (required there, refused for grid).
    seed : int, optional
        Random search: the same seed gives the same table. None draws one, stored with the
        table (``attrs["seed"]``) so it can be repeated.
    name : str, optional
        The table's name in the registry. Default: ``configs-<hash of its content>``, so the
        same table built twice is stored once. A table of that name that exists gets the new
        rows added (``replace`` below).
    custom_objects : list of str, optional
        Registered custom losses/metrics the configurations may use (as :func:`dvml.fit`'s).
    description : str, optional
    replace : bool
        Replace a table of the same name. Default: add the new configurations to it, as
        MADlib does (rows it already has, parameters equal in any key order, are skipped;
        ``mst_key`` goes on from its largest).
    registry : Registry, str or None

    Returns
    -------
    pandas.DataFrame
        One row per configuration: ``mst_key`` (from 1), ``model_id``, ``compile_params``,
        ``fit_params`` (MADlib-style strings in canonical form); ``attrs`` holds the table's
        ``name``, ``search``, ``seed`` and ``custom_objects``.

    Raises
    ------
    ArgumentError
        On a malformed grid, or any configuration the parameter parser refuses, naming it;
        nothing is stored then.
    RegistryNotFoundError
        When an architecture id or a custom function is not in the registry.

    Examples
    --------
    >>> configs = dvml.model_configs(  # doctest: +SKIP
    ...     [arch_id],
    ...     {"loss": ["categorical_crossentropy"],
    ...      "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.01]}],
    ...      "metrics": ["accuracy"]},
    ...     {"batch_size": [8, 16], "epochs": [1]},
    ...     name="digits-grid")
    >>> len(configs)  # doctest: +SKIP
    4
    """
    if name is not None:
        check_name(name, "name")
    custom = _custom_names(custom_objects)
    if search == "random" and seed is None and num_configs is not None:
        seed = secrets.randbelow(2**31)
    configs = cs.plan_configs(
        arch_ids, compile_params_grid, fit_params_grid, search, num_configs, seed, custom
    )
    source = {
        "arch_ids": cs.check_arch_ids(arch_ids),
        "compile_params_grid": compile_params_grid,
        "fit_params_grid": fit_params_grid,
        "num_configs": num_configs,
    }
    return _store(
        configs, name, search=search, seed=seed, source=source, custom=custom,
        description=description, replace=replace, registry=registry,
    )  # fmt: skip


def model_selection_table(
    arch_ids: int | Sequence[int] | pd.DataFrame | Sequence[Mapping[str, Any]],
    compile_params_list: ParamsList = None,
    fit_params_list: ParamsList = None,
    name: str | None = None,
    *,
    custom_objects: Collection[str] | None = None,
    description: str | None = None,
    replace: bool = False,
    registry: Registry | str | None = None,
) -> pd.DataFrame:
    """Store a model selection table from lists of parameter sets, or rows you wrote (MADlib's
    ``load_model_selection_table``).

    Parameters
    ----------
    arch_ids : int, list of int, DataFrame or list of dict
        Architecture ids: the table is every combination of them with ``compile_params_list``
        and ``fit_params_list``. Or the table itself: a DataFrame or list of dicts with
        ``model_id``, ``compile_params``, ``fit_params`` and optionally ``mst_key`` (then leave
        the two lists out).
    compile_params_list : str, dict or list of them
        Complete compile parameter sets: ``["loss='categorical_crossentropy',
        optimizer='Adam(lr=0.001)', metrics=['accuracy']", ...]``. Duplicates count once.
    fit_params_list : str, dict or list of them, optional
        Complete fit parameter sets: ``["batch_size=8, epochs=1", "batch_size=16, epochs=1"]``.
    name, custom_objects, description, replace, registry : optional
        As for :func:`model_configs`.

    Returns
    -------
    pandas.DataFrame
        As :func:`model_configs` returns.

    Raises
    ------
    ArgumentError
        On parameters the parser refuses (naming the entry or row), repeated ``mst_key``
        values or two equal rows; nothing is stored then.
    """
    if name is not None:
        check_name(name, "name")
    custom = _custom_names(custom_objects)
    if _is_table(arch_ids):
        if compile_params_list is not None or fit_params_list is not None:
            raise ArgumentTypeError(
                "Give either a table (rows with model_id, compile_params, fit_params) or "
                "architecture ids with compile_params_list and fit_params_list, not both. "
                "Received: a table and parameter lists. Leave the lists out."
            )
        configs = cs.check_config_rows(_records(arch_ids), custom)
        source: dict[str, Any] = {"rows": len(configs)}
    else:
        if compile_params_list is None:
            raise ArgumentTypeError(
                "compile_params_list is required with architecture ids. Received: None. Pass "
                "one or more compile parameter strings, e.g. [\"loss='mse', optimizer='adam'\"]."
            )
        ids = cs.check_arch_ids(arch_ids)
        configs = cs.cross_configs(ids, compile_params_list, fit_params_list, custom)
        source = {
            "arch_ids": ids,
            "compile_params_list": compile_params_list,
            "fit_params_list": fit_params_list,
        }
    return _store(
        configs, name, search=None, seed=None, source=source, custom=custom,
        description=description, replace=replace, registry=registry,
    )  # fmt: skip


def _is_table(value: Any) -> bool:
    if isinstance(value, pd.DataFrame):
        return True
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and bool(value)
        and all(isinstance(row, Mapping) for row in value)
    )


def _records(table: pd.DataFrame | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(table, pd.DataFrame):
        frame = table.astype(object).where(table.notna(), None)
        return [dict(row) for row in frame.to_dict("records")]
    return [dict(row) for row in table]


def describe_model_configs(name: str, registry: Registry | str | None = None) -> pd.DataFrame:
    """A stored model selection table by name (see :func:`model_configs`).

    Parameters
    ----------
    name : str
        The table's name.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one (``dvml.registry.url``).

    Returns
    -------
    pandas.DataFrame
        Columns ``mst_key``, ``model_id``, ``compile_params``, ``fit_params``; ``attrs`` has
        ``name``, ``search``, ``seed``, ``description`` and ``custom_objects``.

    Raises
    ------
    RegistryNotFoundError
        When no table has this name.
    """
    with opened_registry(registry) as reg:
        return reg.model_selection(name)


def list_model_configs(registry: Registry | str | None = None) -> pd.DataFrame:
    """The stored model selection tables.

    Parameters
    ----------
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Returns
    -------
    pandas.DataFrame
        One row per table: ``name``, ``n_configs``, ``search``, ``seed``, ``description``,
        ``created_at``.
    """
    with opened_registry(registry) as reg:
        return reg.list_model_selections()


def drop_model_configs(name: str, registry: Registry | str | None = None) -> None:
    """Remove a stored model selection table (models trained from it stay).

    Parameters
    ----------
    name : str
        The table's name.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Raises
    ------
    RegistryNotFoundError
        When no table has this name.
    """
    with opened_registry(registry) as reg:
        reg.drop_model_selection(name)


# Deprecated names (docs/architecture.md, "Verbs of the public API"), kept for one release.
load_model_configs = renamed(
    describe_model_configs, "dvml.load_model_configs", "dvml.describe_model_configs"
)
delete_model_configs = renamed(
    drop_model_configs, "dvml.delete_model_configs", "dvml.drop_model_configs"
)


def resolve_model_configs(
    configs: str | pd.DataFrame | Sequence[Mapping[str, Any]],
    registry: Registry | str | None = None,
    custom_objects: Collection[str] | None = None,
) -> pd.DataFrame:
    """The checked table of configurations that ``configs`` gives, for training.

    Parameters
    ----------
    configs : str, DataFrame or list of dict
        A stored table's name (:func:`model_configs`), or the rows themselves (checked as
        :func:`model_selection_table` does, not stored).
    custom_objects : list of str, optional
        Custom loss/metric names; default: those stored with a named table.

    Returns
    -------
    pandas.DataFrame
        Columns ``mst_key``, ``model_id``, ``compile_params``, ``fit_params``; ``attrs`` has
        ``name`` (None for rows given directly) and ``custom_objects``. Every ``model_id`` is
        an architecture in the registry.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        On rows that :func:`model_selection_table` would refuse.
    RegistryNotFoundError
        On an unknown table name or architecture id.
    """
    with opened_registry(registry) as reg:
        checked, attrs = checked_configs(configs, reg, custom_objects)
    result = _frame(checked)
    result.attrs.update(attrs)
    return result


def checked_configs(
    configs: str | pd.DataFrame | Sequence[Mapping[str, Any]],
    reg: Registry,
    custom_objects: Collection[str] | None = None,
) -> tuple[list[ModelConfig], dict[str, Any]]:
    """The rows that ``configs`` gives, checked once (:func:`dvml.configs.check_config_rows`),
    and the table's ``attrs`` (with ``custom_objects``): what :func:`resolve_model_configs`
    returns as a DataFrame, for ``fit_multiple``, which trains the rows as they are.

    Raises
    ------
    ArgumentError, ArgumentTypeError, RegistryNotFoundError
        As :func:`resolve_model_configs`.
    """
    if isinstance(configs, str):
        frame = reg.model_selection(configs)
        custom = _custom_names(custom_objects) or list(frame.attrs["custom_objects"])
        # Checked again: a table written by an older dvml (or edited) must still parse.
        checked = cs.check_config_rows(_records(frame), custom)
        attrs = dict(frame.attrs)
    elif _is_table(configs):
        custom = _custom_names(custom_objects)
        checked = cs.check_config_rows(_records(configs), custom)
        attrs = {"name": None, "search": None, "seed": None, "description": None}
    else:
        raise ArgumentTypeError(
            f"configs must be the name of a model selection table, a DataFrame or a list "
            f"of dicts. Received: {type(configs).__name__} {configs!r:.80}. Build one with "
            "dvml.model_configs(...)."
        )
    for model_id in sorted({c.model_id for c in checked}):
        reg.get_architecture(model_id)  # RegistryNotFoundError names the id
    return checked, {**attrs, "custom_objects": custom}
