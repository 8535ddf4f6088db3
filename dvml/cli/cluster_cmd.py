"""``dvml cluster up|status|down``: a LocalCluster that outlives the command that started it.

``up`` takes the state directory's lock, runs :mod:`dvml.cluster.serve` in a new session and
waits for the state file it writes; ``status`` attaches to the recorded scheduler; ``down``
stops the recorded processes by pid (each checked against its recorded start time and command
line, so a reused pid is never signalled). ``status`` and ``down`` clean up what a cluster whose
serve process died left: its processes (proven ours), its state file and its directory.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

from dvml.cli._common import (
    add_command,
    add_group,
    add_state_dir_argument,
    format_table,
    state_dir_of,
)
from dvml.cluster.lifeline import is_same_process

__all__ = ["register"]

# Columns of the worker table printed by `up` and `status`, in this order.
_WORKER_COLUMNS = ["name", "host", "address", "vineyard_instance_id", "gpus", "pid"]
_STATUS_COLUMNS = [
    "name", "host", "address", "vineyard_instance_id", "gpus", "vineyardd", "memory",
    "reserved", "etcd_reachable",
]  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``cluster`` group to the top-level ``dvml`` parser."""
    from dvml.cluster.serve import add_cluster_arguments

    _, commands = add_group(
        subparsers,
        "cluster",
        help="start, inspect and stop a local dvml cluster (etcd, vineyardd, Dask).",
    )
    up = add_command(
        commands,
        "up",
        _up,
        help="start a LocalCluster in the background and record it in the state directory.",
        description="Start etcd, one vineyardd per worker and a Dask cluster in a background "
        "process, wait until it is ready, then print the scheduler address, the dashboard "
        "link and the worker table. Refuses when a running cluster is already recorded.",
    )
    add_cluster_arguments(up)
    add_state_dir_argument(up)
    up.add_argument(
        "--wait", type=float, default=None, metavar="SECONDS",
        help="how long to wait for the cluster to be ready (default: 4 x start timeout + 30).",
    )  # fmt: skip

    status = add_command(
        commands,
        "status",
        _status,
        help="show every worker with its vineyardd state and memory.",
        description="Attach to the recorded (or given) scheduler and print one row per worker "
        "with its host, vineyard instance, GPUs, vineyardd state and memory (used / size), "
        "the bytes running jobs reserve on its machine by their memory plans, then one row per "
        "reservation (job, machine, planned bytes). Exits with 1 when no cluster runs or a "
        "vineyardd is not running.",
    )
    add_state_dir_argument(status)
    status.add_argument(
        "--scheduler", default=None, metavar="ADDR",
        help="a scheduler address such as tcp://10.0.0.5:8786, instead of the recorded one.",
    )  # fmt: skip
    status.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS",
        help="seconds to wait for the scheduler (default 10).",
    )  # fmt: skip

    down = add_command(
        commands,
        "down",
        _down,
        help="stop the recorded cluster and every process it started.",
        description="Send SIGTERM to the recorded serve process, wait until it and every "
        "process it started are gone (SIGKILL by pid after --timeout), remove the state file.",
    )
    add_state_dir_argument(down)
    down.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS",
        help="seconds to wait for a clean stop before SIGKILL (default 60).",
    )  # fmt: skip


# -- up ------------------------------------------------------------------------------------


def _validate_up(args: argparse.Namespace) -> None:
    """Check the arguments here, so that a mistake is reported before any process starts."""
    from dvml import config
    from dvml.cluster.processes import port_is_free
    from dvml.cluster.serve import cluster_kwargs
    from dvml.cluster.spec import check_shared_memory, parse_memory, plan_workers
    from dvml.exceptions import ClusterStartError
    from dvml.limits import MAX_WAIT_S, check_port, check_seconds

    config.validate()
    # Ranges first: a port over 65535 overflows a C int, a NaN timeout compares false with
    # everything and 1e300 never ends (dvml.limits).
    if args.scheduler_port is not None:
        check_port(args.scheduler_port, "--scheduler-port")
    if args.start_timeout is not None:
        check_seconds(args.start_timeout, "--start-timeout")
    if args.wait is not None:
        check_seconds(args.wait, "--wait", MAX_WAIT_S)
    kwargs = cluster_kwargs(args)
    specs = plan_workers(
        config.get("cluster.n-workers", kwargs["n_workers"]), kwargs["gpus"], kwargs["hosts"]
    )
    memory = parse_memory(config.get("cluster.vineyard-memory", kwargs["vineyard_memory"]))
    check_shared_memory(memory, len(specs))
    port = args.scheduler_port
    if port and not port_is_free(port):
        raise ClusterStartError(
            f"The scheduler port {port} on 127.0.0.1 is already taken. Received: "
            f"--scheduler-port={port}. Choose another port, or leave it out for a free one."
        )


