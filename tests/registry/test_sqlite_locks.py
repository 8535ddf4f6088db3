"""The registry and SQLite's locks, across real processes.

SQLite keeps a POSIX lock on the database file for every open connection; closing ANY
descriptor of the file drops all of a process's locks on it, and a process that then closes
its last connection believes it is the last user and deletes the live ``-wal`` and ``-shm``
files. Opening a registry must therefore never open a descriptor of the file, and must not
take the write lock when the schema exists (a read waits for no writer in WAL mode).
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
import stat
import subprocess
import sys
import textwrap

import pytest

from dvml.registry import Registry
from tests.registry.test_registry import sequential_json

REPO = pathlib.Path(__file__).resolve().parents[2]

_HOLDER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from dvml.registry import Registry

    url, model_json = sys.argv[1], sys.argv[2]
    reg = Registry(url)
    arch = reg.add_architecture(model_json, name="a")
    reg.list_models()            # the pool keeps this connection (and its lock) open
    Registry(url).list_models()  # a second registry in the same process, as fit opens one
    print("ready", flush=True)
    sys.stdin.readline()         # another process opens, reads and closes meanwhile
    reg.save_model("m", arch, [np.zeros(3)])
    assert Registry(url).list_models()["name"].tolist() == ["m"]
    assert reg.list_models()["name"].tolist() == ["m"]
    print("ok", flush=True)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_another_process_closing_keeps_the_wal_of_open_connections(tmp_path):
    db = tmp_path / "registry.db"
    url = f"sqlite:///{db}"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url, sequential_json()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        # Another process opens, reads and closes: it must not see itself as the last user.
        other = sqlite3.connect(db)
        assert other.execute("SELECT COUNT(*) FROM model_arch").fetchone() == (1,)
        other.close()
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"from dvml.registry import Registry; Registry({url!r}).list_models()",
            ],
            check=True,
            timeout=120,
            env=_env(),
        )
        assert (tmp_path / "registry.db-wal").exists(), "another process deleted the live -wal"
        assert (tmp_path / "registry.db-shm").exists(), "another process deleted the live -shm"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "ok"
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    check = sqlite3.connect(db)
    try:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert check.execute("SELECT name FROM models").fetchall() == [("m",)]
    finally:
        check.close()


_WRITER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DELETE FROM models")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("ROLLBACK")
    conn.close()
    """
)


def test_opening_a_registry_to_read_waits_for_no_writer(tmp_path):
    db = tmp_path / "registry.db"
    url = f"sqlite:///{db}"
    with Registry(url) as reg:
        reg.save_model("m", reg.add_architecture(sequential_json()), [])
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "locked"
        # The writer holds the write lock until told: a read in a fresh process (a new
        # Registry(), as `dvml models list` makes) answers while it does (the busy timeout
        # is 60 s; 30 s bounds a start of Python and pandas on a loaded machine).
        code = (
            f"from dvml.registry import Registry; "
            f"print(Registry({url!r}).list_models()['name'].tolist())"
        )
        reader = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=_env()
        )
        assert reader.returncode == 0, reader.stderr
        assert reader.stdout.strip() == "['m']"
        assert writer.poll() is None, "the writer let go of its lock before the read answered"
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=30)


@pytest.mark.parametrize("existing", [False, True])
def test_registry_file_is_owner_only_without_opening_it(tmp_path, existing):
    db = tmp_path / "registry.db"
    if existing:
        db.write_bytes(b"")
        db.chmod(0o644)
    with Registry(f"sqlite:///{db}") as reg:
        reg.list_models()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    for side in ("-wal", "-shm"):
        path = tmp_path / f"registry.db{side}"
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
