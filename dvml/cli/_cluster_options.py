"""The cluster options of commands that need one: ``--scheduler ADDR`` or the recorded cluster."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from dvml.cli._common import add_command, add_state_dir_argument, state_dir_of

if TYPE_CHECKING:
    from dvml.cluster.attach import Cluster

__all__ = [
    "add_cluster_options",
    "add_drop_command",
    "add_json_option",
    "attached",
    "drop_named",
    "print_json",
]


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """``--scheduler ADDR``, ``--timeout`` and ``--state-dir`` (where `dvml cluster up` wrote)."""
    parser.add_argument(
        "--scheduler", default=None, metavar="ADDR",
        help="the Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: the cluster recorded by "
        "`dvml cluster up`).",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help="seconds to wait for the scheduler (default 30).",
    )  # fmt: skip
    add_state_dir_argument(parser)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table.")


@contextlib.contextmanager
def attached(args: argparse.Namespace, section: dict[str, Any] | None = None) -> Iterator[Cluster]:
    """The cluster of ``--scheduler``, else of the job file's ``cluster`` section, else the
    recorded one; closed (a LocalCluster started for the job: stopped) on exit."""
    from dvml.jobs.job_cluster import open_cluster

    section = dict(section or {})
    if getattr(args, "timeout", None) is not None:
        from dvml.limits import check_seconds

        section["timeout"] = check_seconds(args.timeout, "--timeout")
    with open_cluster(section, args.scheduler, state_dir_of(args)) as cluster:
        yield cluster


@contextlib.contextmanager
def training_session(args: argparse.Namespace, job: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """The job's cluster (:func:`attached`) and registry (``--registry``, else the job file's)
    for a command that trains. Trainers of an earlier run whose client was killed are stopped
    first: their client lease would within seconds, but they hold the workers meanwhile."""
    from dvml.jobs.job_cluster import abort_orphaned_trainers
    from dvml.registry import Registry

    with (
        attached(args, job["cluster"]) as cluster,
        Registry(args.registry or job["registry"]) as registry,
    ):
        stopped = abort_orphaned_trainers(cluster.client)
        if stopped:
            print(f"Stopped {len(stopped)} orphaned trainer task(s) of a killed run.")
        yield cluster, registry


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def add_drop_command(
    commands: Any, handler: Callable[[argparse.Namespace], int], what: str
) -> argparse.ArgumentParser:
    """``drop NAME [--missing-ok]`` plus the cluster options, for a group of named objects."""
    drop = add_command(
        commands, "drop", handler, help=f"remove a {what} and free its memory on every worker."
    )
    drop.add_argument("name", help=f"the {what}'s name.")
    drop.add_argument(
        "--missing-ok", action="store_true", help=f"exit 0 when no {what} has this name."
    )
    drop.add_argument(
        "--force", action="store_true",
        help="drop it even while a job (a fit) reads it; stop that job first, or its "
        "trainers read freed memory.",
    )  # fmt: skip
    add_cluster_options(drop)
    return drop


def drop_named(
    args: argparse.Namespace,
    describe: Callable[[str, Any], Any],
    drop: Callable[..., Any],
    what: str,
) -> Any | None:
    """Describe, then drop, ``args.name`` on the attached cluster; return what was dropped.

    With ``--missing-ok``, a name that does not exist prints a line and returns None.
    """
    from dvml.exceptions import DatasetNotFoundError

    with attached(args) as cluster:
        try:
            found = describe(args.name, cluster.client)
        except DatasetNotFoundError:
            if args.missing_ok:
                print(f"No {what} named {args.name!r}: nothing to drop.")
                return None
            raise
        drop(args.name, cluster.client, force=getattr(args, "force", False))
    return found
