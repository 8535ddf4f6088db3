"""``dvml automl --config FILE.yaml``: model search with early stopping (``dvml.automl``).

The job file (:data:`dvml.jobs.schemas.AUTOML_SCHEMA`) has the ``data`` and ``validation``
sections of ``dvml fit`` files, a ``model_selection`` section (architectures and MADlib's grids,
ranges included, checked when the file is loaded) and an ``automl`` section (method, MADlib's
``automl_params``, seed). The command preprocesses the data into ``<name>-train``/``<name>-val``
(packed once: the search never reads them again) and calls :func:`dvml.automl`, which prints a
line per decision with the best configuration so far. ``--resume`` continues an ASHA search
whose client died from its journal and its checkpoints (in the state directory): on the
datasets it was started on when the cluster still holds them (an attached cluster), else
(``cluster: local``, whose data died with the killed run) on the source preprocessed again the
same way, which must give the same data (else the resume is refused). ``--dry-run`` checks the
file and prints what would run, without a cluster or a registry.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dvml.cli._cluster_options import add_cluster_options, training_session
from dvml.cli._common import format_table

__all__ = ["register"]

_INFO_COLUMNS = [
    "mst_key", "compile_params", "fit_params", "status", "iterations", "training_loss_final",
    "validation_loss_final", "validation_metrics_final",
]  # fmt: skip


def register(subparsers: Any) -> None:
    """Add ``automl`` to the top-level ``dvml`` parser."""
    parser = subparsers.add_parser(
        "automl",
        help="search configurations with early stopping (MADlib's madlib_keras_automl: "
        "hyperband, hyperopt; and asha).",
        description="Preprocess data.source into <name>-train and <name>-val, then search the "
        "model_selection grids with dvml.automl (automl.method: hyperband, hyperopt or asha). "
        "The cluster is --scheduler, else the config's cluster section, else the one recorded "
        "by `dvml cluster up`.",
    )
    parser.set_defaults(handler=_automl, group_parser=parser)
    parser.add_argument(
        "--config", required=True, metavar="FILE",
        help="the YAML job file (print its keys with `python -m dvml.jobs.schemas`).",
    )  # fmt: skip
    parser.add_argument(
        "--resume", action="store_true",
        help="continue the ASHA search whose client died, from its journal's last decision "
        "and its models' checkpoints (each loses at most the iteration it was training). The "
        "datasets are reused when the cluster still holds them (an attached cluster); with "
        "cluster: local they died with the killed run and are preprocessed again from the "
        "same source (refused if that gives other data).",
    )  # fmt: skip
    parser.add_argument(
        "--registry", default=None, metavar="URL",
        help="SQLAlchemy URL of the registry (default: the config's registry, else dvml's).",
    )  # fmt: skip
    parser.add_argument(
        "--dry-run", action="store_true",
        help="check the config and print what would run; start nothing.",
    )  # fmt: skip
    add_cluster_options(parser)


def _job(path: str) -> dict[str, Any]:
    from dvml.jobs.schemas import AUTOML_SCHEMA
    from dvml.jobs.yaml_schema import load

    return load(path, AUTOML_SCHEMA)


def _dry_run(args: argparse.Namespace, job: dict[str, Any], source: Any) -> int:
    from dvml.jobs.data import dataset_names
    from dvml.jobs.job_cluster import cluster_plan
    from dvml.search.automl_params import parse_automl_params

    train_name, val_name = dataset_names(job["name"])
    settings = job["automl"]
    output = settings["model_output"] or job["name"]
    parsed = parse_automl_params(settings["method"], settings["params"])
    print(f"Plan for `dvml automl --config {args.config}` (dry run: nothing was started):")
    print(f"  - cluster: {cluster_plan(job['cluster'], args.scheduler, args.state_dir)}")
    print(f"  - data: {source.describe()} -> {train_name}, {val_name}")
    print(f"  - architectures: {job['model_selection']['architectures']}")
    print(f"  - automl -> {output!r}: method={settings['method']}, '{parsed.text()}', "
          f"seed={settings['seed']}" + (", resume" if args.resume else ""))  # fmt: skip
    return 0


def _datasets(args: argparse.Namespace, job: dict[str, Any], client: Any, base: Any,
              source: Any) -> tuple[Any, Any]:  # fmt: skip
    """The job's datasets: preprocessed now, or (``--resume``) the ones the search used."""
    import dvml
    from dvml.jobs.data import dataset_names, prepare_datasets

    names = dataset_names(job["name"])
    if args.resume and all(dvml.datasets.exists(n, client=client) for n in names):
        print(f"Resuming on the datasets {names[0]}, {names[1]} (not preprocessed again).")
        return dvml.datasets.describe(names[0], client), dvml.datasets.describe(names[1], client)
    if args.resume:  # cluster: local: the datasets died with the run that was killed
        print(
            f"The datasets {names[0]}, {names[1]} are gone with the cluster of the killed "
            "run: preprocessing them again (the search resumes only on the same data)."
        )
    print(f"Preprocessing {source.describe()}...")
    return prepare_datasets(job, client, base, source)


def _automl(args: argparse.Namespace) -> int:
    import dvml
    from dvml.jobs.data import config_dir, resolve_source, validation_fraction
    from dvml.jobs.models import architecture_id

    job = _job(args.config)
    base = config_dir(args.config)
    source = resolve_source(job["data"]["source"], base)
    validation_fraction(job, source)  # before anything starts: refused by --dry-run too
    if args.dry_run:
        return _dry_run(args, job, source)
    settings, section = job["automl"], job["model_selection"]
    output = settings["model_output"] or job["name"]
    started = time.monotonic()
    with training_session(args, job) as (cluster, registry):
        client = cluster.client
        ids = [
            architecture_id(spec, registry, base, key=f"model_selection.architectures[{i}]")
            for i, spec in enumerate(section["architectures"])
        ]
        train, validation = _datasets(args, job, client, base, source)
        result = dvml.automl(
            train.name, output, ids, section["compile_params_grid"],
            section["fit_params_grid"], method=settings["method"], params=settings["params"],
            seed=settings["seed"], validation_set=validation.name,
            metrics_compute_frequency=settings["metrics_compute_frequency"],
            use_gpus=settings["use_gpus"], name=job["name"], description=job["description"],
            custom_objects=section["custom_objects"] or None, resume=args.resume,
            overwrite=True,  # a job names its outputs: running it again searches again
            registry=registry, client=client,
        )  # fmt: skip
        info = result.info
        summary = result.summary
    print(f"Searched {len(info)} configurations into {output!r} in "
          f"{time.monotonic() - started:.0f}s; best: mst_key={summary['best_mst_key']} "
          f"(model {output}_{summary['best_mst_key']}).")  # fmt: skip
    rows = info.to_dict(orient="records")
    print(format_table(rows, [c for c in _INFO_COLUMNS if c in info.columns]))
    return 0
