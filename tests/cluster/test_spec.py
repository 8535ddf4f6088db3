"""Pure planning of a LocalCluster: no process starts here."""

from __future__ import annotations

import shutil

import pytest

from dvml.cluster.spec import check_shared_memory, parse_memory, plan_workers


def test_plan_default_one_host_per_worker() -> None:
    specs = plan_workers(3)
    assert [s.name for s in specs] == ["worker-0", "worker-1", "worker-2"]
    assert [s.host for s in specs] == ["host-0", "host-1", "host-2"]
    assert [s.gpus for s in specs] == [(), (), ()]
    assert len({s.socket_name for s in specs}) == 3


@pytest.mark.parametrize(
    ("n_workers", "hosts", "expected"),
    [
        (4, 2, ["host-0", "host-0", "host-1", "host-1"]),
        (5, 2, ["host-0", "host-0", "host-0", "host-1", "host-1"]),
        (3, 1, ["host-0"] * 3),
        (2, ["a", "b"], ["a", "b"]),
    ],
)
def test_plan_hosts(n_workers: int, hosts: int | list[str], expected: list[str]) -> None:
    assert [s.host for s in plan_workers(n_workers, hosts=hosts)] == expected


def test_plan_gpus_numbered_per_host() -> None:
    specs = plan_workers(4, gpus=[1, 1, 0, 2], hosts=2)
    assert [len(s.gpus) for s in specs] == [1, 1, 0, 2]
    assert specs[0].gpus[0].startswith("GPU 0:") and "host-0" in specs[0].gpus[0]
    assert specs[1].gpus[0].startswith("GPU 1:")  # the second GPU of host-0
    assert [g.split(":")[0] for g in specs[3].gpus] == ["GPU 0", "GPU 1"]
    assert all(len(s.gpus) == 2 for s in plan_workers(2, gpus=2))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_workers": 0}, ValueError, "n_workers must be at least 1"),
        ({"n_workers": 2.0}, TypeError, "n_workers must be an int"),
        ({"n_workers": True}, TypeError, "n_workers must be an int"),
        ({"n_workers": 2, "gpus": -1}, ValueError, "cannot be negative"),
        ({"n_workers": 3, "gpus": [1, 0]}, ValueError, "one count per worker"),
        ({"n_workers": 2, "gpus": [1, "1"]}, TypeError, "must be ints"),
        ({"n_workers": 2, "hosts": 3}, ValueError, "between 1 and n_workers=2"),
        ({"n_workers": 2, "hosts": 0}, ValueError, "between 1 and n_workers=2"),
        ({"n_workers": 2, "hosts": ["a"]}, ValueError, "one host per worker"),
        ({"n_workers": 2, "hosts": ["a", ""]}, ValueError, "cannot be empty"),
    ],
)
def test_plan_rejects(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        plan_workers(**kwargs)
    assert "Received" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1024, 1024), ("512MiB", 512 * 2**20), ("2 GB", 2 * 10**9), ("1kiB", 1024)],
)
def test_parse_memory(value: int | str, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["lots", "", "-5MiB", 0, -1])
def test_parse_memory_rejects(value: int | str) -> None:
    with pytest.raises(ValueError, match="vineyard_memory") as info:
        parse_memory(value)
    assert repr(value) in str(info.value)


def test_parse_memory_rejects_bool() -> None:
    with pytest.raises(TypeError, match="Received: True"):
        parse_memory(True)


def test_check_shared_memory_fits(tmp_path) -> None:
    check_shared_memory(1024, 2, shm_path=str(tmp_path))


def test_check_shared_memory_too_big(tmp_path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(ValueError, match="enlarge /dev/shm") as info:
        check_shared_memory(free // 2 + 1, 2, shm_path=str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_check_shared_memory_missing_path(tmp_path) -> None:
    with pytest.raises(ValueError, match="Cannot read free shared memory"):
        check_shared_memory(1024, 1, shm_path=str(tmp_path / "missing"))