def _serve_argv(args: argparse.Namespace, state_dir: pathlib.Path, log: pathlib.Path) -> list[str]:
    argv = [sys.executable, "-m", "dvml.cluster.serve", "--state-dir", str(state_dir)]
    argv += ["--log", str(log)]
    options = {
        "--n-workers": args.n_workers,
        "--hosts": args.hosts,
        "--gpus": args.gpus,
        "--vineyard-memory": args.vineyard_memory,
        "--scheduler-port": args.scheduler_port,
        "--dashboard-address": args.dashboard_address,
        "--start-timeout": args.start_timeout,
    }
    for flag, value in options.items():
        if value is not None:
            argv.append(f"{flag}={value}")
    return argv


def _refuse_running(state_dir: pathlib.Path) -> None:
    from dvml.cluster.state import read_state, recorded_identities, state_path
    from dvml.exceptions import ClusterError

    state = read_state(state_dir)
    if state is None:
        return
    if is_same_process(recorded_identities(state)["serve"]):
        raise ClusterError(
            f"A cluster is already running at {state['scheduler_address']} (serve pid "
            f"{state['pid']}), recorded in {state_path(state_dir)}. Stop it with `dvml cluster "
            "down`, or give another --state-dir."
        )
    _clean_dead_cluster(state, state_dir)
    print(
        f"dvml: note: removed the stale state file {state_path(state_dir)} and what its cluster "
        f"left (serve pid {state['pid']} is gone).",
        file=sys.stderr,
    )


def _stop_recorded(
    state: dict[str, Any], timeout: float, serve_first: bool
) -> tuple[list[str], list[str]]:
    """Stop every recorded process that is proven ours (pid + start time + command line).

    SIGTERM (to the serve process alone when ``serve_first`` and it runs: it stops the rest in
    order), then SIGKILL after ``timeout``. Returns ``(killed, unproven)``: what needed SIGKILL,
    and recorded pids that run but are not proven ours (never signalled).
    """
    from dvml.cluster.processes import poll_for
    from dvml.cluster.state import recorded_identities, signal_process

    ids = recorded_identities(state)
    if not (serve_first and signal_process(ids["serve"], signal.SIGTERM)):
        # Workers before daemons.
        for name in sorted(ids, key=lambda n: (n == "etcd", n.startswith("vineyardd"))):
            signal_process(ids[name], signal.SIGTERM)

    def all_gone() -> bool:
        return not any(is_same_process(i) for i in ids.values())

    killed = []
    if not poll_for(all_gone, timeout, interval=0.2):
        for name, identity in ids.items():
            if signal_process(identity, signal.SIGKILL):
                killed.append(f"{name} (pid {identity['pid']})")
        poll_for(all_gone, 10, interval=0.1)
    left = [f"{n} (pid {i['pid']})" for n, i in ids.items() if is_same_process(i)]
    if left:
        from dvml.exceptions import ClusterError

        raise ClusterError(
            f"Could not stop {', '.join(left)} of the cluster at {state['scheduler_address']}. "
            "The state file is kept; stop them by pid, then run `dvml cluster down` again."
        )
    unproven = [f"{n} (pid {i['pid']})" for n, i in ids.items() if _undecidable(i)]
    return killed, unproven


def _undecidable(identity: dict[str, Any]) -> bool:
    """A recorded pid that runs, recorded without the start time or command line that would
    tell whether it is still ours (a mismatch of either proves it is not)."""
    from dvml.cluster.state import process_start_time

    pid, recorded = identity.get("pid"), identity.get("start_time")
    now = process_start_time(pid) if isinstance(pid, int) and pid > 0 else None
    if now is None:
        return False
    if recorded is None:
        return True
    return abs(now - float(recorded)) < 1.0 and not identity.get("cmdline")


