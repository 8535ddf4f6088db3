"""The namespace cluster of the multi-host tests: started, leak-checked, and driven by a client.

:func:`running_netns_cluster` brings a :class:`dvml.testing.netns.NetnsCluster` up and, after
the block, down, asserting that none of its namespaces, links, files or processes is left.
Without root it skips the test with the reason (and a warning, so that a skip is loud).
:func:`netns_client` runs ``tests/cluster/netns_client.py`` in the head namespace (or a host's)
and returns the JSON it printed; :class:`NetnsBackground` runs one in the background, its
output read line by line (to act on a host while a job runs).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.processes import pid_gone

__all__ = [
    "NETNS_CLIENT",
    "NetnsBackground",
    "host_pids",
    "netns_argv",
    "netns_client",
    "running_netns_cluster",
    "tensors_by_instance",
]

NETNS_CLIENT = pathlib.Path(__file__).parents[1] / "cluster" / "netns_client.py"


@contextlib.contextmanager
def running_netns_cluster(**kwargs: Any) -> Iterator[Any]:
    """A ``NetnsCluster(**kwargs)``, up for the block, then down with nothing left behind."""
    from dvml.testing import netns

    reason = netns.unavailable_reason()
    if reason:
        warnings.warn(f"multi-host namespace tests SKIPPED: {reason}", stacklevel=1)
        pytest.skip(f"network namespaces unavailable: {reason}")
    cluster = netns.NetnsCluster(**kwargs)
    try:
        cluster.up()
        yield cluster
    finally:
        seen = [p["pid"] for p in cluster.processes()]
        problems = cluster.down()
        assert problems == [], problems
        assert netns.leftovers(cluster.id, cluster.workdir) == []
        assert all(pid_gone(pid) for pid in seen), [p for p in seen if not pid_gone(p)]


def netns_argv(cluster: Any, command: str, namespace: str | None = None, **args: Any) -> list[str]:
    """The command line of one ``netns_client.py`` command, in ``namespace`` (default: the
    head namespace, where a notebook would run)."""
    argv = [sys.executable, str(NETNS_CLIENT), command, cluster.scheduler_address, json.dumps(args)]
    return list(cluster.exec_argv(namespace or cluster.head["namespace"], argv))


def netns_client(
    cluster: Any, command: str, timeout: float = 600, namespace: str | None = None, **args: Any
) -> Any:
    """Run one command of ``netns_client.py`` in ``namespace`` (default: the head namespace);
    its JSON result."""
    out = subprocess.run(
        netns_argv(cluster, command, namespace, **args), capture_output=True, text=True,
        timeout=timeout, env=cluster.env(), check=False,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("DVML-RESULT ")]
    assert out.returncode == 0 and lines, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[-1].removeprefix("DVML-RESULT "))


class NetnsBackground:
    """A client command running in the head namespace; its output collected line by line."""

    def __init__(self, cluster: Any, command: str, **args: Any) -> None:
        argv = [
            sys.executable,
            str(NETNS_CLIENT),
            command,
            cluster.scheduler_address,
            json.dumps(args),
        ]
        self.proc = subprocess.Popen(
            cluster.exec_argv(cluster.head["namespace"], argv), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=cluster.env(),
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            self.lines.append(line.rstrip())

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.reader.join(10)
        found = [x for x in self.lines if x.startswith("DVML-RESULT ")]
        assert found, "\n".join(self.lines[-40:])
        return dict(json.loads(found[-1].removeprefix("DVML-RESULT ")))


def host_pids(namespace: str) -> list[int]:
    """Pids of every process of a host (its network namespace)."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def tensors_by_instance(probe: dict[str, Any]) -> dict[int, set[int]]:
    """A placement probe's tensor ids, by vineyard instance."""
    return {v["instance_id"]: set(v["tensors"]) for v in probe.values()}
