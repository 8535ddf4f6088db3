"""``dvml models list|show|lineage``: the trained models in the registry (no cluster needed)."""

from __future__ import annotations

import argparse
from typing import Any

from dvml.cli._cluster_options import add_json_option, print_json
from dvml.cli._common import add_alias, add_command, add_group, format_table

__all__ = ["lineage_lines", "register"]

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
        help="list and describe the trained models in the registry.",
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
        commands, "describe", _describe,
        help="a model's summary and its per-iteration metrics.",
        description="Print what the registry holds about one model: its architecture, "
        "training parameters, final losses and metrics, trainers, promotion record (models "
        "promoted by workflows/retrain.py), and one row per evaluated iteration.",
    )  # fmt: skip
    show.add_argument("name", help="the model's name.")
    _add_registry(show)
    add_json_option(show)
    add_alias(commands, "show", show, "models")

    lineage = add_command(
        commands, "lineage", _lineage,
        help="which data, preprocessing and code trained a model (dvml.lineage).",
        description="Print a model's lineage: the dataset versions it trained and validated "
        "on with their content digests and sources (files, preprocessing parameters), the "
        "dvml version, architecture and parameters, its promotions, then the same for each "
        "model it was warm-started from.",
    )  # fmt: skip
    lineage.add_argument("name", help="the model's name.")
    _add_registry(lineage)
    add_json_option(lineage)


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


def _describe(args: argparse.Namespace) -> int:
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


def _data_lines(part: str, read: dict[str, Any] | None) -> list[str]:
    if not read:
        return []
    lines = [
        f"  {part}: {read.get('name')} version {read.get('version')}, "
        f"{read.get('rows', '?')} rows, content digest {read.get('content_digest')}"
    ]
    for index, digest in sorted((read.get("digests") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"    buffer {index}: {digest}")
    for s in read.get("sources") or []:
        source = s.get("source") or {}
        lines.append(
            f"    version {s['version']} (+{s.get('rows_added')} rows, {s.get('created_at')}): "
            f"{source.get('description')}; params {_short(source.get('params') or {})}"
        )
        for f in source.get("files") or []:
            stamp = f"etag {f['etag']}" if f.get("etag") else f"mtime {f.get('mtime')}"
            lines.append(f"      {f['path']} ({f.get('size')} bytes, {stamp})")
    return lines


def lineage_lines(lineage: Any) -> list[str]:
    """The lines ``dvml models lineage`` prints for a lineage (:func:`dvml.lineage`)."""
    lines: list[str] = []
    for depth, node in enumerate(lineage.chain()):
        head = "model" if depth == 0 else "warm-started from"
        lines.append(
            f"{head}: {node.model} (registry version {node.registry_version}, trained as "
            f"{node.trained_as})" + (" [recorded before lineage]" if node.legacy else "")
        )
        lines += _data_lines("training", node.training)
        lines += _data_lines("validation", node.validation)
        code = node.code
        lines.append(
            f"  code: dvml {code.get('dvml_version')}, architecture {code.get('architecture_id')} "
            f"(sha256 {code.get('architecture_sha256')})"
        )
        lines.append(f"  compile_params: {code.get('compile_params')}")
        lines.append(f"  fit_params: {code.get('fit_params')}")
        for p in node.promotions:
            over = p.get("over") or {}
            lines.append(
                f"  promoted from {p.get('from')} over {over.get('name', '(none)')} "
                f"v{over.get('registry_version', '-')} on {p.get('promoted')}: {p.get('metric')} "
                f"{_short(p.get('candidate'))} against {_short(p.get('previous'))}"
            )
    return lines


def _lineage(args: argparse.Namespace) -> int:
    from dvml.registry import lineage

    found = lineage(args.name, registry=args.registry)
    if args.json:
        print_json(found.to_dict())
    else:
        print("\n".join(lineage_lines(found)))
    return 0
