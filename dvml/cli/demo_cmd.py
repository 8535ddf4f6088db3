"""``dvml demo``: the main job on an embedded default (see :mod:`dvml.demo`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="preprocess scikit-learn digits into vineyard, train with 2 workers, evaluate.",
        description="Start a LocalCluster, pack scikit-learn's digits into vineyard, train a "
        "small CNN with one trainer per worker (the fastest sync mode for this machine: "
        "model averaging on CPU, a gradient all-reduce per step on GPUs), evaluate and "
        "predict on the workers, and print what happened. Needs no download.",
    )
    parser.add_argument("--n-workers", type=int, default=2, help="Dask workers (default 2).")
    parser.add_argument("--iterations", type=int, default=3, help="fit iterations (default 3).")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per iteration (default 2).")
    parser.add_argument("--registry", help="SQLAlchemy URL of the registry (default: config).")
    parser.add_argument("--plot", metavar="PNG", help="write the training curves to this file.")
    parser.set_defaults(handler=_run, group_parser=parser)


def _run(args: argparse.Namespace) -> int:
    from dvml.demo import run_demo

    result = run_demo(
        n_workers=args.n_workers,
        num_iterations=args.iterations,
        epochs=args.epochs,
        registry=args.registry,
        plot=args.plot,
    )
    return 0 if result["weights_identical"] else 1
