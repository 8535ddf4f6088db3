"""Helpers shared by the command modules: groups, the state directory, plain-text tables."""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "add_alias",
    "add_command",
    "add_group",
    "add_state_dir_argument",
    "distribution_table",
    "format_nbytes",
    "format_table",
    "state_dir_of",
    "with_bytes",
]

Handler = Callable[[argparse.Namespace], int]


def add_group(
    subparsers: Any, name: str, help: str, description: str | None = None
) -> tuple[argparse.ArgumentParser, Any]:
    """Add the command group ``dvml <name>``; return its parser and its subparsers.

    ``dvml <name>`` alone prints the group's help.
    """
    group = subparsers.add_parser(name, help=help, description=description or help)
    group.set_defaults(handler=None, group_parser=group)
    return group, group.add_subparsers(title="commands", dest="command", metavar="<command>")


def add_command(
    subparsers: Any, name: str, handler: Handler, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """Add one command to a group; ``handler(args)`` returns the exit code."""
    parser = subparsers.add_parser(name, help=help, description=description or help)
    parser.set_defaults(handler=handler)
    return parser


def add_alias(
    subparsers: Any, old: str, command: argparse.ArgumentParser, group: str
) -> argparse.ArgumentParser:
    """Keep the renamed command ``dvml <group> <old>`` for one release (hidden from help).

    It takes the same arguments as ``command``, runs it, and first says on stderr that
    ``old`` is deprecated and what to type instead (as :func:`dvml.deprecation.renamed` warns
    in Python).
    """
    from dvml.deprecation import REMOVED_AFTER

    # No help= keeps it out of the group's list of commands.
    alias = subparsers.add_parser(old, add_help=False, description=command.description)
    alias._add_container_actions(command)  # what argparse's parents= does: same arguments
    new = command.prog.rpartition(" ")[2]
    handler: Handler = command.get_default("handler")

    def warn_then_run(args: argparse.Namespace) -> int:
        print(
            f"dvml: warning: `dvml {group} {old}` is deprecated and will be removed after dvml "
            f"{REMOVED_AFTER}: use `dvml {group} {new}` (same arguments).",
            file=sys.stderr,
        )
        return handler(args)

    alias.set_defaults(handler=warn_then_run)
    alias.dvml_deprecated = True  # read by dvml.cli.reference_parser
    return alias


def add_state_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="where the cluster's state file (cluster.json) and log live "
        "(default: config cluster.state-dir, ~/.dvml).",
    )


def state_dir_of(args: argparse.Namespace) -> pathlib.Path:
    """The state directory given with ``--state-dir``, else the configured one."""
    if getattr(args, "state_dir", None):
        return pathlib.Path(args.state_dir).expanduser().absolute()
    from dvml import config

    return config.state_dir().absolute()


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as a left-aligned plain-text table with a header line.

    ``None`` and NaN show as ``-``; ``columns`` picks and orders the columns (default: the
    keys of the first row).
    """
    if not rows:
        return "(none)"
    cols = list(columns) if columns is not None else list(rows[0])
    cells = [[_cell(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


_DISTRIBUTION_COLUMNS = ["worker_name", "host", "vineyard_instance_id", "buffers", "rows", "bytes"]


def distribution_table(ds: Any) -> str:
    """Rows, buffers and bytes per worker of a dataset or feature cache (``describe``)."""
    return format_table(
        with_bytes(ds.distribution().to_dict(orient="records")), _DISTRIBUTION_COLUMNS
    )


def format_nbytes(value: Any) -> str:
    """A byte count for people: ``1.50 MiB``."""
    from dask.utils import format_bytes

    return str(format_bytes(int(value)))


def with_bytes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add a readable ``bytes`` column from each row's ``nbytes`` (in place); return rows."""
    for row in rows:
        row["bytes"] = format_nbytes(row["nbytes"])
    return rows
