"""``dvml model-configs generate|list|show|delete``: model selection tables in the registry.

``generate`` is MADlib's ``generate_model_configs``: architectures and grids from a YAML file
(``--config``, the ``model_selection`` section of a ``dvml fit-multiple`` job file) or from
flags (grids in MADlib's text form). No cluster is needed.
"""

from __future__ import annotations

import argparse
from typing import Any

from dvml.cli._cluster_options import add_json_option, print_json
from dvml.cli._common import add_alias, add_command, add_group, format_table

__all__ = ["register"]

_LIST_COLUMNS = ["name", "n_configs", "search", "seed", "description", "created_at"]


def _add_registry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry", default=None, metavar="URL",
        help="SQLAlchemy URL of the registry (default: the config file's, else config "
        "dvml.registry.url, else ~/.dvml/registry.db).",
    )  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``model-configs`` group to the top-level ``dvml`` parser."""
    _, commands = add_group(
        subparsers,
        "model-configs",
        help="generate, list, describe and drop model selection tables (MADlib's model "
        "configurations).",
        description="Model selection tables: one row per configuration (mst_key, model_id, "
        "compile_params, fit_params) that `dvml fit-multiple` trains at once. Stored in the "
        "model registry; no cluster is needed.",
    )
    generate = add_command(
        commands, "generate", _generate,
        help="generate configurations by grid or random search and store them.",
        description="Generate a model selection table (MADlib's generate_model_configs) from "
        "--config FILE (keys: name, description, registry, model_selection: {architectures, "
        "compile_params_grid, fit_params_grid, search, num_configs, seed, custom_objects}) or "
        "from the flags below. Every parameter string is checked before anything is stored.",
    )  # fmt: skip
    generate.add_argument("--config", default=None, metavar="FILE", help="a YAML file.")
    generate.add_argument(
        "--architecture", action="append", default=None, metavar="SPEC",
        help="an architecture id, a Keras JSON file or builtin:digits-cnn (repeat for more).",
    )  # fmt: skip
    generate.add_argument(
        "--compile-grid", default=None, metavar="TEXT",
        help="the compile grid in MADlib's form, e.g. \"{'loss': ['categorical_crossentropy'], "
        "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}]}\".",
    )  # fmt: skip
    generate.add_argument(
        "--fit-grid", default=None, metavar="TEXT",
        help="the fit grid, e.g. \"{'batch_size': [8, 16], 'epochs': [1]}\".",
    )  # fmt: skip
    generate.add_argument("--search", default=None, choices=("grid", "random"))
    generate.add_argument("--num-configs", type=int, default=None, metavar="N")
    generate.add_argument("--seed", type=int, default=None, metavar="N")
    generate.add_argument(
        "--custom-object", action="append", default=None, metavar="NAME",
        help="a registered custom loss/metric the grids use (repeat for more).",
    )  # fmt: skip
    generate.add_argument("--name", default=None, help="the table's name.")
    generate.add_argument("--description", default=None)
    generate.add_argument(
        "--replace", action="store_true", help="replace a different table of the same name."
    )
    _add_registry(generate)
    add_json_option(generate)

    listing = add_command(commands, "list", _list, help="one row per stored table.")
    _add_registry(listing)
    add_json_option(listing)

    show = add_command(
        commands, "describe", _describe, help="the configurations of a stored table."
    )
    show.add_argument("name", help="the table's name.")
    _add_registry(show)
    add_json_option(show)
    add_alias(commands, "show", show, "model-configs")

    drop = add_command(commands, "drop", _drop, help="remove a stored table.")
    drop.add_argument("name", help="the table's name.")
    _add_registry(drop)
    add_alias(commands, "delete", drop, "model-configs")


_FLAGS = ("architecture", "compile_grid", "fit_grid", "search", "num_configs", "seed")


def _spec(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The file's fields (``--config``, flags override) and the directory paths are relative to."""
    from dvml.exceptions import ArgumentError

    if args.config is not None:
        from dvml.jobs.data import config_dir
        from dvml.jobs.schemas import MODEL_CONFIGS_SCHEMA
        from dvml.jobs.yaml_schema import load

        given = [f"--{f.replace('_', '-')}" for f in _FLAGS if getattr(args, f) is not None]
        if given:
            raise ArgumentError(
                f"--config FILE holds the architectures and grids. Received: --config and "
                f"{', '.join(given)}. Put them in the file, or leave --config out."
            )
        job = load(args.config, MODEL_CONFIGS_SCHEMA)
        return {**job["model_selection"], **{k: job[k] for k in ("name", "description",
                "registry")}}, config_dir(args.config)  # fmt: skip
    if not args.architecture or args.compile_grid is None:
        raise ArgumentError(
            "generate needs --config FILE, or --architecture and --compile-grid. Received: "
            f"architecture={args.architecture}, compile-grid={args.compile_grid!r}. Add them."
        )
    spec = {
        "architectures": args.architecture,
        "compile_params_grid": args.compile_grid,
        "fit_params_grid": args.fit_grid,
        "search": args.search or "grid",
        "num_configs": args.num_configs,
        "seed": args.seed,
        "custom_objects": args.custom_object or [],
        "name": None,
        "description": None,
        "registry": None,
    }
    return spec, None


def _generate(args: argparse.Namespace) -> int:
    from dvml.jobs.models import architecture_id
    from dvml.registry import Registry
    from dvml.train.model_selection import model_configs

    spec, base = _spec(args)
    if args.config is None:  # a file was checked when it loaded; flags are checked here
        from dvml.jobs.schemas import planned_configs

        planned_configs(spec)  # refuses a bad grid before the registry is touched
    with Registry(args.registry or spec["registry"]) as registry:
        ids = [
            architecture_id(a, registry, base, key=f"model_selection.architectures[{i}]")
            for i, a in enumerate(spec["architectures"])
        ]
        table = model_configs(
            ids,
            spec["compile_params_grid"],
            spec["fit_params_grid"],
            spec["search"],
            spec["num_configs"],
            spec["seed"],
            args.name or spec["name"],
            custom_objects=spec["custom_objects"] or None,
            description=args.description or spec["description"],
            replace=args.replace,
            registry=registry,
        )
    _print_table(table, args.json)
    return 0


def _print_table(table: Any, as_json: bool) -> None:
    from dvml.configs import model_config  # the CLI imports lazily

    attrs = table.attrs
    rows = table.to_dict(orient="records")
    if as_json:
        keys = ("name", "search", "seed", "description", "custom_objects", "created_at")
        print_json({**{k: attrs.get(k) for k in keys}, "configs": rows})
        return
    seed = f", seed {attrs['seed']}" if attrs.get("seed") is not None else ""
    search = f"{attrs['search']} search" if attrs.get("search") else "given lists"
    print(f"Model selection table {attrs['name']!r}: {len(rows)} configurations ({search}{seed}).")
    print(format_table(rows, list(model_config.COLUMNS)))


def _list(args: argparse.Namespace) -> int:
    from dvml.registry import Registry

    with Registry(args.registry) as registry:
        rows = registry.list_model_selections().to_dict(orient="records")
    if args.json:
        print_json(rows)
    else:
        print(format_table(rows, _LIST_COLUMNS))
    return 0


def _describe(args: argparse.Namespace) -> int:
    from dvml.registry import Registry

    with Registry(args.registry) as registry:
        table = registry.model_selection(args.name)
    _print_table(table, args.json)
    return 0


def _drop(args: argparse.Namespace) -> int:
    from dvml.registry import Registry

    with Registry(args.registry) as registry:
        registry.drop_model_selection(args.name)
    print(f"Deleted model selection table {args.name!r}.")
    return 0
