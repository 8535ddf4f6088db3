"""The namespace cluster of the multi-host tests: started, leak-checked, and driven by a client.

:func:`running_netns_cluster` brings a :class:`dvml.testing.netns.NetnsCluster` up and, after
the block, down, asserting that none of its namespaces, links, files or processes is left.
Without root it skips the test with the reason (and a warning, so that a skip is loud).
:func:`netns_client` runs ``tests/cluster/netns_client.py`` in the head namespace and returns
the JSON it printed.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.processes import pid_gone

__all__ = ["NETNS_CLIENT", "netns_client", "running_netns_cluster", "tensors_by_instance"]

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


def netns_client(cluster: Any, command: str, timeout: float = 600, **args: Any) -> Any:
    """Run one command of ``netns_client.py`` in the head namespace; its JSON result."""
    out = cluster.run_client(
        [sys.executable, str(NETNS_CLIENT), command, cluster.scheduler_address, json.dumps(args)],
        timeout=timeout,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("DVML-RESULT ")]
    assert out.returncode == 0 and lines, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[-1].removeprefix("DVML-RESULT "))


def tensors_by_instance(probe: dict[str, Any]) -> dict[int, set[int]]:
    """A placement probe's tensor ids, by vineyard instance."""
    return {v["instance_id"]: set(v["tensors"]) for v in probe.values()}
