"""Fixtures shared by the whole suite: real clusters, a clean-vineyard check and a leak check.

``cluster4`` (4 workers on 2 simulated hosts, GPUs declared on the first two) and ``cluster2``
(2 workers) start once per session with ``set_as_default=False``: pass
``client=cluster.client`` explicitly. A test that needs to break or stop a cluster starts its
own with the ``local_cluster`` factory instead.

Every test is checked for leaked child processes: a child of the test process that appears
during the test and still runs after it (a few seconds of grace) fails the test. The session
clusters' processes and multiprocessing's resource tracker are not counted.

``./scripts/check`` runs the suite in one process (two xdist processes took as long on 2 cores,
and timing-bound tests failed under the load). A run with pytest-xdist (``-n 2``) still works:
each worker process gets its own dvml state directory (cluster state file, default registry)
and trainer-zygote directory, so the two never share a registry or a zygote.

Helpers (polling, probes, builders) live in the importable package ``tests.helpers``; this
file holds fixtures and that per-worker set-up only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.clusters import running_cluster
from tests.helpers.processes import (
    SESSION_CLUSTERS,
    SESSION_PIDS,
    assert_no_new_processes,
    child_processes,
)
from tests.helpers.s3 import S3Server, running_s3_server
from tests.helpers.vineyard_probes import snapshot

if TYPE_CHECKING:
    import dvml


_WORKER_ROOT = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Give an xdist worker process its own state and zygote directories (see above)."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:  # the controller, or a run without -n
        return
    import dask

    root = tempfile.mkdtemp(prefix=f"dvml-{worker}-")  # owner-only, as the zygote requires
    config.stash[_WORKER_ROOT] = root
    state, zygotes = os.path.join(root, "state"), os.path.join(root, "z")
    os.mkdir(state, 0o700)
    os.mkdir(zygotes, 0o700)
    # The environment reaches every process a test starts; dask.config this process's reads.
    os.environ["DASK_DVML__CLUSTER__STATE_DIR"] = state
    os.environ["DVML_ZYGOTE_DIR"] = zygotes
    dask.config.set({"dvml.cluster.state-dir": state})


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_WORKER_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_leaked_processes() -> Iterator[None]:
    before = child_processes()
    yield
    assert_no_new_processes(before)


def _start(**kwargs: object) -> dvml.LocalCluster:
    import dvml

    cluster = dvml.LocalCluster(set_as_default=False, **kwargs)  # type: ignore[arg-type]
    SESSION_CLUSTERS.append(cluster)
    return cluster


@pytest.fixture(scope="session")
def cluster4() -> Iterator[dvml.LocalCluster]:
    """4 workers on 2 simulated hosts (host-0: worker-0/1, host-1: worker-2/3), GPUs [1,1,0,0]."""
    cluster = _start(n_workers=4, hosts=2, gpus=[1, 1, 0, 0], vineyard_memory="256MiB")
    yield cluster
    cluster.close()
    SESSION_CLUSTERS.remove(cluster)


@pytest.fixture(scope="session")
def cluster2() -> Iterator[dvml.LocalCluster]:
    """2 workers, one simulated host each, no GPUs."""
    cluster = _start(n_workers=2, vineyard_memory="256MiB")
    yield cluster
    cluster.close()
    SESSION_CLUSTERS.remove(cluster)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3-compatible server on 127.0.0.1 (a free port), authentication enforced:
    ``s3_server.storage_options`` hold a valid key. Stopped by its pid when the session ends."""
    with running_s3_server() as server:
        SESSION_PIDS.add(server.pid)
        yield server
        SESSION_PIDS.discard(server.pid)


@pytest.fixture
def clean_vineyard4(cluster4: dvml.LocalCluster) -> Iterator[list[str]]:
    """Names of datasets a test creates on ``cluster4``: dropped afterwards, and every
    vineyardd checked to hold exactly what it held before the test (tensors, staging names,
    bytes)."""
    import dvml

    before = snapshot(cluster4)
    names: list[str] = []
    yield names
    for name in names:
        if dvml.datasets.exists(name, client=cluster4.client):
            dvml.datasets.drop(name, client=cluster4.client)
    assert snapshot(cluster4) == before, "the vineyardds do not hold what they held before"


@pytest.fixture
def local_cluster() -> Iterator[Callable[..., dvml.LocalCluster]]:
    """A factory: ``local_cluster(n_workers=2, vineyard_memory="128MiB")`` starts a
    ``dvml.LocalCluster`` of the test's own (``set_as_default=False`` unless given).

    Every cluster it started is closed when the test ends, newest first, and then checked to
    have left no process behind (:func:`tests.helpers.running_cluster`). Closing one earlier in
    the test is allowed (a second ``close()`` does nothing).
    """
    with ExitStack() as stack:

        def start(**kwargs: Any) -> dvml.LocalCluster:
            return stack.enter_context(running_cluster(**kwargs))

        yield start
