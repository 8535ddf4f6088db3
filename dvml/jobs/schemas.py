"""The schemas of dvml's YAML job files, shared by ``dvml fit|evaluate|predict --config`` and
the scheduled workflows (``workflows/retrain.py``, ``workflows/feature_refresh.py``).

One file can drive all of them: the CLI reads the sections it needs and the workflow the rest
(``promotion`` is read by the retrain workflow only, ``predict`` by ``dvml predict`` only).
``dvml fit-multiple --config`` reads :data:`FIT_MULTIPLE_SCHEMA` (the same ``data`` and
``validation`` sections, a ``model_selection`` grid checked by the parameter parser when the
file is loaded, and ``fit_multiple``); ``dvml model-configs generate --config`` reads
:data:`MODEL_CONFIGS_SCHEMA`. ``python -m dvml.jobs.schemas`` prints every schema. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any, cast

from dvml import configs
from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.jobs.yaml_schema import Field, Schema, Section, describe
from dvml.limits import (
    MAX_BUFFER_ROWS,
    MAX_ITERATIONS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    count_problem,
    seconds_problem,
)

__all__ = [
    "AUTOML_SCHEMA",
    "FEATURE_REFRESH_SCHEMA",
    "FIT_MULTIPLE_SCHEMA",
    "JOB_SCHEMA",
    "MODEL_CONFIGS_SCHEMA",
    "NAME_PATTERN",
    "SKLEARN_SOURCES",
    "planned_configs",
]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
SKLEARN_SOURCES = ("sklearn:digits",)


def _name(value: Any) -> str | None:
    if not NAME_PATTERN.match(value):
        return (
            "must start with a letter or digit and hold only letters, digits, '_', '.' and '-' "
            "(at most 100 characters): it names models, datasets and files"
        )
    return None


def _finite(value: Any) -> bool:
    # An int of 400 digits is a valid YAML int that math.isfinite cannot convert.
    return isinstance(value, int) or math.isfinite(value)


def _positive(value: Any) -> str | None:
    if not (_finite(value) and 0 < value < 1e300):
        return "must be a positive number below 1e300"
    return None


def _at_least_one(value: Any) -> str | None:
    # Every count of a job file (rows, batches, classes) fits an int32: far beyond real use,
    # and a bigger one would allocate or loop until the memory or the time runs out.
    return count_problem(value, 1, MAX_BUFFER_ROWS)


def _workers(value: Any) -> str | None:
    return count_problem(value, 1, MAX_WORKERS)


def _iterations(value: Any) -> str | None:
    return count_problem(value, 1, MAX_ITERATIONS)


def _seed(value: Any) -> str | None:
    return count_problem(value, 0, MAX_SEED)


def _seconds(value: Any) -> str | None:
    return seconds_problem(value, MAX_TIMEOUT_S)


def _not_negative(value: Any) -> str | None:
    return "must be 0 or more" if not (_finite(value) and 0 <= value < 1e300) else None


def _fraction(value: Any) -> str | None:
    return "must be a fraction between 0 and 1 (exclusive), e.g. 0.2" if not 0 < value < 1 else None


def _two_or_more(value: Any) -> str | None:
    return "must be 2 or more" if value < 2 else None


def _data_check(section: dict[str, Any]) -> str | None:
    if section.get("append") and str(section["source"]).startswith("sklearn:"):
        return (
            "data.append: true appends the new files of a directory or glob of Parquet/CSV "
            f"files. Received: data.source={section['source']!r}. Name such files, or remove "
            "data.append"
        )
    return None


def _image_size(value: Any) -> str | None:
    ok = len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    )
    return None if ok else "must be [height, width], two positive integers"


def _x_columns(value: Any) -> str | None:
    if isinstance(value, str):
        return None
    for item in value:
        group = [item] if isinstance(item, str) else item
        if not isinstance(group, list) or not group or not all(isinstance(c, str) for c in group):
            return "must be a column name, a list of names or a list of lists of names"
    return None if value else "must not be empty"


def _names(value: Any) -> str | None:
    return None if all(isinstance(v, str) for v in value) else "must be a list of names"


def _rules(value: Any) -> str | None:
    return None if isinstance(value, str) else _names(value)


def _cluster_check(section: dict[str, Any]) -> str | None:
    if section["scheduler"] is not None and section["local"] is not None:
        return (
            "give either 'cluster.scheduler' (attach to a running cluster) or 'cluster.local' "
            "(start one for this run), not both. Received: both. Remove one of them"
        )
    return None


def _validation_check(section: dict[str, Any]) -> str | None:
    if section["source"] is not None and section["split"] is not None:
        return (
            "give either 'validation.source' or 'validation.split', not both. Received: "
            f"source={section['source']!r}, split={section['split']!r}. Remove one of them"
        )
    return None


def _common() -> dict[str, Field | Section]:
    """Keys every job file has: its name, the cluster, the registry, the state directory."""
    local = Section(
        {
            "n_workers": Field(int, default=2, help="Dask workers", check=_workers),
            "vineyard_memory": Field(str, help="shared memory of each vineyardd, e.g. 512MiB"),
            "hosts": Field(int, help="simulated hosts (default: one per worker)", check=_workers),
            "start_timeout": Field(float, help="seconds to wait for each daemon", check=_seconds),
        },
        optional=True,
        help="start a LocalCluster for this run and stop it afterwards",
    )
    return {
        "name": Field(
            str,
            required=True,
            check=_name,
            help="the job's name: models and datasets are named after it (<name>, <name>-train)",
        ),
        "description": Field(str, help="free text stored with the model"),
        "schedule": Field(str, help="when it runs, e.g. a cron expression (documentation only)"),
        "state_dir": Field(
            str,
            help="where workflows keep their lock, journal and state (default: "
            "<dvml cluster.state-dir>/workflows)",
        ),
        "registry": Field(str, help="SQLAlchemy URL of the model registry (default: config)"),
        "cluster": Section(
            {
                "scheduler": Field(str, help="address of a running scheduler, tcp://host:8786"),
                "local": local,
                "timeout": Field(
                    float, default=30.0, check=_seconds, help="seconds to wait for the scheduler"
                ),
            },
            check=_cluster_check,
            help="scheduler or local; neither: the cluster recorded by `dvml cluster up`",
        ),
    }


DEFAULT_FIT_PARAMS = "batch_size=32, epochs=1"


def _from_selection_check(section: dict[str, Any]) -> str | None:
    """``model.from_selection`` replaces the architecture and its parameters; else both needed."""
    if section.get("from_selection") is not None:
        given = [k for k in ("architecture", "compile_params", "fit_params") if section.get(k)]
        if given:
            return (
                f"give either 'model.from_selection' or {', '.join(repr(k) for k in given)}, "
                "not both: the best configuration of the stored fit_multiple run brings its "
                f"own architecture, compile_params and fit_params. Received: "
                f"from_selection={section['from_selection']!r}. Remove one of them"
            )
        return None
    missing = [k for k in ("architecture", "compile_params") if section.get(k) is None]
    if missing:
        return (
            f"'model' needs {' and '.join(repr(k) for k in missing)} (or 'from_selection', "
            "the name of a stored fit_multiple run whose best configuration is retrained). "
            f"Received: {sorted(k for k, v in section.items() if v is not None)}"
        )
    return None


def _params_problem(section: dict[str, Any], prefix: str) -> str | None:
    """Parse the section's compile and fit parameters as a real run does (``dvml.fit``).

    Checked when the file loads, so ``--dry-run`` refuses what a run would refuse only after
    packing the data. The parsers are pure and never evaluate the strings.
    """
    from dvml.configs import parse_compile_params, parse_fit_params
    from dvml.exceptions import ParameterError

    custom = [n for n in section.get("custom_objects") or [] if isinstance(n, str)]
    try:
        if section.get("compile_params") is not None:
            parse_compile_params(section["compile_params"], custom_names=custom)
    except ParameterError as exc:
        return f"'{prefix}.compile_params' is not valid: {exc}"
    try:
        if section.get("fit_params") is not None:
            parse_fit_params(section["fit_params"])
    except ParameterError as exc:
        return f"'{prefix}.fit_params' is not valid: {exc}"
    return None


def _model_check(prefix: str, selectable: bool) -> Callable[[dict[str, Any]], str | None]:
    def check(section: dict[str, Any]) -> str | None:
        problem = _from_selection_check(section) if selectable else None
        return problem or _params_problem(section, prefix)

    return check


def _model(architecture_help: str, selectable: bool = False, prefix: str = "model") -> Section:
    """A model section; ``selectable``: it may name a fit_multiple run instead (retrain jobs)."""
    extra: dict[str, Field | Section] = {}
    if selectable:
        extra["from_selection"] = Field(
            str,
            check=_name,
            help="retrain the best configuration (highest final validation metric, "
            "ModelSelection.best()) of this stored fit_multiple run (its model_output) "
            "instead of architecture/compile_params/fit_params",
        )
    return Section(
        {
            "architecture": Field(
                (int, str),
                required=not selectable,
                help=architecture_help,
            ),
            "compile_params": Field(
                (str, dict),
                required=not selectable,
                help="compile parameters, e.g. \"loss='categorical_crossentropy', "
                "optimizer='adam', metrics=['accuracy']\"",
            ),
            "fit_params": Field(
                (str, dict),
                default=None if selectable else DEFAULT_FIT_PARAMS,
                help="fit parameters; batch_size is the global batch (default "
                f"{DEFAULT_FIT_PARAMS!r})",
            ),
            **extra,
            "num_iterations": Field(int, default=1, check=_iterations, help="fit iterations"),
            "metrics_compute_frequency": Field(
                int, check=_iterations, help="compute metrics every N iterations"
            ),
            "use_gpus": Field(bool, default=False, help="train on the trainers' GPUs"),
            "warm_start": Field(
                bool, default=True, help="start from the weights of the existing model"
            ),
            "custom_objects": Field(
                list, default=[], check=_names, help="registered custom losses/metrics"
            ),
        },
        required=True,
        check=_model_check(prefix, selectable),
        help="the architecture and how to train it",
    )


_ARCHITECTURE_HELP = (
    "an architecture id in the registry, the path of a Keras JSON file, or builtin:digits-cnn"
)

JOB_SCHEMA: Schema = {
    **_common(),
    "data": Section(
        {
            "source": Field(
                str,
                required=True,
                help="the training data: sklearn:digits, or a path or fsspec URL (s3://..., read "
                "with dvml.storage-options) of Parquet/CSV data (a glob: the newest match), a "
                "directory (read by what it holds), an image folder, or tar shards "
                "(shard-{0000..0147}.tar, shard-%06d.tar)",
            ),
            "x": Field((str, list), check=_x_columns, help="the feature column(s)"),
            "y": Field(str, help="the label column"),
            "normalizing_const": Field(
                float, default=1.0, check=_positive, help="x is divided by this"
            ),
            "num_classes": Field(int, check=_at_least_one, help="length of the one-hot labels"),
            "buffer_size": Field(int, check=_at_least_one, help="rows per packed buffer"),
            "distribution_rules": Field(
                (str, list), default="all_workers", check=_rules, help="which workers hold the data"
            ),
            "image_size": Field(list, check=_image_size, help="[height, width] for image sources"),
            "channels": Field(
                int, choices=(1, 3), help="1 or 3 for image sources (default: the first image's)"
            ),
            "on_invalid": Field(
                str,
                default="raise",
                choices=("raise", "drop"),
                help="what to do with rows holding NaN or inf",
            ),
            "seed": Field(int, default=0, check=_seed, help="shuffle and split seed"),
            "append": Field(
                bool,
                default=False,
                help="retrain workflow: data.source is a directory or glob of Parquet/CSV files "
                "that grows; each run appends only the files it has not seen (a new dataset "
                "version) instead of repacking them all (`dvml fit --config` refuses it)",
            ),
        },
        required=True,
        check=_data_check,
        help="the training data and how to preprocess it",
    ),
    "drift": Section(
        {
            "fail_above": Field(
                float,
                check=_not_negative,
                help="refuse an append (nothing written) when a feature's PSI is above this "
                "(default: report only)",
            ),
            "bins": Field(int, default=10, check=_two_or_more, help="bins per feature"),
        },
        help="retrain workflow with data.append: the new rows' drift against the old, per "
        "feature (population stability index)",
    ),
    "validation": Section(
        {
            "source": Field(str, help="validation data (same forms as data.source)"),
            "split": Field(
                float,
                check=_fraction,
                help="fraction of a table data.source held out (default 0.2); image data needs "
                "validation.source",
            ),
        },
        check=_validation_check,
        help="source or split; the default holds out 0.2 of a table source",
    ),
    "model": _model(_ARCHITECTURE_HELP, selectable=True),
    "promotion": Section(
        {
            "metric": Field(
                str, default="loss", help="'loss' or a compiled metric such as 'accuracy'"
            ),
            "mode": Field(
                str,
                default="auto",
                choices=("auto", "min", "max"),
                help="lower or higher is better (auto: min for loss, max otherwise)",
            ),
            "min_delta": Field(
                float,
                default=0.0,
                check=_not_negative,
                help="how much better the candidate must be",
            ),
        },
        help="when the retrain workflow promotes a candidate to production",
    ),
    "evaluate": Section(
        {
            "model": Field(str, help="model to evaluate (default: <name>)"),
            "dataset": Field(str, help="packed dataset (default: <name>-val)"),
            "batch_size": Field(int, default=256, check=_at_least_one, help="batch per worker"),
        },
        help="read by `dvml evaluate --config`",
    ),
    "predict": Section(
        {
            "model": Field(str, help="model to predict with (default: <name>)"),
            "source": Field(str, help="raw rows to predict (default: data.source)"),
            "id": Field(str, default="id", help="the id column"),
            "x": Field((str, list), check=_x_columns, help="feature column(s) (default: data.x)"),
            "pred_type": Field(
                (str, int, float),
                default="response",
                help="'response', 'prob', top k (int) or a threshold (float)",
            ),
            "output": Field(str, help="write predictions to this .csv or .parquet file"),
        },
        help="read by `dvml predict --config`",
    ),
}

# The data section of the other job files: appends are the retrain workflow's.
_JOB_DATA = cast(Section, JOB_SCHEMA["data"])
_SHARED_DATA = dataclasses.replace(
    _JOB_DATA, fields={k: v for k, v in _JOB_DATA.fields.items() if k != "append"}, check=None
)

FEATURE_REFRESH_SCHEMA: Schema = {
    **_common(),
    "images": Section(
        {
            "source": Field(
                str,
                required=True,
                help="an image folder (one sub-folder per label) or tar shards; with a glob the "
                "newest match is used",
            ),
            "image_size": Field(
                list, required=True, check=_image_size, help="[height, width] images are resized to"
            ),
            "channels": Field(int, default=3, choices=(1, 3), help="1 (grey) or 3 (RGB)"),
            "normalizing_const": Field(
                float, default=255.0, check=_positive, help="pixels are divided by this"
            ),
            "distribution_rules": Field(
                (str, list),
                default="all_workers",
                check=_rules,
                help="which workers hold the images",
            ),
            "buffer_size": Field(int, check=_at_least_one, help="rows per packed buffer"),
            "seed": Field(int, default=0, check=_seed, help="shuffle seed"),
            "validation_source": Field(str, help="validation images for the head (optional)"),
        },
        required=True,
        help="the images to compute features for",
    ),
    "backbone": Section(
        {
            "model": Field(
                (int, str, dict),
                required=True,
                help="an architecture id with weights, a Keras application name, or "
                "{application, weights, kwargs, seed}",
            ),
            "layer": Field(str, help="the layer whose output is the features (default: output)"),
            "pooling": Field(str, choices=("avg", "max"), help="global pooling of that output"),
            "batch_size": Field(int, default=64, check=_at_least_one, help="images per batch"),
            "use_gpus": Field(bool, default=False, help="run the backbone on GPUs"),
        },
        required=True,
        help="the backbone that computes the features",
    ),
    "head": Section(
        {
            **_model(
                "an architecture id or the path of a Keras JSON file taking the features"
            ).fields,
        },
        check=_model_check("head", False),
        optional=True,
        help="optionally fine-tune a head on the features (model <name>-head)",
    ),
}


# --------------------------------------------------------------------------- model selection


def _architectures(value: Any) -> str | None:
    ok = value and all(
        isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in value
    )
    return None if ok else "must be a non-empty list of architecture ids, paths or builtin:..."


def planned_configs(section: dict[str, Any]) -> list[configs.ModelConfig]:
    """The configurations a ``model_selection`` section generates, before any registry exists.

    ``model_id`` is the 1-based position of the architecture in ``architectures`` (the ids are
    only known once the architectures are registered).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        As :func:`dvml.configs.plan_configs`.
    """
    positions = list(range(1, len(section["architectures"]) + 1))
    return configs.plan_configs(
        positions,
        section["compile_params_grid"],
        section["fit_params_grid"],
        section["search"],
        section["num_configs"],
        section["seed"],
        section["custom_objects"],
    )


_GRID_KEYS = ("architectures", "compile_params_grid", "fit_params_grid", "num_configs", "seed")


def _selection_check(section: dict[str, Any]) -> str | None:
    given = [k for k in _GRID_KEYS if section.get(k) not in (None, [])]
    if section.get("table") is not None:
        if given:
            return (
                "give either 'model_selection.table' (a stored model selection table) or the "
                f"grids, not both. Received: table={section['table']!r} and {given}. Remove one"
            )
        return None
    if not section["architectures"] or section["compile_params_grid"] is None:
        return (
            "'model_selection' needs 'table' (a stored table's name) or 'architectures' and "
            f"'compile_params_grid'. Received: {given or 'none of them'}. Add them"
        )
    try:
        planned_configs(section)
    except (ArgumentError, ArgumentTypeError) as exc:
        return f"model_selection is refused: {str(exc).rstrip('.')}"
    return None


def _selection_fields() -> dict[str, Field | Section]:
    return {
        "architectures": Field(
            list,
            check=_architectures,
            help="architecture ids in the registry, Keras JSON files or builtin:digits-cnn",
        ),
        "compile_params_grid": Field(
            (str, dict),
            help="compile parameter -> list of choices (MADlib's generate_model_configs), e.g. "
            "{loss: [categorical_crossentropy], optimizer_params_list: [{optimizer: [Adam], "
            "lr: [0.001, 0.01]}], metrics: [accuracy]}",
        ),
        "fit_params_grid": Field(
            (str, dict), help="fit parameter -> list of choices, e.g. {batch_size: [8, 16]}"
        ),
        "search": Field(
            str, default="grid", choices=configs.SEARCHES, help="every combination or samples"
        ),
        "num_configs": Field(int, check=_at_least_one, help="random search: how many"),
        "seed": Field(int, check=_seed, help="random search: the same seed gives the same table"),
        "custom_objects": Field(
            list, default=[], check=_names, help="registered custom losses/metrics"
        ),
    }


def _grid_check(section: dict[str, Any]) -> str | None:
    return _selection_check({**section, "table": None})


MODEL_CONFIGS_SCHEMA: Schema = {
    "name": Field(str, check=_name, help="the table's name (default: configs-<content hash>)"),
    "description": Field(str, help="free text stored with the table"),
    "registry": Field(str, help="SQLAlchemy URL of the model registry (default: config)"),
    "model_selection": Section(
        _selection_fields(),
        required=True,
        check=_grid_check,
        help="architectures and grids, as in a `dvml fit-multiple` job file",
    ),
}

FIT_MULTIPLE_SCHEMA: Schema = {
    **_common(),
    "data": _SHARED_DATA,
    "validation": JOB_SCHEMA["validation"],
    "model_selection": Section(
        {
            "table": Field(str, help="a stored model selection table (dvml.model_configs)"),
            **_selection_fields(),
        },
        required=True,
        check=_selection_check,
        help="the configurations: a stored table, or architectures and grids",
    ),
    "fit_multiple": Section(
        {
            "model_output": Field(
                str, check=_name, help="output name of the trained models (default: <name>)"
            ),
            "num_iterations": Field(int, default=1, check=_iterations, help="iterations"),
            "use_gpus": Field(bool, default=False, help="train on the workers' GPUs"),
            "metrics_compute_frequency": Field(
                int, check=_iterations, help="compute metrics every N iterations"
            ),
            "warm_start": Field(
                bool, default=False, help="start from the models of a previous run"
            ),
        },
        help="how to train every configuration (dvml.fit_multiple)",
    ),
}


def _automl_check(section: dict[str, Any]) -> str | None:
    from dvml.search.automl_params import parse_automl_params

    try:
        parse_automl_params(section["method"], section["params"])
    except (ArgumentError, ArgumentTypeError) as exc:
        return f"automl is refused: {str(exc).rstrip('.')}"
    return None


def _space_check(section: dict[str, Any]) -> str | None:
    from dvml.configs.search_space import SearchSpace

    if not section["architectures"] or section["compile_params_grid"] is None:
        return (
            "'model_selection' needs 'architectures' and 'compile_params_grid'. Received: "
            f"{[k for k in _GRID_KEYS if section.get(k) not in (None, [])] or 'none of them'}. "
            "Add them"
        )
    try:
        positions = list(range(1, len(section["architectures"]) + 1))
        SearchSpace(positions, section["compile_params_grid"], section["fit_params_grid"],
                    section["custom_objects"])  # fmt: skip
    except (ArgumentError, ArgumentTypeError) as exc:
        return f"model_selection is refused: {str(exc).rstrip('.')}"
    return None


_SPACE_FIELDS = {
    k: v
    for k, v in _selection_fields().items()
    if k in ("architectures", "compile_params_grid", "fit_params_grid", "custom_objects")
}

AUTOML_SCHEMA: Schema = {
    **_common(),
    "data": _SHARED_DATA,
    "validation": JOB_SCHEMA["validation"],
    "model_selection": Section(
        _SPACE_FIELDS,
        required=True,
        check=_space_check,
        help="architectures and MADlib grids; ranges [lo, hi, 'linear'|'log'|'log_near_one']",
    ),
    "automl": Section(
        {
            "model_output": Field(str, check=_name, help="the search's name (default: <name>)"),
            "method": Field(
                str,
                default="hyperband",
                choices=("hyperband", "hyperopt", "asha"),
                help="MADlib's hyperband or hyperopt, or asha",
            ),
            "params": Field(
                str,
                help="MADlib's automl_params, e.g. 'R=6, eta=3, skip_last=0', "
                "'num_configs=20, num_iterations=5, algorithm=rand' or 'max_t=9, eta=3, "
                "grace_period=1, max_configs=16, sampler=random'",
            ),
            "seed": Field(int, help="the sampler's seed (MADlib's random_state)"),
            "use_gpus": Field(bool, default=False, help="train on the workers' GPUs"),
            "metrics_compute_frequency": Field(
                int, check=_at_least_one, help="compute metrics every N iterations"
            ),
        },
        check=_automl_check,
        help="the search (dvml.automl)",
    ),
}


if __name__ == "__main__":  # pragma: no cover - documentation helper
    print("# dvml fit|evaluate|predict --config and workflows/retrain.py\n")
    print(describe(JOB_SCHEMA))
    print("\n# workflows/feature_refresh.py\n")
    print(describe(FEATURE_REFRESH_SCHEMA))
    print("\n# dvml fit-multiple --config\n")
    print(describe(FIT_MULTIPLE_SCHEMA))
    print("\n# dvml automl --config\n")
    print(describe(AUTOML_SCHEMA))
    print("\n# dvml model-configs generate --config\n")
    print(describe(MODEL_CONFIGS_SCHEMA))
