"""``dvml fit-multiple --config FILE.yaml``: train every configuration of a grid at once.

The job file (:data:`dvml.jobs.schemas.FIT_MULTIPLE_SCHEMA`) has the ``data`` and
``validation`` sections of ``dvml fit`` files, a ``model_selection`` section (a stored table's
name, or architectures and MADlib grids, checked by the parameter parser when the file is
loaded) and a ``fit_multiple`` section. The command preprocesses the data into
``<name>-train``/``<name>-val``, stores the configurations as ``<name>-configs`` and calls
:func:`dvml.fit_multiple` (Model Hopper Parallelism). ``--dry-run`` checks the file and prints
the configurations without a cluster or a registry.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from dvml.cli._cluster_options import add_cluster_options, training_session
from dvml.cli._common import format_table
from dvml.cli._dry_memory import memory_architecture, print_memory_plan

__all__ = ["register"]

_INFO_COLUMNS = [
    "mst_key", "model_id", "compile_params", "fit_params", "training_loss_final",
    "validation_loss_final", "validation_metrics_final",
]  # fmt: skip


def register(subparsers: Any) -> None:
    """Add ``fit-multiple`` to the top-level ``dvml`` parser."""
    parser = subparsers.add_parser(
        "fit-multiple",
        help="train every configuration of a model selection grid at once (MADlib's "
        "fit_multiple_model).",
        description="Preprocess data.source into <name>-train and <name>-val, store the "
        "model_selection configurations as <name>-configs (or use model_selection.table), then "
        "train them all with dvml.fit_multiple: each worker trains one model at a time on its "
        "own partitions and the models hop between workers. The cluster is --scheduler, else "
        "the config's cluster section, else the one recorded by `dvml cluster up`.",
    )
    parser.set_defaults(handler=_fit_multiple, group_parser=parser)
    parser.add_argument(
        "--config", required=True, metavar="FILE",
        help="the YAML job file (print its keys with `python -m dvml.jobs.schemas`).",
    )  # fmt: skip
    parser.add_argument(
        "--model-output", default=None, metavar="NAME",
        help="output name of the models (default: fit_multiple.model_output, else the name).",
    )  # fmt: skip
    parser.add_argument(
        "--registry", default=None, metavar="URL",
        help="SQLAlchemy URL of the registry (default: the config's registry, else dvml's).",
    )  # fmt: skip
    parser.add_argument(
        "--dry-run", action="store_true",
        help="check the config, print the configurations and what would run; start nothing.",
    )  # fmt: skip
    add_cluster_options(parser)


def _job(path: str) -> dict[str, Any]:
    from dvml.jobs.schemas import FIT_MULTIPLE_SCHEMA
    from dvml.jobs.yaml_schema import load

    return load(path, FIT_MULTIPLE_SCHEMA)


def resolve_fit_multiple() -> Callable[..., Any]:
    """``dvml.fit_multiple``, looked up when the command runs (it lives in the training engine)."""
    import dvml
    from dvml.exceptions import TrainingError

    try:
        return getattr(dvml, "fit_multiple")  # noqa: B009 - resolved on use, not at import
    except AttributeError:
        raise TrainingError(
            "This dvml has no dvml.fit_multiple (the Model Hopper Parallelism engine). "
            "Received: `dvml fit-multiple`. Upgrade dvml; `--dry-run` checks the job file."
        ) from None


def _dry_run(args: argparse.Namespace, job: dict[str, Any], source: Any) -> int:
    from dvml.configs import model_config  # the CLI imports lazily
    from dvml.jobs.data import config_dir, dataset_names
    from dvml.jobs.job_cluster import cluster_plan
    from dvml.jobs.schemas import planned_configs

    section = job["model_selection"]
    train_name, val_name = dataset_names(job["name"])
    output = args.model_output or job["fit_multiple"]["model_output"] or job["name"]
    settings = job["fit_multiple"]
    print(f"Plan for `dvml fit-multiple --config {args.config}` (dry run: nothing was started):")
    print(f"  - cluster: {cluster_plan(job['cluster'], args.scheduler, args.state_dir)}")
    print(f"  - data: {source.describe()} -> {train_name}, {val_name}")
    if section["table"] is not None:
        print(f"  - configurations: the stored table {section['table']!r}")
    else:
        configs = planned_configs(section)
        specs = section["architectures"]
        print(f"  - configurations: {len(configs)} ({section['search']} search) -> "
              f"{job['name']}-configs")  # fmt: skip
        rows = [{**c.as_dict(), "model_id": specs[c.model_id - 1]} for c in configs]
        print(format_table(rows, list(model_config.COLUMNS)))
    print(f"  - fit_multiple -> {output!r}: {settings['num_iterations']} iteration(s)"
          + (", warm start" if settings["warm_start"] else ""))  # fmt: skip
    print_memory_plan(args, job, config_dir(args.config), source, _hop_trainers(job, args))
    return 0


def _hop_trainers(job: dict[str, Any], args: argparse.Namespace) -> Any:
    """The dry run's plan of the hopper's trainers (:func:`print_memory_plan`)."""
    from dvml.jobs.data import config_dir

    def plan(client: Any, memory: Any, stored: Any, train_name: str) -> Any:
        from dvml.exceptions import ConfigError
        from dvml.jobs.schemas import planned_configs
        from dvml.train import plans

        section = job["model_selection"]
        if section["table"] is not None:
            if stored is None:
                raise ConfigError("model_selection.table needs the job's registry, which does "
                                  "not exist yet. Received: no registry file.")  # fmt: skip
            return plans.fit_multiple(train_name, section["table"], use_gpus=job["fit_multiple"]
                                      ["use_gpus"], registry=stored, client=client)  # fmt: skip
        base = config_dir(args.config)
        ids = [memory_architecture(spec, memory, stored, base)
               for spec in section["architectures"]]  # fmt: skip
        rows = [{**c.as_dict(), "model_id": ids[c.model_id - 1]} for c in planned_configs(section)]
        return plans.fit_multiple(train_name, rows, use_gpus=job["fit_multiple"]["use_gpus"],
                                  custom_objects=section["custom_objects"] or None,
                                  registry=memory, client=client)  # fmt: skip

    return plan


def _configs(job: dict[str, Any], registry: Any, base: Any) -> Any:
    from dvml.jobs.models import architecture_id
    from dvml.train.model_selection import model_configs, resolve_model_configs

    section = job["model_selection"]
    if section["table"] is not None:
        return resolve_model_configs(section["table"], registry=registry)
    ids = [
        architecture_id(spec, registry, base, key=f"model_selection.architectures[{i}]")
        for i, spec in enumerate(section["architectures"])
    ]
    return model_configs(
        ids,
        section["compile_params_grid"],
        section["fit_params_grid"],
        section["search"],
        section["num_configs"],
        section["seed"],
        f"{job['name']}-configs",
        custom_objects=section["custom_objects"] or None,
        description=job["description"],
        replace=True,
        registry=registry,
    )


def _fit_multiple(args: argparse.Namespace) -> int:
    from dvml.jobs.data import config_dir, prepare_datasets, resolve_source, validation_fraction

    job = _job(args.config)
    base = config_dir(args.config)
    source = resolve_source(job["data"]["source"], base)
    validation_fraction(job, source)  # before anything starts: refused by --dry-run too
    if args.dry_run:
        return _dry_run(args, job, source)
    fit_multiple = resolve_fit_multiple()  # before anything starts
    settings = job["fit_multiple"]
    output = args.model_output or settings["model_output"] or job["name"]
    started = time.monotonic()
    with training_session(args, job) as (cluster, registry):
        client = cluster.client
        configs = _configs(job, registry, base)
        print(f"{len(configs)} configurations in {configs.attrs.get('name')!r}.")
        print(f"Preprocessing {source.describe()}...")
        train, validation = prepare_datasets(job, client, base, source)
        print(f"  {train.name}: {train.rows} rows; {validation.name}: {validation.rows} rows.")
        result = fit_multiple(
            train.name,
            output,
            configs,
            settings["num_iterations"],
            use_gpus=settings["use_gpus"],
            validation_set=validation.name,
            metrics_compute_frequency=settings["metrics_compute_frequency"],
            warm_start=settings["warm_start"],
            overwrite=True,  # a job names its outputs: running it again trains them again
            name=job["name"],
            description=job["description"],
            registry=registry,
            client=client,
        )
    print(f"Trained {len(configs)} configurations into {output!r} in "
          f"{time.monotonic() - started:.0f}s.")  # fmt: skip
    info = getattr(result, "info", None)
    if info is not None:
        rows = info.to_dict(orient="records")
        print(format_table(rows, [c for c in _INFO_COLUMNS if c in info.columns]))
    return 0