def _remove_cluster_directory(state: dict[str, Any]) -> None:
    """Remove the recorded cluster directory, when it is provably a dead dvml cluster's own."""
    from dvml.cluster.lifeline import sweep_dead_clusters

    directory = state.get("directory")
    if directory:
        path = pathlib.Path(directory)
        # Only a `dvml-cluster-*` directory of this user whose owner.json names a process that
        # is gone: a forged state file cannot make `down` delete anything else.
        sweep_dead_clusters(str(path.parent), min_age=0.0, only=path.name)
    sweep_dead_clusters()


def _clean_dead_cluster(state: dict[str, Any], state_dir: pathlib.Path) -> list[str]:
    """What a cluster whose serve process is gone left: stop it, remove its files.

    Returns the recorded pids that run but were not proven ours (never signalled); with any,
    the state file is kept.
    """
    from dvml.cluster.state import remove_state, state_path
    from dvml.exceptions import ClusterError

    _, unproven = _stop_recorded(state, timeout=10.0, serve_first=False)
    _remove_cluster_directory(state)
    if unproven:
        raise ClusterError(
            f"The cluster recorded in {state_path(state_dir)} is not running, but the file "
            f"names running processes that cannot be proven to be its own (pid, start time "
            f"and command line do not all match): {', '.join(unproven)}. Nothing was "
            "signalled. If they are yours, stop them by pid; then delete the state file."
        )
    remove_state(state_dir)
    return unproven


def _log_tail(path: pathlib.Path, n_lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n_lines:]).rstrip()
    except OSError:
        return "(no log)"


