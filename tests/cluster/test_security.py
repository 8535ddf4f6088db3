"""Another user of the machine against a cluster (issue 16, items 1-3).

Every attack runs as uid 65534 ("nobody") in a real subprocess, against real processes: a Dask
client and raw TLS connections to the scheduler and the workers, etcd range requests on every
address the cluster's processes listen on, reads of the registry, checkpoint and scratch
files, and a look for vineyardd's glog files in /tmp. Each one succeeded before dvml served
Dask over TLS, ran etcd in a private network namespace and created its files owner-only.
Every probe is also run as the owner, where it must succeed: a probe that cannot succeed
would prove nothing.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.helpers import REPO, dvml_command

pytestmark = pytest.mark.cluster

NOBODY = 65534


@functools.cache
def _site_packages() -> str:
    import distributed

    return str(pathlib.Path(distributed.__file__).parents[1])


@functools.cache
def _nobody_python() -> str | None:
    """An interpreter of this Python version that uid 65534 may run (the venv's may sit under
    a private home); the venv's packages come through PYTHONPATH."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            out = _run_as(NOBODY, candidate, "import sys; print('%d.%d' % sys.version_info[:2])")
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == want:
            return candidate
    return None


def _run_as(
    uid: int | None, python: str, code: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {
        "PYTHONPATH": f"{REPO}{os.pathsep}{_site_packages()}",
        "HOME": "/tmp",
        "PATH": "/usr/bin:/bin",
    }
    ids: dict[str, Any] = {}
    if uid is not None:
        ids = {"user": uid, "group": uid, "extra_groups": []}
    return subprocess.run(
        [python, "-c", code, *args], env=env, cwd="/", capture_output=True, text=True,
        timeout=timeout, **ids,
    )  # fmt: skip


def as_nobody(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as uid 65534 with no supplementary groups (all capabilities dropped)."""
    if os.geteuid() != 0:
        pytest.skip("running code as uid 65534 needs root")
    python = _nobody_python()
    if python is None:
        pytest.skip(f"no Python {sys.version_info[:2]} that uid 65534 may run")
    return _run_as(NOBODY, python, code, *args, timeout=timeout)


def as_owner(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _run_as(None, sys.executable, code, *args, timeout=timeout)


# -- item 1: Dask ------------------------------------------------------------------------------

# argv: scheduler address, then worker addresses; optional env CERT/KEY: the certificate to
# present in the raw TLS probe (nobody makes one of their own with openssl). Prints ACCEPTED
# for every way in that worked; exits 0 if any did, 3 if all were refused.
DASK_PROBE = r"""
import os, socket, ssl, subprocess, sys, tempfile
from distributed import Client
scheduler, workers = sys.argv[1], sys.argv[2:]
accepted = []
plain = scheduler.replace("tls://", "tcp://")
for address in [] if os.environ.get("RAW_ONLY") else sorted({scheduler, plain}):
    try:
        client = Client(address, timeout=5)
    except Exception as exc:
        print("client refused", address, type(exc).__name__)
        continue
    accepted.append(f"Client({address}) ran a task as uid {client.run(os.getuid)}")
    client.close()
cert, key = os.environ.get("CERT"), os.environ.get("KEY")
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
if cert:
    context.load_cert_chain(cert, key)
else:  # a certificate of its own, in a directory that goes once the context has read it
    with tempfile.TemporaryDirectory() as own:
        cert, key = os.path.join(own, "cert.pem"), os.path.join(own, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=intruder",
            "-keyout", key, "-out", cert], check=True, capture_output=True)
        context.load_cert_chain(cert, key)
for address in [scheduler, *workers]:
    host, port = address.split("://")[1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            with context.wrap_socket(raw) as tls:
                data = tls.recv(64)  # Dask's handshake, sent by an accepting server
    except (OSError, ssl.SSLError) as exc:
        print("tls refused", address, type(exc).__name__, exc)
        continue
    if data:
        accepted.append(f"TLS to {address} with a certificate of our own")
for line in accepted:
    print("ACCEPTED", line)
sys.exit(0 if accepted else 3)
"""


def test_another_user_cannot_run_code_through_dask(local_cluster: Any) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    workers = [w.address for w in cluster.workers]
    attack = as_nobody(DASK_PROBE, cluster.scheduler_address, *workers)
    assert "ACCEPTED" not in attack.stdout, attack.stdout + attack.stderr
    assert attack.returncode == 3, attack.stdout + attack.stderr

    # The same raw probe with the cluster's certificate gets in: the probe can succeed.
    assert cluster.security is not None and cluster.tls_files is not None
    files = cluster.tls_files
    owner = subprocess.run(
        [sys.executable, "-c", DASK_PROBE, cluster.scheduler_address, *workers],
        env={**os.environ, "CERT": files["cert"], "KEY": files["key"], "RAW_ONLY": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert owner.stdout.count("ACCEPTED TLS") == 3, owner.stdout + owner.stderr
    # The owner's clients: the LocalCluster's own, and dvml.connect with cluster.security.
    import dvml

    assert cluster.client.run(os.getuid) == {w: os.getuid() for w in workers}
    attached = dvml.connect(cluster.scheduler_address, security=cluster.security)
    try:
        assert [w.name for w in attached.workers] == ["worker-0", "worker-1"]
    finally:
        attached.close()
    assert oct(os.stat(files["key"]).st_mode & 0o777) == oct(0o600)


# -- item 2: etcd ------------------------------------------------------------------------------

# argv: URLs to try (http://host:port or unix:PATH). Prints one JSON line: {url: [keys]}.
ETCD_PROBE = r"""
import base64, http.client, json, socket, sys
body = json.dumps({"key": base64.b64encode(b"\0").decode(),
                   "range_end": base64.b64encode(b"\0").decode(), "keys_only": True})
found = {}
for url in sys.argv[1:]:
    try:
        if url.startswith("unix:"):
            class Conn(http.client.HTTPConnection):
                def connect(self):
                    self.sock = socket.socket(socket.AF_UNIX)
                    self.sock.settimeout(3)
                    self.sock.connect(url[5:])
            conn = Conn("localhost", timeout=3)
        else:
            host, port = url.split("://")[1].rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=3)
        conn.request("POST", "/v3/kv/range", body=body)
        reply = json.loads(conn.getresponse().read())
        found[url] = [base64.b64decode(kv["key"]).decode() for kv in reply.get("kvs", [])]
    except Exception as exc:
        found[url] = f"refused: {type(exc).__name__}: {exc}"
print(json.dumps(found))
"""


def _listening_urls(cluster: Any) -> list[str]:
    """Every TCP address the cluster's processes listen on, as seen from this namespace."""
    import psutil

    urls = {cluster.etcd_endpoint}
    for pid in cluster.processes().values():
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN:
                host = "127.0.0.1" if conn.laddr.ip in ("0.0.0.0", "::") else conn.laddr.ip
                urls.add(f"http://{host}:{conn.laddr.port}")
    return sorted(urls)


def test_another_user_cannot_reach_etcd(local_cluster: Any) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    socket_path = getattr(cluster, "etcd_socket", None)
    owner_url = f"unix:{socket_path}" if socket_path else cluster.etcd_endpoint
    owner = as_owner(ETCD_PROBE, owner_url)
    ours = set(json.loads(owner.stdout)[owner_url])
    assert any("/instances/" in key for key in ours), owner.stdout  # vineyard's own keys

    urls = [*_listening_urls(cluster), *([f"unix:{socket_path}"] if socket_path else [])]
    attack = as_nobody(ETCD_PROBE, *urls)
    assert attack.returncode == 0, attack.stderr
    seen = json.loads(attack.stdout)
    leaked = {u: keys for u, keys in seen.items() if isinstance(keys, list) and ours & set(keys)}
    assert leaked == {}, f"uid 65534 read this cluster's etcd keys: {leaked}"


# -- item 3: files -----------------------------------------------------------------------------

# argv: paths. Prints one JSON line: the paths that could be read (files) or listed (dirs).
READ_PROBE = r"""
import json, os, sys
readable = []
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        readable.append(path)
    except OSError:
        pass
print(json.dumps(readable))
"""


def _write_scratch_file(dask_worker: Any) -> str:
    path = os.path.join(dask_worker.local_directory, "dvml-security-probe.bin")
    with open(path, "wb") as f:
        f.write(b"secret")
    return path


@pytest.fixture
def home() -> Iterator[pathlib.Path]:
    """A directory like a home directory: 0755, so that only the modes of what dvml creates
    inside decide what others read (pytest's tmp_path is 0700 and would hide everything)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dvml-security-home-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_registry_checkpoints_and_scratch_are_owner_only(
    local_cluster: Any, home: pathlib.Path
) -> None:
    from dvml.registry import Registry
    from dvml.registry.weights import weights_to_bytes
    from dvml.train.runtime.checkpoints import CheckpointStore

    state = home / ".dvml"
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    registry.register_custom_function("my_loss", "def my_loss(y_true, y_pred):\n    return 0\n")
    checkpoints = state / "checkpoints" / "digits-0123abcd"
    meta = {"job_key": "k", "iteration": 1, "history": [{"loss": 1.0}]}
    CheckpointStore(str(checkpoints)).save("worker-0", weights_to_bytes([np.arange(4.0)]), meta)
    cluster = local_cluster(n_workers=1, vineyard_memory="128MiB")
    scratch = next(iter(cluster.client.run(_write_scratch_file).values()))

    db = state / "registry.db"
    files = [db, db.with_name("registry.db-wal"), *sorted(checkpoints.iterdir())]
    paths = [str(p) for p in (*files, checkpoints, state / "checkpoints", scratch)]
    try:
        owner = as_owner(READ_PROBE, *paths)
        assert json.loads(owner.stdout) == paths  # every path exists and the probe reads it
        attack = as_nobody(READ_PROBE, *paths)
        assert attack.returncode == 0, attack.stderr
        assert json.loads(attack.stdout) == [], "uid 65534 could read these"
        for path in files:
            assert path.stat().st_mode & 0o077 == 0, f"{path} is {oct(path.stat().st_mode)}"
        for directory in (checkpoints, state / "checkpoints"):
            assert directory.stat().st_mode & 0o777 == 0o700, directory
        assert os.stat(cluster.directory).st_mode & 0o777 == 0o700
    finally:
        registry.close()


def _glog_files(pids: list[int]) -> list[str]:
    """vineyardd's glog files in /tmp (``vineyard.<host>.<user>.log.<LEVEL>.<time>.<pid>``)."""
    suffixes = tuple(f".{pid}" for pid in pids)
    return sorted(
        name
        for name in os.listdir(tempfile.gettempdir())
        if name.startswith("vineyard") and ".log." in name and name.endswith(suffixes)
    )


def test_vineyardd_logs_stay_in_the_cluster_directory(local_cluster: Any) -> None:
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    pids = [p.pid for p in cluster.vineyardds]
    logs = pathlib.Path(cluster.directory) / "logs"
    try:
        assert _glog_files(pids) == [], "vineyardd wrote its glog files into /tmp"
        kept = [p.name for p in logs.iterdir() if p.name.endswith(tuple(f".{p}" for p in pids))]
        assert len(kept) == 2, sorted(p.name for p in logs.iterdir())
        attack = as_nobody(READ_PROBE, str(logs), *(str(logs / n) for n in kept))
        assert json.loads(attack.stdout) == []
    finally:
        for name in _glog_files(pids):  # main's behaviour: do not leave them behind either
            os.unlink(os.path.join(tempfile.gettempdir(), name))
    cluster.close()
    assert not logs.exists()  # removed with the cluster


# -- `dvml cluster up` -------------------------------------------------------------------------

ATTACH = r"""
import dvml, sys
cluster = dvml.connect(sys.argv[1], timeout=20)
print("WORKERS", sorted(w.name for w in cluster.workers))
cluster.close()
"""


@pytest.fixture
def state_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    from dvml.cluster.state import recorded_processes, same_process

    path = tmp_path / "state"
    yield path
    if (path / "cluster.json").exists():
        state = json.loads((path / "cluster.json").read_text())
        dvml_command("cluster", "down", "--state-dir", str(path), "--timeout", "20")
        for _, (pid, t) in recorded_processes(state).items():
            if same_process(pid, t):
                os.kill(pid, signal.SIGKILL)


def test_cluster_up_serves_tls_and_its_clients_find_the_certificate(
    state_dir: pathlib.Path,
) -> None:
    up = dvml_command(
        "cluster", "up", "--state-dir", str(state_dir), "--n-workers", "1",
        "--vineyard-memory", "128MiB",
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    state = json.loads((state_dir / "cluster.json").read_text())
    address = state["scheduler_address"]
    assert address.startswith("tls://"), address
    assert pathlib.Path(state["tls"]["key"]).stat().st_mode & 0o777 == 0o600

    attack = as_nobody(DASK_PROBE, address, *(w["address"] for w in state["workers"]))
    assert "ACCEPTED" not in attack.stdout, attack.stdout + attack.stderr

    # A notebook of the owner: dvml.connect(address) finds the recorded certificate.
    env = {**os.environ, "DASK_DVML__CLUSTER__STATE_DIR": str(state_dir)}
    attached = subprocess.run(
        [sys.executable, "-c", ATTACH, address], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert "WORKERS ['worker-0']" in attached.stdout, attached.stderr
    status = dvml_command("cluster", "status", "--state-dir", str(state_dir))
    assert status.returncode == 0, status.stderr
    down = dvml_command("cluster", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr


def test_tls_and_private_etcd_can_be_turned_off(local_cluster: Any) -> None:
    import dask

    with dask.config.set({"dvml.cluster.tls": False, "dvml.cluster.private-etcd": False}):
        cluster = local_cluster(n_workers=1, vineyard_memory="64MiB")
    assert cluster.scheduler_address.startswith("tcp://")
    assert cluster.security is None and cluster.tls_files is None
    assert cluster.etcd_socket is None and cluster.etcd_endpoint != "http://127.0.0.1:2379"
    assert [w.vineyard_instance_id for w in cluster.workers] == [0]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tls": "yes"}, "ArgumentTypeError", "tls must be True or False"),
        ({"private_etcd": "always"}, "ArgumentError", "must be 'auto', true or false"),
    ],
)
def test_bad_security_settings_are_refused_before_anything_starts(
    kwargs: dict[str, Any], error: str, match: str
) -> None:
    import dvml
    from dvml import exceptions

    with pytest.raises(getattr(exceptions, error), match=match):
        dvml.LocalCluster(n_workers=1, vineyard_memory="64MiB", **kwargs)


def test_connect_to_a_tls_scheduler_without_a_certificate_says_what_to_pass() -> None:
    import dvml
    from dvml.exceptions import ClusterError

    with pytest.raises(ClusterError, match="serves TLS, and no certificate was given"):
        dvml.connect("tls://127.0.0.1:1", timeout=2)
