"""Which cluster a job uses, and cleaning up after a job whose client was killed.

A job attaches to ``--scheduler ADDR`` or ``cluster.scheduler``, starts a LocalCluster for
``cluster.local``, or else attaches to the cluster recorded by ``dvml cluster up``.

A client that dies (SIGKILL, lost machine) leaves two kinds of debris that dvml cannot clean
from inside the dead process:

- *orphaned tasks*: Dask cannot stop a running task. A task the scheduler has released (no
  client wants its result any more) stays *cancelled* on its worker until it returns, holding
  a worker thread. Trainer tasks would run a whole fit: :func:`abort_orphaned_trainers` sets
  their fit's abort event, and each launcher stops its trainer process within a second. Other
  tasks (packing a buffer, featurizing one) end by themselves soon;
  :func:`wait_for_released_tasks` waits for them, so that nothing puts objects any more.
- *staging objects*: buffers put by a preprocessor that never published its dataset.
  :func:`staging_runs` lists them by run and :func:`drop_staging` deletes them on the workers
  that own them (after the orphaned tasks have ended, or a late put would escape).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.cluster.attach import connect
from dvml.cluster.local_cluster import LocalCluster
from dvml.cluster.security import recorded_security
from dvml.cluster.state import recorded_scheduler as _recorded
from dvml.cluster.state import state_path
from dvml.exceptions import ClusterError
from dvml.store.publish import cleanup_run, staged_objects
from dvml.store.staging import run_of

if TYPE_CHECKING:
    from distributed import Client

    from dvml.cluster.attach import Cluster

__all__ = [
    "abort_orphaned_trainers",
    "cluster_plan",
    "drop_staging",
    "open_cluster",
    "recorded_scheduler",
    "released_tasks",
    "staging_runs",
    "wait_for_released_tasks",
]

# How dvml.train.fit names its trainer tasks and abort events (dvml/train/fit.py):
# key f"dvml-trainer-{job_id}-{worker name}", event f"dvml-fit-abort-{job_id}", job_id 12 hex.
logger = logging.getLogger(__name__)

_TRAINER_PREFIX = "dvml-trainer-"
_ABORT_PREFIX = "dvml-fit-abort-"
_JOB_ID_LENGTH = 12


def _state_dir(state_dir: str | os.PathLike[str] | None) -> pathlib.Path:
    if state_dir is not None:
        return pathlib.Path(state_dir).expanduser()

    return config.state_dir()


_CLI_HINT = (
    "Pass --scheduler ADDR, set cluster.scheduler or cluster.local in the config, or start one "
    "with `dvml cluster up`."
)


def recorded_scheduler(state_dir: str | os.PathLike[str] | None = None) -> str:
    """The scheduler address of the running cluster recorded by ``dvml cluster up``.

    :func:`dvml.cluster.state.recorded_scheduler`, with the job's options as the next step.

    Raises
    ------
    NoClusterError
        No cluster is recorded in ``state_dir``.
    ClusterError
        The recorded cluster no longer runs.
    """
    return _recorded(_state_dir(state_dir), _CLI_HINT)


def cluster_plan(
    section: Mapping[str, Any] | None,
    scheduler: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> str:
    """One line saying which cluster :func:`open_cluster` would use (nothing is contacted)."""
    section = section or {}
    if scheduler or section.get("scheduler"):
        return f"attach to the scheduler at {scheduler or section['scheduler']}"
    local = section.get("local")
    if local is not None:
        extra = ", ".join(f"{k}={v}" for k, v in local.items() if v is not None)
        return f"start a LocalCluster ({extra}) and stop it at the end"

    return f"attach to the cluster recorded in {state_path(_state_dir(state_dir))}"


@contextlib.contextmanager
def open_cluster(
    section: Mapping[str, Any] | None,
    scheduler: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> Iterator[Cluster]:
    """Attach to or start the job's cluster; its client is the default one inside.

    Parameters
    ----------
    section : dict or None
        The ``cluster`` section of a job file (``scheduler``, ``local``, ``timeout``).
    scheduler : str, optional
        ``--scheduler ADDR``: wins over the section.
    state_dir : path, optional
        Where ``dvml cluster up`` recorded its cluster (default: config ``cluster.state-dir``).

    Yields
    ------
    dvml.Cluster
        Closed (a started LocalCluster: stopped) on exit.
    """
    import warnings

    section = section or {}
    timeout = float(section.get("timeout") or 30.0)
    address = scheduler or section.get("scheduler")
    local = section.get("local")
    if not address and local is not None:
        kwargs = {k: v for k, v in local.items() if v is not None}
        with LocalCluster(**kwargs) as started:
            yield started
        return
    if not address:
        address = recorded_scheduler(state_dir)
    # The certificate of the cluster `dvml cluster up` recorded in state_dir (Dask TLS);
    # None: connect looks in the configured state directory, then Dask's configuration.
    security = recorded_security(address, _state_dir(state_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # workers without vineyardd fail later, by name
        cluster = connect(address, timeout=timeout, security=security)
    try:
        yield cluster
    finally:
        _release_trainers(cluster)
        cluster.close()


def _release_trainers(cluster: Cluster) -> None:
    """Stop this job's serving trainers before it disconnects: the cluster outlives the job,
    and the next job would otherwise find them running (an "orphan" to stop)."""
    from dvml.train.runtime.sessions import release_inference_trainers

    try:
        release_inference_trainers(cluster.client)
    except Exception as exc:  # the job's outcome stands; its leases stop them anyway
        logger.debug("could not stop the job's serving trainers: %s", exc)


# -- orphaned tasks ------------------------------------------------------------------------


def _released_tasks(dask_worker: Any) -> list[str]:
    """Run on a worker: keys of the tasks still running that no client wants any more."""
    return [str(k) for k, ts in list(dask_worker.state.tasks.items()) if ts.state == "cancelled"]


def released_tasks(client: Client) -> list[str]:
    """Keys of the tasks that run on some worker although no client wants their result."""
    found = client.run(_released_tasks, on_error="return")
    return sorted(k for keys in found.values() if isinstance(keys, list) for k in keys)


def _find_released(client: Client) -> list[str]:
    return [k for k in released_tasks(client) if k.startswith(_TRAINER_PREFIX)]


def abort_orphaned_trainers(client: Client, timeout: float = 60.0) -> list[str]:
    """Stop the trainers of jobs whose client is gone; return their task keys and job ids.

    The runtime's client lease stops them by itself within seconds; this does it at once. A
    fit's trainer task whose client died stays *cancelled* on its worker while it runs: nobody
    will read its result, but it holds a worker thread (and its peers) until it ends. Setting
    its fit's abort event makes the launcher stop the trainer process; this waits (up to
    ``timeout`` seconds) until the tasks have ended. The serving trainers of a
    ``fit_multiple`` (or model search) whose client is gone are stopped on every worker.
    """
    from distributed import Event

    from dvml.train.runtime.sessions import stop_orphaned_sessions

    found = client.run(stop_orphaned_sessions, on_error="return")
    sessions = sorted({j for ids in found.values() if isinstance(ids, list) for j in ids})
    keys = _find_released(client)
    job_ids = {k[len(_TRAINER_PREFIX) :][:_JOB_ID_LENGTH] for k in keys}
    events = [Event(f"{_ABORT_PREFIX}{job_id}", client=client) for job_id in sorted(job_ids)]
    for event in events:
        event.set()
    deadline = time.monotonic() + timeout
    while keys and _find_released(client) and time.monotonic() < deadline:
        time.sleep(0.25)
    left = _find_released(client) if keys else []
    if not left:
        for event in events:
            event.clear()  # events live on the scheduler until cleared
    if left:
        raise ClusterError(
            f"Trainers of a killed fit still run after {timeout:.0f}s: {left}. Received: abort "
            "events set for their jobs. Check the workers' logs; restart the workers if they "
            "hang."
        )
    return keys + sessions


def wait_for_released_tasks(client: Client, timeout: float = 120.0) -> list[str]:
    """Wait until no released task runs on any worker; return the keys that were running.

    Raises
    ------
    ClusterError
        Naming the tasks still running after ``timeout`` seconds.
    """
    first = released_tasks(client)
    deadline = time.monotonic() + timeout
    left = first
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = released_tasks(client)
    if left:
        raise ClusterError(
            f"Tasks of a killed client still run after {timeout:.0f}s: {left[:5]}. Received: "
            "tasks no client wants any more. Check the workers' logs; restart the workers if "
            "they hang."
        )
    return first


# -- staging objects -----------------------------------------------------------------------


def staging_runs(client: Client) -> dict[str, list[tuple[str, int, int]]]:
    """Staged (never published) objects by preprocessing run id: ``[(name, id, instance)]``."""
    runs: dict[str, list[tuple[str, int, int]]] = {}
    for name, oid, iid in staged_objects(client):
        runs.setdefault(run_of(name), []).append((name, oid, iid))
    return runs


def drop_staging(client: Client, run_ids: Iterable[str]) -> int:
    """Delete the staged objects of ``run_ids``; return how many there were.

    A dataset that one of these runs published and named keeps its tensors.
    """
    runs = staging_runs(client)
    count = 0
    for run_id in set(run_ids) & set(runs):
        cleanup_run(client, run_id, keep=None)
        count += len(runs[run_id])
    return count
