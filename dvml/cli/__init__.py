"""The ``dvml`` command line: one subcommand group per module.

Each module listed in :data:`COMMAND_MODULES` has a ``register(subparsers)`` function that adds
its group (``dvml cluster ...``) and sets ``handler`` on every leaf parser: a function that takes
the parsed arguments and returns the exit code. Modules import heavy dependencies (Dask,
vineyard, TensorFlow) inside their handlers, so ``dvml --help`` stays fast.

Errors that dvml expects (:class:`~dvml.exceptions.DvmlError`, ``ValueError``, ``TypeError``,
``OSError``) print ``dvml: error: <message>`` on stderr and exit with 1, without a traceback
unless ``--debug`` is given; usage errors exit with 2, as argparse does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

# Add a group by adding its module here; its register(subparsers) does the rest.
COMMAND_MODULES: tuple[str, ...] = (
    "dvml.cli.cluster_cmd",
    "dvml.cli.demo_cmd",
    "dvml.cli.datasets_cmd",
    "dvml.cli.models_cmd",
    "dvml.cli.train_cmd",
    "dvml.cli.fit_multiple_cmd",
    "dvml.cli.automl_cmd",
    "dvml.cli.model_configs_cmd",
    "dvml.cli.features_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered command group."""
    from dvml._version import __version__

    parser = argparse.ArgumentParser(
        prog="dvml",
        description="dvml: Dask + Vineyard in-memory data and compute platform for deep "
        "learning. Run `dvml <group> --help` for the commands of a group.",
    )
    parser.add_argument("--version", action="version", version=f"dvml {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback when a command fails."
    )
    subparsers = parser.add_subparsers(title="command groups", dest="group", metavar="<group>")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dvml`` with ``argv`` (``sys.argv[1:]`` when None) and return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        # A group without its command (`dvml cluster`): show that group's help.
        (getattr(args, "group_parser", None) or parser).print_help(sys.stderr)
        return 2
    from dvml.exceptions import DvmlError

    try:
        return int(handler(args))
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("dvml: interrupted", file=sys.stderr)
        return 130
    except (DvmlError, ValueError, TypeError, OSError) as exc:
        if args.debug:
            raise
        print(f"dvml: error: {exc}", file=sys.stderr)
        return 1
