"""The process behind ``dvml cluster up``: own one LocalCluster until told to stop.

``python -m dvml.cluster.serve --state-dir DIR ...`` starts a :class:`~dvml.LocalCluster`,
records it in ``DIR/cluster.json`` (written atomically) and waits. SIGTERM or SIGINT closes the
cluster and removes the state file; deleting the state file has the same effect. A signal that
arrives while the cluster is still starting aborts the start, which stops whatever had started.

``dvml cluster up`` runs this in a new session with its output in ``DIR/cluster.log``.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.cluster.local_cluster import LocalCluster
from dvml.cluster.state import (
    private_dir,
    process_identity,
    process_start_time,
    remove_state,
    state_path,
    write_state,
)
from dvml.exceptions import ArgumentError, DvmlError

if TYPE_CHECKING:
    from dvml.cluster.local_cluster import LocalCluster

__all__ = ["build_parser", "main", "parse_gpus", "parse_hosts"]

logger = logging.getLogger("dvml.cluster.serve")

# How often the waiting loop checks that the state file still exists.
_CHECK_INTERVAL = 0.5


def parse_gpus(text: str) -> int | list[int]:
    """Parse ``--gpus``: ``"2"`` (every worker) or ``"1,1,0,0"`` (one count per worker)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        counts = [int(p) for p in parts]
    except ValueError:
        raise ArgumentError(
            "--gpus must be a GPU count for every worker or one count per worker, such as "
            f"'1' or '1,1,0,0'. Received: --gpus={text!r}."
        ) from None
    return counts[0] if len(counts) == 1 and "," not in text else counts


def parse_hosts(text: str) -> int | list[str]:
    """Parse ``--hosts``: a number of simulated hosts or comma-separated host names."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    return [h.strip() for h in text.split(",")]


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The LocalCluster options shared by ``dvml cluster up`` and this module."""
    parser.add_argument(
        "--n-workers", type=int, default=None, metavar="N",
        help="Dask workers, each with its own vineyardd (default: config cluster.n-workers).",
    )  # fmt: skip
    parser.add_argument(
        "--hosts", default=None, metavar="H",
        help="simulated hosts: a count (workers spread over them in blocks) or comma-separated "
        "names, one per worker (default: one host per worker).",
    )  # fmt: skip
    parser.add_argument(
        "--gpus", default="0", metavar="G",
        help="GPUs declared for every worker ('1') or per worker ('1,1,0,0'); default 0.",
    )  # fmt: skip
    parser.add_argument(
        "--vineyard-memory", default=None, metavar="SIZE",
        help="shared memory of each vineyardd, e.g. 512MiB (default: config "
        "cluster.vineyard-memory); checked against free /dev/shm.",
    )  # fmt: skip
    parser.add_argument(
        "--scheduler-port", type=int, default=0, metavar="P",
        help="port of the Dask scheduler on 127.0.0.1 (default: a free one).",
    )  # fmt: skip
    parser.add_argument(
        "--dashboard-address", default="127.0.0.1:0", metavar="ADDR",
        help="where the Dask dashboard listens, or 'none' (default: a free port on 127.0.0.1).",
    )  # fmt: skip
    parser.add_argument(
        "--start-timeout", type=float, default=None, metavar="SECONDS",
        help="seconds to wait for each daemon (default: config cluster.start-timeout).",
    )  # fmt: skip


def cluster_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of :class:`~dvml.LocalCluster` from parsed command-line options."""
    dashboard = args.dashboard_address
    return {
        "n_workers": args.n_workers,
        "hosts": parse_hosts(args.hosts) if args.hosts is not None else None,
        "gpus": parse_gpus(args.gpus),
        "vineyard_memory": args.vineyard_memory,
        "scheduler_port": args.scheduler_port,
        "dashboard_address": None if str(dashboard).lower() == "none" else dashboard,
        "start_timeout": args.start_timeout,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dvml.cluster.serve",
        description="Run a dvml LocalCluster until SIGTERM/SIGINT or until its state file is "
        "deleted. Normally started by `dvml cluster up`.",
    )
    parser.add_argument("--state-dir", required=True, help="where cluster.json is written.")
    parser.add_argument("--log", default=None, help="path of this process's log, recorded.")
    add_cluster_arguments(parser)
    return parser


def _state_of(cluster: LocalCluster, log: str | None) -> dict[str, Any]:
    try:
        dashboard: str | None = cluster.dashboard_link
    except Exception:  # no dashboard was started
        dashboard = None
    pids = cluster.processes()
    ids = {name: process_identity(pid) for name, pid in pids.items()}
    me = process_identity(os.getpid()) or {}
    return {
        "pid": os.getpid(),
        "start_time": process_start_time(os.getpid()),
        "cmdline": me.get("cmdline"),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "scheduler_address": cluster.scheduler_address,
        "dashboard_link": dashboard,
        "etcd_endpoint": cluster.etcd_endpoint,
        "etcd_socket": cluster.etcd_socket,
        # Where dvml.connect and the CLI find the client certificate (0700 directory).
        "tls": cluster.tls_files,
        "directory": cluster.directory,
        "log": log,
        "processes": pids,
        "start_times": {name: process_start_time(pid) for name, pid in pids.items()},
        # With the start times: what proves that a recorded pid is still ours (`down`).
        "cmdlines": {name: (i or {}).get("cmdline") for name, i in ids.items()},
        "workers": [w.as_row() for w in cluster.workers],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Start the cluster, record it, wait for a signal or the state file's removal, stop."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    state_dir = pathlib.Path(args.state_dir).expanduser()
    private_dir(state_dir, root=state_dir)
    stop = threading.Event()
    starting = [True]

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        if starting[0]:
            # Abort the start: LocalCluster stops whatever it had started, then re-raises.
            starting[0] = False
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        cluster = LocalCluster(**cluster_kwargs(args), set_as_default=True)
    except KeyboardInterrupt:
        logger.info("stopped by a signal while starting; nothing is left running")
        return 1
    except (DvmlError, ValueError, TypeError, OSError) as exc:
        print(f"dvml.cluster.serve: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # e.g. Dask's RuntimeError("Cluster failed to start: ...")
        logger.error("the cluster failed to start", exc_info=True)
        print(f"dvml.cluster.serve: error: {exc}", file=sys.stderr, flush=True)
        return 1
    starting[0] = False
    path = state_path(state_dir)
    try:
        state = _state_of(cluster, args.log)
        write_state(state_dir, state)
        logger.info("ready: %s, state in %s", cluster.scheduler_address, path)
        while not stop.is_set():
            if not path.exists():
                logger.info("state file %s was removed; stopping", path)
                break
            pids = cluster.processes()
            if pids != state["processes"]:  # a Nanny restarted a worker: record its new pid
                state = _state_of(cluster, args.log)
                if path.exists():
                    write_state(state_dir, state)
            stop.wait(_CHECK_INTERVAL)
        else:
            logger.info("stopping on a signal")
    finally:
        # A second signal while closing must not interrupt the close.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.close()
        remove_state(state_dir, pid=os.getpid())
        logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
