"""Fixtures shared by the whole suite: real clusters and a check that no process leaks.

``cluster4`` (4 workers on 2 simulated hosts, GPUs declared on the first two) and ``cluster2``
(2 workers) start once per session with ``set_as_default=False``: pass
``client=cluster.client`` explicitly. A test that needs to break or stop a cluster starts its
own ``dvml.LocalCluster`` instead.

Every test is checked for leaked child processes: a child of the test process that appears
during the test and still runs after it (a few seconds of grace) fails the test. The session
clusters' processes and multiprocessing's resource tracker are not counted. The helpers are
importable (``from conftest import poll_for, assert_no_new_processes``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from dvml.cluster.processes import poll_for

if TYPE_CHECKING:
    import dvml

__all__ = [
    "assert_no_new_processes",
    "child_processes",
    "object_exists",
    "pid_gone",
    "poll_for",
    "snapshot",
    "vineyard_contents",
]

# Session clusters, whose processes are excluded from the leak check.
_SESSION_CLUSTERS: list[dvml.LocalCluster] = []


def pid_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (a zombie counts as gone: it holds nothing but its pid)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _excluded_pids() -> set[int]:
    pids: set[int] = set()
    for cluster in _SESSION_CLUSTERS:
        pids.update(cluster.processes().values())
    # A session cluster's workers keep a standby trainer between fits (dvml.train.launch); it
    # belongs to the worker and is stopped with it, like the worker itself.
    for pid in list(pids):
        try:
            for child in psutil.Process(pid).children(recursive=True):
                if "dvml.train.trainer --standby" in " ".join(child.cmdline()):
                    pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def child_processes() -> dict[int, str]:
    """Running descendants of the test process: ``{pid: command line}``.

    Zombies, multiprocessing's resource tracker (it lives as long as the interpreter) and the
    session clusters' processes are left out.
    """
    excluded = _excluded_pids()
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in excluded or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "multiprocessing.resource_tracker" in cmdline:
            continue
        found[proc.pid] = cmdline
    return found


def assert_no_new_processes(before: dict[int, str], timeout: float = 10.0) -> None:
    """Fail when a child process not in ``before`` still runs after ``timeout`` seconds."""
    new: dict[int, str] = {}

    def none_new() -> bool:
        nonlocal new
        new = {p: c for p, c in child_processes().items() if p not in before}
        return not new

    if not poll_for(none_new, timeout, interval=0.1):
        lines = "\n".join(f"  pid {p}: {c[:200]}" for p, c in sorted(new.items()))
        pytest.fail(f"{len(new)} child process(es) started by this test still run:\n{lines}")


@pytest.fixture(autouse=True)
def _no_leaked_processes() -> Iterator[None]:
    before = child_processes()
    yield
    assert_no_new_processes(before)


def _start(**kwargs: object) -> dvml.LocalCluster:
    import dvml

    cluster = dvml.LocalCluster(set_as_default=False, **kwargs)  # type: ignore[arg-type]
    _SESSION_CLUSTERS.append(cluster)
    return cluster


@pytest.fixture(scope="session")
def cluster4() -> Iterator[dvml.LocalCluster]:
    """4 workers on 2 simulated hosts (host-0: worker-0/1, host-1: worker-2/3), GPUs [1,1,0,0]."""
    cluster = _start(n_workers=4, hosts=2, gpus=[1, 1, 0, 0], vineyard_memory="256MiB")
    yield cluster
    cluster.close()
    _SESSION_CLUSTERS.remove(cluster)


@pytest.fixture(scope="session")
def cluster2() -> Iterator[dvml.LocalCluster]:
    """2 workers, one simulated host each, no GPUs."""
    cluster = _start(n_workers=2, vineyard_memory="256MiB")
    yield cluster
    cluster.close()
    _SESSION_CLUSTERS.remove(cluster)


# -- worker-side vineyard probes (top-level, so they pickle by reference) --------------------
# They use a plain vineyard client and never close it: in vineyard 0.24.2 every client of a
# socket in one process shares one connection, and closing it would cut the worker's own
# (see dvml.store.local.local_client).


def vineyard_contents() -> dict[str, Any]:
    """On a worker: its instance id, memory in use, local tensors and staging names."""
    import vineyard

    from dvml.store.local import STAGING_PREFIX

    client = vineyard.connect()  # VINEYARD_IPC_SOCKET names this worker's own vineyardd
    iid = int(client.instance_id)
    metas = client.ipc_client.list_metadatas("vineyard::Tensor*", limit=1_000_000)
    staging = client.ipc_client.list_names(STAGING_PREFIX + "*", limit=1_000_000)
    return {
        "instance_id": iid,
        "memory_usage": int(client.status.memory_usage),
        "tensors": sorted(int(m.id) for m in metas if int(m.instance_id) == iid),
        "staging": sorted(str(n) for n in staging),
    }


def object_exists(ids: Sequence[int]) -> list[bool]:
    """On a worker: whether each object still exists in the vineyard cluster."""
    import vineyard

    client = vineyard.connect()
    return [bool(client.exists(vineyard.ObjectID(int(i)))) for i in ids]


def snapshot(cluster: dvml.LocalCluster) -> dict[int, dict[str, Any]]:
    """What every vineyardd holds, by instance id."""
    return {a["instance_id"]: a for a in cluster.client.run(vineyard_contents).values()}


def execute_notebook(path: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Run a notebook top to bottom in a fresh kernel; return every cell output.

    Asserts that the notebook is stored without outputs and that no cell raised. The kernel
    inherits this environment: a private registry and state directory, a non-GUI plot backend.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name} is stored with outputs; strip them before committing"
    )
    monkeypatch.setenv("DASK_DVML__CLUSTER__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DASK_DVML__REGISTRY__URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(
        notebook, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()  # fmt: skip
    outputs = [o for c in notebook.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs
