"""One model configuration, MADlib's model selection row, and the one check of such rows.

A model configuration is one row of MADlib's model selection table: ``mst_key`` (1, 2, ...),
``model_id`` (an architecture id), ``compile_params`` and ``fit_params`` (MADlib-style
strings). :class:`ModelConfig` is that row, the one type that ``model_configs``,
``model_selection_table``, ``fit_multiple``, the searches and the registry pass around;
:func:`check_config_rows` is the one check of rows a user wrote or a table holds, with the one
``mst_key`` rule (:func:`check_mst_key`). A :class:`ModelConfig` is a checked row: the registry
stores it as it is handed. Every parameter string is parsed before a row is returned, so that a
configuration a trainer would refuse is refused here, naming the row; strings a user wrote are
kept as written (MADlib keeps the text), parameters equal once parsed count as one. Pure.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from dvml.configs.compile_params import parse_compile_params
from dvml.configs.fit_params import parse_fit_params
from dvml.configs.grids import MAX_CONFIGS
from dvml.configs.param_text import format_params, params_key, params_text
from dvml.exceptions import ArgumentError, ArgumentTypeError, ParameterError

__all__ = [
    "COLUMNS",
    "ConfigTable",
    "ModelConfig",
    "canonical_texts",
    "check_arch_ids",
    "check_config_rows",
    "check_mst_key",
    "kept_texts",
    "parsed_compile",
    "refused",
]

COLUMNS = ("mst_key", "model_id", "compile_params", "fit_params")
"""The columns of a model selection table, in MADlib's order."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One row of a model selection table, checked (:func:`check_config_rows`).

    Attributes
    ----------
    mst_key : int
        The row's key, a positive integer distinct within its table.
    model_id : int
        The architecture's id in the registry.
    compile_params, fit_params : str
        MADlib-style parameter strings that parse (as written, or in canonical form when
        generated from a grid).
    """

    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str

    def as_dict(self) -> dict[str, Any]:
        """The row as a dict of :data:`COLUMNS`."""
        return dataclasses.asdict(self)


def check_mst_key(value: Any, where: str) -> int:
    """The one ``mst_key`` rule: a positive integer (Python's or numpy's, never a bool).

    Raises
    ------
    ArgumentError
        Naming ``where`` and the value received.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ArgumentError(
            f"{where}: mst_key must be a positive integer. Received: mst_key={value!r}. "
            "Number the rows 1, 2, ... or leave mst_key out of every row."
        )
    return int(value)


def _listing(value: Any) -> bool:
    """A list-like of items: not a string, bytes or a mapping (which iterates its keys)."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def check_arch_ids(arch_ids: Any) -> list[int]:
    """``arch_ids`` as a sorted list of distinct ints (MADlib sorts and de-duplicates them).

    Raises
    ------
    ArgumentTypeError, ArgumentError
        When it is not an int or a non-empty list of ints.
    """
    items = [arch_ids] if isinstance(arch_ids, numbers.Integral) else arch_ids
    if not _listing(items):
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


def parsed_compile(
    compile_params: str | Mapping[str, Any], custom_names: Collection[str]
) -> dict[str, Any]:
    """Compile parameters parsed, with a loss (a configuration without one cannot train).

    Raises
    ------
    ParameterError
        As :func:`~dvml.configs.compile_params.parse_compile_params` does, or when no loss is
        given.
    """
    compiled = parse_compile_params(compile_params, custom_names=custom_names)
    if "loss" not in compiled:
        raise ParameterError(
            "The compile parameters give no loss, so the model cannot be trained. Received: "
            f"{compile_params!r:.120}. Add loss='categorical_crossentropy' (or another loss)."
        )
    return compiled


def canonical_texts(
    compile_params: str | Mapping[str, Any],
    fit_params: str | Mapping[str, Any] | None,
    custom_names: Collection[str],
    source: tuple[str, str] = ("compile_params_grid", "fit_params_grid"),
) -> tuple[str, str]:
    """Both parameter sets parsed and written back in canonical form (for generated rows).

    Raises
    ------
    ArgumentError
        Naming the grid (``source``: the compile one, the fit one) and the configuration
        that the parser refused (:func:`refused`).
    """
    try:
        compile_text = format_params(parsed_compile(compile_params, custom_names))
    except ParameterError as exc:
        raise refused(exc, source[0], compile_params, fit_params) from None
    try:
        return compile_text, format_params(parse_fit_params(fit_params))
    except ParameterError as exc:
        raise refused(exc, source[1], compile_params, fit_params) from None


def refused(exc: ParameterError, source: str, compile_text: Any, fit_text: Any) -> ArgumentError:
    """The error for a generated configuration the parser refused, naming where it came from."""
    parts = [
        f"{key}={_shown(value)!r:.200}"
        for key, value in (("compile_params", compile_text), ("fit_params", fit_text))
        if value is not None
    ]
    return ArgumentError(
        f"A configuration from {source} is refused: {exc} Configuration: {', '.join(parts)}. "
        f"Fix that entry of {source}."
    )


def _shown(params: Any) -> Any:
    if isinstance(params, Mapping):
        try:
            return format_params(params)
        except ParameterError:
            return params
    return params


class ConfigTable:
    """Rows in order, without duplicates; mst_key numbers them from 1.

    A row is a duplicate when its parameters are equal once parsed, whatever their key order
    or spacing (MADlib's test); the first text given is the one kept.
    """

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str, str], tuple[int, str, str]] = {}

    def add(
        self, model_id: int, compile_text: str, fit_text: str, key: tuple[str, str] | None = None
    ) -> bool:
        """Add a row unless an equal one is there; whether it was added."""
        row = (model_id, *(key or (compile_text, fit_text)))
        if row in self.rows:
            return False
        self.rows[row] = (model_id, compile_text, fit_text)
        return True

    def configs(self) -> list[ModelConfig]:
        """The rows, numbered from 1 in the order they were added."""
        return [ModelConfig(i, *row) for i, row in enumerate(self.rows.values(), start=1)]


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
        As :func:`dvml.configs.compile_params.parse_compile_params` / ``parse_fit_params`` do.
    """
    compiled = parsed_compile(compile_params, custom_names)
    fitted = parse_fit_params(fit_params)
    texts = (params_text(compile_params, compiled), params_text(fit_params, fitted))
    return texts, (params_key(compiled), params_key(fitted))


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


def _row_list(rows: Any) -> list[Any]:
    if not _listing(rows):
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
    if len(items) > MAX_CONFIGS:
        raise ArgumentError(
            f"The table has {len(items)} rows, more than {MAX_CONFIGS}. Give fewer rows."
        )
    return items


def _mst_keys(items: list[Any]) -> list[int]:
    """Every row's mst_key: as given in every row (distinct), or 1, 2, ... in none."""
    given = [i for i, row in enumerate(items) if row.get("mst_key") is not None]
    if not given:
        return list(range(1, len(items) + 1))
    if len(given) < len(items):
        raise ArgumentError(
            f"mst_key is given in {len(given)} of {len(items)} rows. Received: some rows "
            "without mst_key. Give it in every row, or in none (then rows are numbered from 1)."
        )
    keys: list[int] = []
    seen: dict[int, int] = {}
    for i, row in enumerate(items):
        key = check_mst_key(row["mst_key"], f"row {i}")
        if key in seen:
            raise ArgumentError(
                f"row {i} repeats mst_key={key} of row {seen[key]}. Received: mst_key={key} "
                "twice. Give every row its own mst_key, or none."
            )
        seen[key] = i
        keys.append(key)
    return keys


def check_config_rows(
    rows: Iterable[Mapping[str, Any]], custom_names: Collection[str] = ()
) -> list[ModelConfig]:
    """Check a model selection table: the rows as :class:`ModelConfig`, sorted by ``mst_key``.

    The one check of model selection rows: rows a user wrote (``model_selection_table``),
    rows given to ``fit_multiple`` and a stored table read back all go through it once.

    Parameters
    ----------
    rows : iterable of dict
        Each with ``model_id``, ``compile_params`` (str or dict), ``fit_params`` (str, dict or
        None) and optionally ``mst_key`` (all rows or none; numbered from 1 when absent).
    custom_names : collection of str
        Custom loss/metric names the configurations may use.

    Returns
    -------
    list of ModelConfig
        Parameter strings as written (a dict is written in canonical form).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the row: a missing or unknown column, a bad id, an ``mst_key`` that is not a
        positive integer or repeats, two equal configurations, or parameters the parser
        refuses.
    """
    items = _row_list(rows)
    required = set(COLUMNS) - {"mst_key"}
    checked = [_checked_row(f"row {i}", row, required, custom_names) for i, row in enumerate(items)]
    keys = _mst_keys(items)
    configs = []
    seen: dict[tuple[int, str, str], int] = {}
    for i, (model_id, (compile_text, fit_text), params) in enumerate(checked):
        triple = (model_id, *params)  # equal parameters in any key order are the same row
        if triple in seen:
            raise ArgumentError(
                f"row {i} is the same configuration as row {seen[triple]}. Received: "
                f"model_id={model_id}, compile_params={compile_text!r:.120}, fit_params="
                f"{fit_text!r}. Remove one of them."
            )
        seen[triple] = i
        configs.append(ModelConfig(keys[i], model_id, compile_text, fit_text))
    return sorted(configs, key=lambda c: c.mst_key)
