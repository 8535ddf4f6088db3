"""``dvml fit|evaluate|predict --config FILE.yaml``: one job file, the same the workflows read.

``fit`` preprocesses ``data`` (and ``validation``) into ``<name>-train``/``<name>-val`` and
trains the model ``<name>`` (``--model`` to choose another); ``evaluate`` evaluates it on
``<name>-val``; ``predict`` predicts raw rows of ``predict.source`` (default ``data.source``).
Unlike ``workflows/retrain.py``, ``fit`` writes the model directly: there is no candidate and
no promotion. The file is checked before anything starts; ``python -m dvml.jobs.schemas``
prints every key.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dvml.cli._cluster_options import (
    add_cluster_options,
    add_json_option,
    attached,
    print_json,
    training_session,
)
from dvml.cli._common import format_table
from dvml.cli._dry_memory import memory_architecture, print_memory_plan
from dvml.exceptions import ArgumentError

__all__ = ["dry_run_memory", "register"]

_CONFIG_HELP = "the YAML job file (the schema of workflows/configs/retrain-digits.yaml)."


def _parser(subparsers: Any, name: str, handler: Any, help: str, description: str) -> Any:
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.set_defaults(handler=handler, group_parser=parser)
    parser.add_argument("--config", required=True, metavar="FILE", help=_CONFIG_HELP)
    parser.add_argument(
        "--model", default=None, metavar="NAME", help="the model (default: the config's name)."
    )
    parser.add_argument(
        "--registry", default=None, metavar="URL",
        help="SQLAlchemy URL of the registry (default: the config's registry, else dvml's).",
    )  # fmt: skip
    add_cluster_options(parser)
    return parser


def register(subparsers: Any) -> None:
    """Add ``fit``, ``evaluate`` and ``predict`` to the top-level ``dvml`` parser."""
    fit = _parser(
        subparsers, "fit", _fit,
        help="preprocess a job file's data and train its model.",
        description="Preprocess data.source into <name>-train and a validation set into "
        "<name>-val (both replaced atomically), then train the model with one trainer per "
        "worker holding data, warm-started from the existing model when model.warm_start is "
        "true. The cluster is --scheduler, else the config's cluster section, else the one "
        "recorded by `dvml cluster up`.",
    )  # fmt: skip
    fit.add_argument(
        "--dry-run", action="store_true",
        help="check the config and print what would run; start nothing.",
    )  # fmt: skip

    evaluate = _parser(
        subparsers, "evaluate", _evaluate,
        help="evaluate a job file's model on its validation set, on the workers.",
        description="Compute the loss and metrics of the model (evaluate.model, else the "
        "config's name) on a packed dataset (evaluate.dataset, else <name>-val, built by "
        "`dvml fit --config`), where the data lives.",
    )  # fmt: skip
    evaluate.add_argument(
        "--dataset", default=None, metavar="NAME", help="the packed dataset to evaluate on."
    )
    add_json_option(evaluate)

    predict = _parser(
        subparsers, "predict", _predict,
        help="predict the raw rows of a job file's predict.source with its model.",
        description="Predict every row of predict.source (else data.source; a Parquet/CSV "
        "path or glob, newest match, or sklearn:digits) on the workers, with the training "
        "set's normalization. Writes predict.output (or --output; .csv or .parquet), or prints "
        "the first rows.",
    )  # fmt: skip
    predict.add_argument(
        "--output", default=None, metavar="FILE", help="write the predictions (.csv/.parquet)."
    )
    predict.add_argument(
        "--limit", type=int, default=10, metavar="N",
        help="rows to print when no output file is given (default 10).",
    )  # fmt: skip


def _job(args: argparse.Namespace) -> dict[str, Any]:
    from dvml.jobs.schemas import JOB_SCHEMA
    from dvml.jobs.yaml_schema import load

    return load(args.config, JOB_SCHEMA)


def _registry(args: argparse.Namespace, job: dict[str, Any]) -> Any:
    from dvml.registry import Registry

    return Registry(args.registry or job["registry"])


def _fit(args: argparse.Namespace) -> int:
    from dvml.jobs.data import (
        config_dir,
        dataset_names,
        prepare_datasets,
        resolve_source,
        validation_fraction,
    )
    from dvml.jobs.models import fit_arguments, model_exists, resolve_model_section
    from dvml.train.fit import fit

    job = _job(args)
    _refuse_append(job, args.config)
    base = config_dir(args.config)
    name = args.model or job["name"]
    model = job["model"]
    source = resolve_source(job["data"]["source"], base)
    validation_fraction(job, source)  # before anything starts: refused by --dry-run too
    train_name, val_name = dataset_names(job["name"])
    if args.dry_run:
        _print_fit_plan(args, job, base, source, name)
        return 0
    started = time.monotonic()
    with training_session(args, job) as (cluster, registry):
        client = cluster.client
        print(f"Preprocessing {source.describe()} into {train_name} and {val_name}...")
        train, validation = prepare_datasets(job, client, base, source)
        print(f"  {train.name}: {train.rows} rows; {validation.name}: {validation.rows} rows.")
        model, arch_id, _ = resolve_model_section(model, registry, base)
        warm = bool(model["warm_start"]) and model_exists(registry, name)
        print(f"Training {name!r} (architecture {arch_id}, "
              f"{'warm start' if warm else 'from scratch'})...")  # fmt: skip
        result = fit(
            train.name,
            name,
            arch_id,
            **fit_arguments(model),
            validation_set=validation.name,
            warm_start=warm,
            overwrite=True,  # a job names its model: running it again trains it again
            name=job["name"],
            description=job["description"],
            registry=registry,
            client=client,
        )
        summary = result.summary
        version = registry.get_model(name)["version"]
    print(
        f"Model {name!r} version {version} saved to {registry.url} in "
        f"{time.monotonic() - started:.0f}s: training loss {_num(summary['training_loss_final'])}"
        f", validation loss {_num(summary['validation_loss_final'])}, validation "
        f"{(summary.get('metrics_type') or ['metric'])[0]} "
        f"{_num(summary['validation_metrics_final'])}."
    )
    return 0


def _print_fit_plan(
    args: argparse.Namespace, job: dict[str, Any], base: Any, source: Any, name: str
) -> None:
    """What ``dvml fit --config --dry-run`` prints: the steps and the memory plan."""
    from dvml.jobs.data import dataset_names
    from dvml.jobs.job_cluster import cluster_plan

    model = job["model"]
    train_name, val_name = dataset_names(job["name"])
    print(f"Plan for `dvml fit --config {args.config}` (dry run: nothing was started):")
    print(f"  - cluster: {cluster_plan(job['cluster'], args.scheduler, args.state_dir)}")
    print(f"  - data: {source.describe()} -> {train_name}, {val_name}")
    arch = f"architecture {model['architecture']!r}"
    if model["from_selection"]:
        arch = f"the best configuration of fit_multiple run {model['from_selection']!r}"
    print(f"  - train {name!r} from {arch} for "
          f"{model['num_iterations']} iteration(s)"
          + (", warm-started if it exists" if model["warm_start"] else ""))  # fmt: skip
    print_memory_plan(args, job, base, source, _fit_trainers(job, base))


def _refuse_append(job: dict[str, Any], config: str) -> None:
    """``data.append: true`` is the retrain workflow's: its state records the files it packed.
    A ``dvml fit`` that packed every file again would replace the versions the workflow
    appends to, and its next run would append those files twice."""
    from dvml.exceptions import ConfigError

    if job["data"]["append"]:
        raise ConfigError(
            f"`dvml fit --config` packs the whole source, and data.append: true is the retrain "
            f"workflow's (it records the files it packed and appends only new ones). Received: "
            f"data.append: true in {config}. Run `python -m workflows.retrain --config {config}`"
            f", or remove data.append to repack every file into {job['name']}-train and "
            f"{job['name']}-val."
        )


def dry_run_memory(args: argparse.Namespace, job: dict[str, Any], base: Any) -> None:
    """Print the memory plan of a job file's pack and fit (``args``: ``scheduler``,
    ``state_dir`` and ``registry``, as the CLI's); what ``--dry-run`` of ``dvml fit`` and of
    the retrain workflow print after their steps. Starts nothing, writes nothing."""
    from dvml.jobs.data import resolve_source

    source = resolve_source(job["data"]["source"], base)
    print_memory_plan(args, job, base, source, _fit_trainers(job, base))


def _fit_trainers(job: dict[str, Any], base: Any) -> Any:
    """The dry run's plan of the fit's trainers (:func:`print_memory_plan`)."""

    def plan(client: Any, memory: Any, stored: Any, train_name: str) -> Any:
        from dvml.exceptions import ConfigError
        from dvml.jobs.models import fit_arguments, resolve_model_section
        from dvml.train import plans

        model = job["model"]
        spec: Any = model["architecture"]
        if model["from_selection"]:
            if stored is None:
                raise ConfigError("model.from_selection needs the job's registry, which does "
                                  "not exist yet. Received: no registry file.")  # fmt: skip
            model, spec, _ = resolve_model_section(model, stored, base)  # reads only
        arch_id = memory_architecture(spec, memory, stored, base)
        kwargs = fit_arguments(model)
        return plans.fit(train_name, arch_id, kwargs["compile_params"], kwargs["fit_params"],
                         use_gpus=kwargs["use_gpus"], custom_objects=kwargs["custom_objects"],
                         registry=memory, client=client)  # fmt: skip

    return plan


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def _evaluate(args: argparse.Namespace) -> int:
    from dvml.exceptions import DatasetNotFoundError
    from dvml.jobs.data import dataset_names
    from dvml.train.predict import evaluate

    job = _job(args)
    name = args.model or job["evaluate"]["model"] or job["name"]
    dataset = args.dataset or job["evaluate"]["dataset"] or dataset_names(job["name"])[1]
    with attached(args, job["cluster"]) as cluster, _registry(args, job) as registry:
        try:
            result = evaluate(name, dataset, job["evaluate"]["batch_size"], registry=registry,
                              client=cluster.client)  # fmt: skip
        except DatasetNotFoundError as exc:
            raise DatasetNotFoundError(
                f"{exc} `dvml fit --config {args.config}` builds {dataset!r}."
            ) from None
    if args.json:
        print_json({"model": name, "dataset": dataset, **result})
        return 0
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items())
    print(f"Model {name!r} on {dataset!r} ({result['rows']} rows): loss={result['loss']:.4f}"
          + (f", {metrics}" if metrics else ""))  # fmt: skip
    return 0


def _predict(args: argparse.Namespace) -> int:
    import os

    from dvml.jobs.data import (
        columns,
        config_dir,
        default_id,
        read_rows,
        resolve_source,
        storage_options,
    )
    from dvml.train.predict import predict

    job = _job(args)
    base = config_dir(args.config)
    spec = job["predict"]
    name = args.model or spec["model"] or job["name"]
    source = resolve_source(spec["source"] or job["data"]["source"],
                            base, "predict.source")  # fmt: skip
    x = spec["x"] or columns(source, job["data"])[0]
    id_col = spec["id"] if spec["id"] != "id" else (default_id(source) or "id")
    output = args.output
    if output is None and spec["output"]:
        output = os.path.join(base, os.path.expanduser(spec["output"]))
    if output is not None and not output.lower().endswith((".csv", ".parquet")):
        raise ArgumentError(
            f"The predictions file must end in .csv or .parquet. Received: output={output!r}. "
            "Choose one of these formats."
        )
    with attached(args, job["cluster"]) as cluster, _registry(args, job) as registry:
        # Images (a folder, shards) are read by the workers, each its own files.
        rows = source.location if source.kind in ("images", "shards") else read_rows(source)
        frame = predict(name, rows, id_col, x, spec["pred_type"], registry=registry,
                        client=cluster.client,
                        storage_options=storage_options()).compute()  # fmt: skip
    if output is None:
        print(f"{len(frame)} predictions of model {name!r} for {source.describe()}:")
        shown = frame.head(args.limit).to_dict(orient="records")
        print(format_table([{k: _cell(v) for k, v in r.items()} for r in shown]))
        return 0
    if output.lower().endswith(".csv"):
        frame.to_csv(output, index=False)
    else:
        frame.to_parquet(output, index=False)
    print(f"Wrote {len(frame)} predictions of model {name!r} to {output}.")
    return 0


def _cell(value: Any) -> Any:
    return f"{value:.4f}" if isinstance(value, float) else value
