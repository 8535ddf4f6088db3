"""The ``dvml`` command line: one subcommand group per module.

Each module listed in :data:`COMMAND_MODULES` has a ``register(subparsers)`` function that adds
its group (``dvml cluster ...``) and sets ``handler`` on every leaf parser: a function that takes
the parsed arguments and returns the exit code. Modules import heavy dependencies (Dask,
vineyard, TensorFlow) inside their handlers, so ``dvml --help`` stays fast.

Errors that dvml expects (:class:`~dvml.exceptions.DvmlError`, ``ValueError``, ``TypeError``,
``OSError``) print ``dvml: error: <message>`` on stderr and exit with 1, without a traceback
unless ``--debug`` is given; usage errors exit with 2, as argparse does. A reader that closes
the pipe early (``dvml models list | head``) ends the command quietly with 141, the status of a
Unix tool killed by SIGPIPE, as Python's documentation on SIGPIPE recommends.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main", "reference_parser"]

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


def reference_parser() -> argparse.ArgumentParser:
    """:func:`build_parser` without the deprecated command names: what the docs may use.

    ``docs/cli.rst`` documents this parser, and ``tests/test_docs_run.py`` checks the docs'
    command lines against it, so that no page teaches a name kept only as an alias
    (:func:`dvml.cli._common.add_alias`).
    """
    parser = build_parser()
    _drop_deprecated(parser)
    return parser


def _drop_deprecated(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            # choices is this same dict: the name is gone from parsing and from the docs
            for name, sub in list(action._name_parser_map.items()):
                if getattr(sub, "dvml_deprecated", False):
                    del action._name_parser_map[name]
                else:
                    _drop_deprecated(sub)


# 128 + SIGPIPE: what a shell reports for a tool that the closed pipe ended (`set -o pipefail`).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dvml`` with ``argv`` (``sys.argv[1:]`` when None) and return the exit code."""
    try:
        try:
            return _run(argv)
        finally:
            # Flush here, not at interpreter exit, where a closed pipe prints "Exception ignored".
            sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_is_broken():
            raise
        # Python's recipe: point stdout at devnull so the exit-time flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _stdout_is_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (POLLERR on its write end): a broken
    connection to a cluster is an error to report, not a reader that stopped reading."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def _run(argv: Sequence[str] | None) -> int:
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
    except BrokenPipeError:
        if _stdout_is_broken():
            raise  # main() ends quietly
        if args.debug:
            raise
        print(f"dvml: error: {sys.exc_info()[1]}", file=sys.stderr)
        return 1
    except (DvmlError, ValueError, TypeError, OSError) as exc:
        if args.debug:
            raise
        print(f"dvml: error: {exc}", file=sys.stderr)
        return 1