def _stop_child(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Stop the serve process we started: SIGTERM (it aborts its start), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _up(args: argparse.Namespace) -> int:
    from dvml.cluster.state import private_dir, state_lock

    state_dir = state_dir_of(args)
    _validate_up(args)
    # Owner-only, and tightened if an older dvml made it 0755: cluster.log and cluster.json
    # hold pids, command lines and the paths of the TLS key.
    private_dir(state_dir, root=state_dir)
    # Held until the cluster is recorded (or failed): a second `up` started at the same moment
    # fails at once instead of starting a second, unrecorded cluster.
    with state_lock(state_dir):
        return _up_locked(args, state_dir)


def _up_locked(args: argparse.Namespace, state_dir: pathlib.Path) -> int:
    from dvml import config
    from dvml.cluster.state import LOG_FILE, private_file, read_state, state_path
    from dvml.exceptions import ClusterStartError

    _refuse_running(state_dir)
    log = state_dir / LOG_FILE
    wait = args.wait
    if wait is None:
        # etcd, the first vineyardd, the others and the workers each get the start timeout.
        wait = 4 * float(config.get("cluster.start-timeout", args.start_timeout)) + 30

    with private_file(log, "wb") as log_file:
        # A new session: closing the terminal or Ctrl-C there does not reach the cluster.
        proc = subprocess.Popen(
            _serve_argv(args, state_dir, log),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state: dict[str, Any] | None = None
    deadline = time.monotonic() + wait
    try:
        while True:
            if proc.poll() is not None:
                raise ClusterStartError(
                    f"The cluster process exited with code {proc.returncode} before it was "
                    f"ready. Its log ({log}) ends with:\n{_log_tail(log)}"
                )
            state = read_state(state_dir)
            if state is not None and state.get("pid") == proc.pid:
                break
            if time.monotonic() > deadline:
                _stop_child(proc)
                raise ClusterStartError(
                    f"The cluster was not ready within {wait:.0f}s and was stopped. Received: "
                    f"--wait={args.wait}. Its log ({log}) ends with:\n{_log_tail(log)}"
                )
            time.sleep(0.2)
    except KeyboardInterrupt:
        _stop_child(proc)
        raise

    print(f"dvml cluster is up (serve pid {proc.pid}).")
    print(f"  scheduler: {state['scheduler_address']}")
    print(f"  dashboard: {state.get('dashboard_link') or '(off)'}")
    print(f"  state:     {state_path(state_dir)}")
    print(f"  log:       {log}")
    print(format_table(state.get("workers", []), _WORKER_COLUMNS))
    print(
        f"Attach with dvml.connect({state['scheduler_address']!r}); stop with `dvml cluster down`."
    )
    return 0


# -- status --------------------------------------------------------------------------------


def _recorded_live_state(state_dir: pathlib.Path) -> dict[str, Any]:
    from dvml.cluster.state import read_state, recorded_identities, state_path
    from dvml.exceptions import ClusterError, NoClusterError

    state = read_state(state_dir)
    path = state_path(state_dir)
    if state is None:
        raise NoClusterError(
            f"No cluster is recorded in {path}. Start one with `dvml cluster up`, or pass "
            "--scheduler ADDR."
        )
    if not is_same_process(recorded_identities(state)["serve"]):
        _clean_dead_cluster(state, state_dir)
        raise ClusterError(
            f"The cluster recorded in {path} is not running: its serve process (pid "
            f"{state['pid']}) is gone. What it left (processes, its directory "
            f"{state.get('directory')}) was cleaned up and the stale state file was removed. "
            "Start a new cluster with `dvml cluster up`."
        )
    return state


def _memory(row: dict[str, Any]) -> str | None:
    from dask.utils import format_bytes

    used, limit = row.get("memory_used"), row.get("memory_limit")
    if used is None or limit is None or used != used or limit != limit:  # None or NaN
        return None
    return f"{format_bytes(int(used))} / {format_bytes(int(limit))}"


def _reservations(client: Any) -> list[dict[str, Any]] | None:
    """The running jobs' memory reservations (on the scheduler); None when they cannot be
    read (a scheduler that refuses ``run_on_scheduler``): the status goes on without them."""
    from dvml.train.fit_admission import read_reservations

    try:
        return read_reservations(client)
    except Exception:
        return None


def _running_jobs(client: Any) -> list[dict[str, Any]] | None:
    """The running fits as dvml's dashboard page shows them (with their straggler); None
    when they cannot be read: the status goes on without them."""
    from dvml.dashboard.handlers import running_jobs

    try:
        return list(client.run_on_scheduler(running_jobs))
    except Exception:
        return None


def job_rows(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per running fit: its model, sync mode, iterations done, elapsed seconds and
    the trainer that holds the others back, if one does (pure)."""
    rows = []
    for j in jobs:
        slow = j.get("straggler")
        rows.append({
            "model": j.get("model"),
            "sync": j.get("sync"),
            "iteration": f"{j.get('iteration', 0)}/{j.get('num_iterations') or '?'}",
            "elapsed": f"{float(j.get('elapsed') or 0):.0f}s",
            "straggler": f"{slow['worker']} ({slow['ratio']:.1f}x the others' step time)"
            if slow else None,
        })  # fmt: skip
    return rows


def _print_running(reservations: list[Any] | None, jobs: list[Any] | None) -> None:
    """The running jobs' reservations and the running fits, when there are any."""
    if reservations:
        from dvml.placement.reservations import reservation_rows

        print()
        print("running jobs' memory reservations (their planned bytes, per machine):")
        print(format_table(reservation_rows(reservations)))
    if jobs:
        print()
        print("running fits (a straggler is a trainer slower than the others, see the page):")
        print(format_table(job_rows(jobs)))


def _reserved(host: str, reservations: list[dict[str, Any]] | None) -> str | None:
    """The bytes reserved on ``host``'s machine, for the worker table ("-": none)."""
    if reservations is None:
        return None
    from dvml.placement.memory import format_size
    from dvml.placement.reservations import reserved_on

    held = reserved_on(host, reservations)
    return format_size(held) if held else "-"


def _status(args: argparse.Namespace) -> int:
    import warnings

    from dvml.cluster.attach import connect, dvml_page_link
    from dvml.cluster.lifeline import sweep_dead_clusters
    from dvml.cluster.state import recorded_processes, same_process
    from dvml.limits import check_seconds

    check_seconds(args.timeout, "--timeout")
    sweep_dead_clusters()  # directories of LocalClusters whose owner was killed
    state: dict[str, Any] | None = None
    address = args.scheduler
    security = None
    if address is None:
        state = _recorded_live_state(state_dir_of(args))
        address = state["scheduler_address"]
        security = state.get("tls")  # the cluster's certificate (Dask TLS), if it has one
    else:
        from dvml.cluster.security import recorded_security

        # --scheduler ADDR of the cluster recorded in --state-dir: its certificate too.
        security = recorded_security(address, state_dir_of(args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unreachable vineyardd shows in the table instead
        cluster = connect(address, timeout=args.timeout, security=security)
    try:
        rows = cluster.status().to_dict(orient="records")
        reservations, jobs = _reservations(cluster.client), _running_jobs(cluster.client)
        try:
            dashboard: str | None = cluster.dashboard_link
        except Exception:  # a scheduler without a dashboard
            dashboard = None
    finally:
        cluster.close()
    for row in rows:
        row["memory"] = _memory(row)
        row["reserved"] = _reserved(str(row.get("host")), reservations)
        iid = row.get("vineyard_instance_id")  # a float column when one worker has none
        row["vineyard_instance_id"] = None if iid is None or iid != iid else int(iid)

    print(f"scheduler: {address}")
    print(f"dashboard: {dashboard or '(off)'}")
    if dashboard:
        print(f"dvml page: {dvml_page_link(dashboard)}")
    print(format_table(rows, _STATUS_COLUMNS))
    _print_running(reservations, jobs)
    if state is not None:
        procs = [
            {"process": name, "pid": pid, "state": "running" if same_process(pid, t) else "gone"}
            for name, (pid, t) in recorded_processes(state).items()
        ]
        print()
        print(format_table(procs))
    bad = [f"{r['name']} ({r['vineyardd']})" for r in rows if r.get("vineyardd") != "running"]
    if not rows:
        print("dvml: error: the scheduler has no workers.", file=sys.stderr)
        return 1
    if bad:
        print(f"dvml: error: vineyardd not running on: {', '.join(bad)}.", file=sys.stderr)
        return 1
    no_etcd = [str(r["name"]) for r in rows if r.get("etcd_reachable") == "unreachable"]
    if no_etcd:
        print(
            f"dvml: error: etcd is not reachable from {', '.join(no_etcd)}: vineyard metadata "
            "cannot be read or written. Restart the cluster (`dvml cluster down`, then `up`).",
            file=sys.stderr,
        )
        return 1
    return 0


# -- down ----------------------------------------------------------------------------------


def _down(args: argparse.Namespace) -> int:
    from dvml.cluster.lifeline import sweep_dead_clusters
    from dvml.cluster.state import read_state, recorded_identities, remove_state, state_path
    from dvml.exceptions import ClusterError, NoClusterError
    from dvml.limits import check_seconds

    check_seconds(args.timeout, "--timeout")
    sweep_dead_clusters()  # directories of LocalClusters whose owner was killed
    state_dir = state_dir_of(args)
    state = read_state(state_dir)
    if state is None:
        raise NoClusterError(
            f"No cluster is recorded in {state_path(state_dir)}; nothing to stop. Give the "
            "--state-dir that `dvml cluster up` used."
        )
    ids = recorded_identities(state)
    serve_pid = ids["serve"]["pid"]
    if is_same_process(ids["serve"]):
        stopping = f"serve pid {serve_pid}"
    else:  # killed? its daemons died with it; stop whatever is left, proven ours only
        stopping = f"the processes left by serve pid {serve_pid}"
    killed, unproven = _stop_recorded(state, args.timeout, serve_first=True)
    _remove_cluster_directory(state)
    if unproven:
        raise ClusterError(
            f"Nothing more was signalled: {', '.join(unproven)} run but are not proven to be "
            f"this cluster's (pid, start time and command line recorded in "
            f"{state_path(state_dir)} do not all match). If they are yours, stop them by pid; "
            "then delete the state file."
        )
    remove_state(state_dir)

    print(f"Stopped the cluster at {state['scheduler_address']} ({stopping}):")
    print(format_table([{"process": n, "pid": i["pid"]} for n, i in ids.items()]))
    if killed:
        print(
            f"dvml: warning: killed with SIGKILL after {args.timeout:.0f}s: {', '.join(killed)}.",
            file=sys.stderr,
        )
    return 0
