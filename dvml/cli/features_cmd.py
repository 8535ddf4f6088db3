"""``dvml features list|describe|drop``: the transfer-learning feature caches in vineyard.

Feature caches are built by :func:`dvml.features.cache` (or ``workflows/feature_refresh.py``);
these commands attach to ``--scheduler ADDR`` or the cluster recorded by ``dvml cluster up``.
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

__all__ = ["register"]

_LIST_COLUMNS = ["name", "rows", "feature_shape", "backbone", "layer", "pooling", "source",
                 "workers", "bytes", "created"]  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``features`` group to the top-level ``dvml`` parser."""
    _, commands = add_group(
        subparsers,
        "features",
        help="list, describe and drop transfer-learning feature caches.",
        description="Feature caches: a backbone's features of a set of images, kept in "
        "vineyard on the workers that hold the images, for many fine-tuning jobs. Attaches to "
        "--scheduler ADDR or to the cluster recorded by `dvml cluster up`.",
    )
    listing = add_command(
        commands, "list", _list,
        help="one row per cache: rows, feature shape, backbone, layer, pooling, source, bytes.",
    )  # fmt: skip
    add_json_option(listing)
    add_cluster_options(listing)

    describe = add_command(
        commands, "describe", _describe,
        help="a cache's key, backbone, source and where its buffers live.",
    )  # fmt: skip
    describe.add_argument("name", help="the feature cache's name.")
    add_json_option(describe)
    add_cluster_options(describe)

    add_drop_command(commands, _drop, "feature cache")


def _list(args: argparse.Namespace) -> int:
    import dvml.features

    with attached(args) as cluster:
        table = dvml.features.list(cluster.client)
    rows = table.to_dict(orient="records")
    if args.json:
        print_json(rows)
        return 0
    for row in with_bytes(rows):
        row["feature_shape"] = "x".join(str(d) for d in row["feature_shape"])
    print(format_table(rows, _LIST_COLUMNS))
    return 0


def _describe(args: argparse.Namespace) -> int:
    import dvml.features

    with attached(args) as cluster:
        ds = dvml.features.describe(args.name, cluster.client)
    s = ds.summary
    if args.json:
        print_json({"name": ds.name, "kind": ds.kind, "id": ds.id, "rows": ds.rows,
                    "nbytes": ds.nbytes, "summary": s})  # fmt: skip
        return 0
    backbone = s.get("backbone") or {}
    source = s.get("source") or {}
    lines = [
        f"name:      {ds.name}",
        f"rows:      {ds.rows} in {len(ds.layout['buffers'])} buffers ({format_nbytes(ds.nbytes)})",
        f"features:  {s.get('x_shapes', [[]])[0]}",
        f"backbone:  {backbone.get('description')}",
        f"layer:     {backbone.get('output_layer')} (pooling {backbone.get('pooling')})",
        f"source:    {source.get('description')}",
        f"key:       {s.get('cache_key')}",
        f"classes:   {s.get('class_values')}",
        f"created:   {s.get('created_at')}",
    ]
    print("\n".join(lines))
    print()
    print(distribution_table(ds))
    return 0


def _drop(args: argparse.Namespace) -> int:
    import dvml.features

    ds = drop_named(args, dvml.features.describe, dvml.features.drop, "feature cache")
    if ds is not None:
        print(f"Dropped feature cache {ds.name!r}: freed {format_nbytes(ds.nbytes)}.")
    return 0
