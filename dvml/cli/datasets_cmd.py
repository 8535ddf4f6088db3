"""``dvml datasets list|describe|append|rebalance|drop``: the datasets in the vineyardds.

Every command attaches to ``--scheduler ADDR`` or to the cluster recorded by ``dvml cluster
up``; the listing and summaries are read by tasks on the workers (no tensor data moves).
"""

from __future__ import annotations

import argparse
from typing import Any

from dvml.cli._cluster_options import (
    add_cluster_options,
    add_drop_command,
    add_json_option,
    attached,
    drop_named,
    print_json,
)
from dvml.cli._common import (
    add_command,
    add_group,
    distribution_table,
    format_nbytes,
    format_table,
    with_bytes,
)

__all__ = ["register", "summary_lines"]

_LIST_COLUMNS = ["name", "kind", "rows", "version", "buffers", "workers", "bytes", "created",
                 "status"]  # fmt: skip
_PLACEMENT_COLUMNS = ["buffer", "worker_name", "host", "vineyard_instance_id", "rows", "bytes",
                      "status"]  # fmt: skip
# Summary fields shown by `describe`, in this order (MADlib's names first).
_SUMMARY_FIELDS = [
    "source_table", "dependent_varname", "independent_varname", "class_values", "num_classes",
    "normalizing_const", "buffer_size", "x_shapes", "image_size", "channels", "dropped_rows",
    "training_dataset", "dataset_id", "created_at",
]  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``datasets`` group to the top-level ``dvml`` parser."""
    _, commands = add_group(
        subparsers,
        "datasets",
        help="list, describe and drop the datasets packed in vineyard.",
        description="The named datasets (and feature caches) held in the cluster's vineyardd "
        "instances. Attaches to --scheduler ADDR or to the cluster recorded by `dvml cluster up`.",
    )
    listing = add_command(
        commands, "list", _list,
        help="one row per dataset: kind, rows, buffers, workers, bytes.",
    )  # fmt: skip
    listing.add_argument("--kind", default=None, help="only datasets of this kind (dataset, ...).")
    add_json_option(listing)
    add_cluster_options(listing)

    describe = add_command(
        commands, "describe", _describe,
        help="a dataset's summary and where its buffers live.",
        description="Print the dataset's summary (source, classes, normalization, shapes, "
        "distribution rules) and its rows and bytes per worker.",
    )  # fmt: skip
    describe.add_argument("name", help="the dataset's name.")
    describe.add_argument("--placement", action="store_true", help="also print one row per buffer.")
    describe.add_argument(
        "--version", type=int, default=None, dest="at_version",
        help="describe this version (1, 2, ...) instead of the latest.",
    )  # fmt: skip
    add_json_option(describe)
    add_cluster_options(describe)

    append = add_command(
        commands, "append", _append,
        help="pack new rows into a dataset as its next version (no old byte copied).",
        description="Read SOURCE (files or a URL, as the preprocessors take), encode it as the "
        "dataset's first version was and publish version n+1: the old buffers plus the new.",
    )  # fmt: skip
    append.add_argument("name", help="the dataset's name.")
    append.add_argument("source", nargs="+", help="the new rows: paths, globs or URLs.")
    append.add_argument(
        "--on-invalid", choices=["raise", "drop"], default="raise",
        help="rows whose x holds NaN or inf: refuse (default) or drop them.",
    )  # fmt: skip
    add_json_option(append)
    add_cluster_options(append)

    rebalance = add_command(
        commands, "rebalance", _rebalance,
        help="spread a dataset onto workers that joined (whole buffers copied, a new version).",
        description="Re-apply the dataset's distribution rules to the current workers and copy "
        "whole buffers from the most-loaded workers to the new ones (worker to worker; the "
        "source is not read again), then publish the next version. all_workers and gpu_workers "
        "datasets grow; explicit workers, hosts or tables do not move.",
    )  # fmt: skip
    rebalance.add_argument("name", help="the dataset's name.")
    add_json_option(rebalance)
    add_cluster_options(rebalance)

    add_drop_command(commands, _drop, "dataset")


def _rebalance(args: argparse.Namespace) -> int:
    from dvml.preprocess.rebalance import rebalance

    with attached(args) as cluster:
        out = rebalance(args.name, cluster.client)
    if args.json:
        print_json(out)
        return 0
    print(f"{args.name}: version {out['version']}, {len(out['moves'])} buffers moved "
          f"({format_nbytes(out['bytes_moved'])}; the new workers' share "
          f"{format_nbytes(out['share_bytes'])})")  # fmt: skip
    for worker, rows in out["rows_per_worker"].items():
        print(f"  {worker}: {rows} rows")
    return 0


def _list(args: argparse.Namespace) -> int:
    from dvml.store import datasets

    with attached(args) as cluster:
        table = datasets.list(cluster.client, kind=args.kind)
    rows = table.to_dict(orient="records")
    if args.json:
        print_json(rows)
        return 0
    print(format_table(with_bytes(rows), _LIST_COLUMNS))
    return 0


def summary_lines(ds: Any) -> list[str]:
    """The header of ``describe``: name, kind, size, then the summary fields that are set."""
    lines = [
        f"name:     {ds.name}",
        f"kind:     {ds.kind}",
        f"id:       {ds.id}",
        f"rows:     {ds.rows} in {len(ds.layout['buffers'])} buffers ({format_nbytes(ds.nbytes)})",
        f"status:   {ds.status}" + (f": {ds.damage()}" if ds.damaged else ""),
        f"version:  {getattr(ds, 'version', 1)} (versions: "
        f"{[v['version'] for v in getattr(ds, 'versions', []) if v.get('readable', True)]})",
    ]
    s = ds.summary
    rules = s.get("distribution_rules") or {}
    if rules:
        names = [w.get("name") for w in rules.get("resolved") or []]
        lines.append(f"distribution_rules: {rules.get('given')!r} -> {', '.join(names)}")
    for key in _SUMMARY_FIELDS:
        if s.get(key) not in (None, [], {}):
            lines.append(f"{key}: {s[key]}")
    return lines


def _describe(args: argparse.Namespace) -> int:
    from dvml.store import datasets

    with attached(args) as cluster:
        ds = datasets.describe(args.name, cluster.client, version=args.at_version)
    if args.json:
        print_json({"name": ds.name, "kind": ds.kind, "id": ds.id, "rows": ds.rows,
                    "version": ds.version, "versions": ds.versions,
                    "nbytes": ds.nbytes, "status": ds.status,
                    "lost_buffers": list(ds.lost_buffers), "summary": ds.summary,
                    "placement": ds.placement().to_dict(orient="records")})  # fmt: skip
        return 0
    print("\n".join(summary_lines(ds)))
    print()
    print(distribution_table(ds))
    if args.placement:
        rows = with_bytes(ds.placement().to_dict(orient="records"))
        print()
        print(format_table(rows, _PLACEMENT_COLUMNS))
    return 0


def _append(args: argparse.Namespace) -> int:
    from dvml.preprocess.datasets_api import append

    source = args.source[0] if len(args.source) == 1 else list(args.source)
    with attached(args) as cluster:
        ds = append(args.name, source, on_invalid=args.on_invalid, client=cluster.client)
    added = ds.versions[-1]
    if args.json:
        print_json({"name": ds.name, "version": ds.version, "rows": ds.rows,
                    "rows_added": added["rows"], "buffers_added": added["buffers"]})  # fmt: skip
        return 0
    print(
        f"Appended {added['rows']} rows to {ds.name!r} in {len(added['buffers'])} new buffer(s): "
        f"version {ds.version}, {ds.rows} rows."
    )
    return 0


def _drop(args: argparse.Namespace) -> int:
    from dvml.store import datasets

    ds = drop_named(args, datasets.describe, datasets.drop, "dataset")
    if ds is not None:
        workers = len({b["worker_name"] for b in ds.layout["buffers"]})
        print(
            f"Dropped dataset {ds.name!r}: freed {format_nbytes(ds.nbytes)} on {workers} worker(s)."
        )
    return 0
