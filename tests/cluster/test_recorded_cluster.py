"""A cluster started by ``dvml cluster up``, used from Python: found through its state file.

``dvml.connect()`` with no address and every API call that needs a cluster attach to the
recorded scheduler with its TLS certificate, as the ``dvml`` commands do. The state directory
and what ``up`` writes there are owner-only.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

import pytest

from tests.helpers import dvml_command

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def private_tmp() -> Iterator[pathlib.Path]:
    """A private TMPDIR for the processes a test starts (their clusters' directories)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dvr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def up_cluster(private_tmp: pathlib.Path) -> Iterator[tuple[pathlib.Path, dict[str, str]]]:
    """A one-worker `dvml cluster up` cluster (TLS and the private etcd: the defaults); its
    state directory and the environment that makes it dvml's default."""
    state_dir = private_tmp / "state"
    env = {
        **os.environ,
        "TMPDIR": str(private_tmp),
        "PYTHONPATH": str(REPO),
        "DASK_DVML__CLUSTER__STATE_DIR": str(state_dir),
    }
    up = dvml_command("cluster", "up", "--n-workers", "1", env=env)
    assert up.returncode == 0, up.stderr
    try:
        yield state_dir, env
    finally:
        down = dvml_command("cluster", "down", "--timeout", "20", env=env, timeout=120)
        assert down.returncode == 0, down.stderr


_API = textwrap.dedent(
    """
    import json
    import dvml
    listed = dvml.datasets.list()          # no client given, none opened: the recorded one
    cluster = dvml.connect()               # no address: the recorded one, with its TLS
    print(json.dumps({
        "listed": list(listed.columns),
        "address": cluster.client.scheduler.address,
        "workers": [w.name for w in cluster.workers],
    }))
    cluster.close()
    """
)


def test_api_finds_the_cluster_of_dvml_cluster_up(up_cluster) -> None:
    state_dir, env = up_cluster
    with open(state_dir / "cluster.json") as f:
        recorded = json.load(f)
    assert recorded["scheduler_address"].startswith("tls://")
    result = subprocess.run(
        [sys.executable, "-c", _API], capture_output=True, text=True, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["address"] == recorded["scheduler_address"]
    assert found["workers"] == ["worker-0"]
    assert "name" in found["listed"]


def test_state_directory_and_its_files_are_owner_only(up_cluster) -> None:
    state_dir, _ = up_cluster
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    for name in ("cluster.json", "cluster.log"):
        assert stat.S_IMODE((state_dir / name).stat().st_mode) & 0o077 == 0, name


def test_api_without_a_recorded_cluster_says_what_to_do(tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DASK_DVML__CLUSTER__STATE_DIR": str(tmp_path / "state"),
    }
    code = (
        "import dvml\n"
        "from dvml.exceptions import NoClusterError\n"
        "for call in (dvml.datasets.list, dvml.connect):\n"
        "    try:\n"
        "        call()\n"
        "    except NoClusterError as exc:\n"
        "        print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert str(tmp_path / "state" / "cluster.json") in line
        assert "dvml cluster up" in line and "dvml.connect(" in line


def test_private_dir_makes_every_missing_parent_0700_and_tightens_the_state_dir(
    tmp_path: pathlib.Path,
) -> None:
    from dvml.cluster.state import private_dir

    state = tmp_path / "state"
    target = private_dir(state / "checkpoints" / "m-key")
    for path in (state, state / "checkpoints", target):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    # A state directory an older dvml made 0755: tightened down from the root given.
    older = tmp_path / "older"
    (older / "locks").mkdir(parents=True)
    older.chmod(0o755)
    (older / "locks").chmod(0o755)
    private_dir(older / "locks", root=older)
    assert stat.S_IMODE(older.stat().st_mode) == 0o700
    assert stat.S_IMODE((older / "locks").stat().st_mode) == 0o700


def test_cluster_up_tightens_a_state_dir_made_0755_by_an_older_dvml(
    private_tmp: pathlib.Path,
) -> None:
    state_dir = private_tmp / "old-state"
    (state_dir / "locks").mkdir(parents=True)
    state_dir.chmod(0o755)
    env = {
        **os.environ,
        "TMPDIR": str(private_tmp),
        "DASK_DVML__CLUSTER__STATE_DIR": str(state_dir),
    }
    up = dvml_command("cluster", "up", "--n-workers", "1", "--vineyard-memory", "64MiB", env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        for name in ("cluster.json", "cluster.log"):
            assert stat.S_IMODE((state_dir / name).stat().st_mode) == 0o600, name
    finally:
        down = dvml_command("cluster", "down", "--timeout", "20", env=env, timeout=120)
        assert down.returncode == 0, down.stderr
