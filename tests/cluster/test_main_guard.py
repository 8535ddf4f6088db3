"""A script that starts a LocalCluster without the ``if __name__ == "__main__":`` guard is told
so, instead of "Nanny failed to start ... check that the scheduler_port is free" (#16 item 15).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.cluster]

SCRIPT = """import dvml

cluster = dvml.LocalCluster(n_workers=1, vineyard_memory="64MiB", set_as_default=False)
print("STARTED", flush=True)
cluster.close()
"""


def run_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "user_script.py"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=240, cwd=REPO
    )


def test_an_unguarded_script_is_told_about_the_guard(tmp_path: Path) -> None:
    out = run_script(tmp_path, SCRIPT)
    assert out.returncode != 0 and "STARTED" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("dvml.exceptions.ClusterStartError"), out.stderr[-3000:]
    assert 'if __name__ == "__main__":' in last and "user_script.py" in last, last
    assert "scheduler_port" not in last
    # the worker process that re-ran the script refused before starting any daemon of its own
    assert "while a Dask worker process was re-running your script" in out.stderr


def test_a_guarded_script_starts(tmp_path: Path) -> None:
    guarded = "def main():\n" + "".join(f"    {line}\n" for line in SCRIPT.splitlines())
    out = run_script(tmp_path, guarded + '\n\nif __name__ == "__main__":\n    main()\n')
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STARTED" in out.stdout


def test_the_hint_needs_a_script_without_the_guard(tmp_path: Path) -> None:
    from dvml.cluster import main_guard

    # pytest's own main module has the guard (or is not a .py file): no hint
    assert main_guard.unguarded_main_hint() == ""
    main_guard.refuse_in_spawned_import()  # the test process is no spawned import: no error
