"""``dvml.vineyard_runtime.import_vineyard``: vineyard without its import-time subprocess, and
its ``vineyardctl`` wrapper still there for who uses it. Each check runs in a fresh
interpreter (what is imported, and which child processes ran, is per process)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, resource, sys
from dvml.vineyard_runtime import import_vineyard

def children_cpu():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime

vineyard = import_vineyard()
ctl = sys.modules["vineyard.deploy.ctl"]
out = {"children_cpu": children_cpu(), "placeholder": type(ctl).__name__,
       "same": import_vineyard() is vineyard, "client": hasattr(vineyard, "connect")}
import inspect
inspect.getmodule(children_cpu)  # reads every module's __file__: must not build the wrapper
out["after_probe"] = type(sys.modules["vineyard.deploy.ctl"]).__name__
deploy_subcommand = vineyard.deploy.vineyardctl.deploy  # first use: the real wrapper is built
out.update(after_cpu=children_cpu(), after=type(sys.modules["vineyard.deploy.ctl"]).__name__,
           subcommand=callable(deploy_subcommand),
           real=vineyard.deploy.vineyardctl is sys.modules["vineyard.deploy.ctl"].vineyardctl)
print(json.dumps(out))
"""


def _probe(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_import_runs_no_subprocess_and_the_wrapper_is_built_on_first_use() -> None:
    found = _probe(PROBE)
    assert found["children_cpu"] == 0.0, found  # no vineyardctl ran
    assert found["placeholder"] == "_LazyCtl" and found["same"] and found["client"], found
    assert found["after_probe"] == "_LazyCtl", found
    # vineyardctl's wrapper: built (the binary ran) when a subcommand is first read
    assert found["after_cpu"] > 0.0 and found["after"] == "module", found
    assert found["subcommand"] and found["real"], found


def test_vineyard_imported_before_is_returned_as_it_is() -> None:
    found = _probe(
        "import json, sys, vineyard\n"
        "from dvml.vineyard_runtime import import_vineyard\n"
        "print(json.dumps({'same': import_vineyard() is vineyard,"
        " 'ctl': type(sys.modules['vineyard.deploy.ctl']).__name__}))"
    )
    assert found == {"same": True, "ctl": "module"}
