"""``dvml models list|show``: the trained models in the registry (no cluster needed)."""

from __future__ import annotations

import argparse
from typing import Any

from dvml.cli._cluster_options import add_json_option, print_json
from dvml.cli._common import add_command, add_group, format_table

__all__ = ["register"]

_LIST_COLUMNS = ["id", "name", "arch_id", "version", "n_iterations", "created_at", "updated_at"]
_HISTORY_COLUMNS = [
    "iteration", "training_loss", "training_metrics", "validation_loss", "validation_metrics",
    "elapsed_s",
]  # fmt: skip
# Summary fields shown by `show`, in this order.
_SHOW_FIELDS = [
    "description", "source_table", "validation_table", "model_id", "compile_params",
    "fit_params", "num_iterations", "warm_start", "class_values", "normalizing_const",
    "training_loss_final", "training_metrics_final", "validation_loss_final",
    "validation_metrics_final", "metrics_type", "trainers", "weights_identical_on_all_trainers",
    "start_training_time", "end_training_time", "promotion",
]  # fmt: skip


def _add_registry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry", default=None, metavar="URL",
        help="SQLAlchemy URL of the registry (default: config dvml.registry.url, else "
        "~/.dvml/registry.db).",
    )  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``models`` group to the top-level ``dvml`` parser."""
    _, commands = add_group(
        subparsers,
        "models",
        help="list and show the trained models in the registry.",
        description="The models in the model registry (an SQLite file by default). These "
        "commands read the registry only; no cluster is needed.",
    )
    listing = add_command(
        commands, "list", _list,
        help="one row per model: id, architecture, version, iterations, times.",
    )  # fmt: skip
    _add_registry(listing)
    add_json_option(listing)

    show = add_command(
        commands, "show", _show,
        help="a model's summary and its per-iteration metrics.",
        description="Print what the registry holds about one model: its architecture, "
        "training parameters, final losses and metrics, trainers, promotion record (models "
        "promoted by workflows/retrain.py), and one row per evaluated iteration.",
    )  # fmt: skip
    show.add_argument("name", help="the model's name.")
    _add_registry(show)
    add_json_option(show)


def _list(args: argparse.Namespace) -> int:
    from dvml.registry import Registry

    with Registry(args.registry) as registry:
        rows = registry.list_models().to_dict(orient="records")
    if args.json:
        print_json(rows)
    else:
        print(format_table(rows, _LIST_COLUMNS))
    return 0


def _short(value: Any) -> Any:
    """Floats with 4 decimals; dicts as ``key=value, ...``."""
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_short(v)}" for k, v in value.items())
    return value


def _show(args: argparse.Namespace) -> int:
    from dvml.registry import Registry

    with Registry(args.registry) as registry:
        entry = registry.get_model(args.name)
        history = registry.model_iterations(args.name)
    summary = entry["summary"] or {}
    rows = history.astype(object).where(history.notna(), None).to_dict(orient="records")
    if args.json:
        fields = ("id", "name", "arch_id", "version", "created_at", "updated_at")
        print_json({**{k: entry[k] for k in fields}, "summary": summary, "iterations": rows})
        return 0
    print(f"name:       {entry['name']}")
    print(f"version:    {entry['version']} (id {entry['id']}, architecture {entry['arch_id']})")
    print(f"created:    {entry['created_at']:%Y-%m-%d %H:%M:%S %Z}")
    print(f"updated:    {entry['updated_at']:%Y-%m-%d %H:%M:%S %Z}")
    for key in _SHOW_FIELDS:
        if summary.get(key) not in (None, [], {}):
            print(f"{key}: {_short(summary[key])}")
    print()
    print(format_table([{k: _short(v) for k, v in r.items()} for r in rows], _HISTORY_COLUMNS))
    return 0
