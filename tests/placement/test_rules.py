"""Distribution rules: parsing and resolution against a hand-built 4-worker, 2-host cluster."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import PlacementError
from dvml.placement.rules import DistributionRules, describe_resolution, resolve_rules


def _worker(i: int, host: str, gpus: tuple[str, ...] = ()) -> WorkerInfo:
    return WorkerInfo(
        address=f"tcp://127.0.0.1:{4000 + i}",
        name=f"worker-{i}",
        host=host,
        vineyard_socket=f"/tmp/v{i}.sock",
        vineyard_instance_id=100 + i,
        gpus=gpus,
        pid=1000 + i,
    )


W0 = _worker(0, "host-a", ("GPU 0: NVIDIA H100",))
W1 = _worker(1, "host-a")
W2 = _worker(2, "host-b", ("GPU 0: NVIDIA H100",))
W3 = _worker(3, "host-b")
WORKERS = [W0, W1, W2, W3]
W3_NO_VINEYARD = dataclasses.replace(W3, vineyard_socket=None, vineyard_instance_id=None)
# Started with a socket whose daemon does not answer: it died (issue 28: not "set the socket").
W3_DEAD_VINEYARD = dataclasses.replace(W3, vineyard_instance_id=None)


def _names(targets: list[WorkerInfo]) -> list[str]:
    return [w.name for w in targets]


GPU_TABLE = pd.DataFrame(
    {
        "hostname": ["host-a", "host-b", "host-b"],
        "worker": [W0.address, W2.address, W2.address],
        "worker_name": ["worker-0", "worker-2", "worker-2"],
        "gpu_index": np.array([0, 0, 1], dtype=np.int64),
        "gpu_descr": ["GPU 0: NVIDIA H100", "GPU 0: NVIDIA H100", "GPU 1: NVIDIA H100"],
    }
)


@pytest.mark.parametrize(
    ("value", "kind", "items"),
    [
        ("all_workers", "all_workers", ()),
        ("all_segments", "all_workers", ()),
        ("ALL_Segments", "all_workers", ()),
        ("gpu_workers", "gpu_workers", ()),
        ("GPU_SEGMENTS", "gpu_workers", ()),
        ("tcp://127.0.0.1:4001", "workers", ("tcp://127.0.0.1:4001",)),
        ("worker-3", "workers", ("worker-3",)),
        (" host-a ", "workers", ("host-a",)),
        (["worker-1", "worker-0"], "workers", ("worker-1", "worker-0")),
        (("host-b",), "workers", ("host-b",)),
        ([0, np.int64(2)], "workers", ("0", "2")),
        ([], "workers", ()),
        (GPU_TABLE, "table", (W0.address, W2.address)),
        (pd.DataFrame({"hostname": ["host-b", "host-b"]}), "hosts", ("host-b",)),
        (pd.DataFrame({"host": ["host-a"], "n": [1]}), "hosts", ("host-a",)),
    ],
)
def test_parse(value: object, kind: str, items: tuple[str, ...]) -> None:
    rules = DistributionRules.parse(value)
    assert (rules.kind, rules.items) == (kind, items)
    assert DistributionRules.parse(rules) is rules
    json.dumps(rules.given)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (3, TypeError, "int"),
        (None, TypeError, "NoneType"),
        ({"worker-0"}, TypeError, "set"),
        ({"worker": "worker-0"}, TypeError, "dict"),
        ([True], TypeError, "bool"),
        (["worker-0", None], TypeError, "item 1"),
        (["worker-0", ""], TypeError, "item 1"),
        ("  ", PlacementError, "blank"),
        (pd.DataFrame({"segment": [1]}), PlacementError, "columns=\\['segment'\\]"),
        (pd.DataFrame({"worker": ["worker-0", None]}), PlacementError, "empty cell"),
    ],
)
def test_parse_refuses(value: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DistributionRules.parse(value)


def test_type_error_lists_accepted_forms() -> None:
    with pytest.raises(TypeError, match=r"all_segments.*gpu_configuration"):
        DistributionRules.parse(1.5)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("all_workers", ["worker-0", "worker-1", "worker-2", "worker-3"]),
        ("all_segments", ["worker-0", "worker-1", "worker-2", "worker-3"]),
        ("gpu_workers", ["worker-0", "worker-2"]),
        ("gpu_segments", ["worker-0", "worker-2"]),
        ("worker-3", ["worker-3"]),
        ("tcp://127.0.0.1:4001", ["worker-1"]),
        ("127.0.0.1:4001", ["worker-1"]),
        ("host-b", ["worker-2", "worker-3"]),
        # explicit worker lists keep the user's order
        (["worker-3", "worker-0"], ["worker-3", "worker-0"]),
        (["tcp://127.0.0.1:4002", "worker-1"], ["worker-2", "worker-1"]),
        # host lists keep the cluster's order
        (["host-b", "host-a"], ["worker-0", "worker-1", "worker-2", "worker-3"]),
        (("host-b",), ["worker-2", "worker-3"]),
        # the output of gpu_configuration(): several GPU rows of one worker mean it once
        (GPU_TABLE, ["worker-0", "worker-2"]),
        (pd.DataFrame({"worker": ["worker-1", W1.address, "worker-0"]}), ["worker-1", "worker-0"]),
        (pd.DataFrame({"hostname": ["host-a", "host-a"]}), ["worker-0", "worker-1"]),
        (DistributionRules("hosts", ("host-b",)), ["worker-2", "worker-3"]),
    ],
)
def test_resolve(value: object, expected: list[str]) -> None:
    assert _names(resolve_rules(value, WORKERS)) == expected


def test_worker_name_wins_over_host_name() -> None:
    odd = [_worker(0, "alpha"), dataclasses.replace(_worker(1, "beta"), name="alpha")]
    assert [w.address for w in resolve_rules("alpha", odd)] == [odd[1].address]


@pytest.mark.parametrize(
    ("value", "workers", "match"),
    [
        ("worker-9", WORKERS, r"unknown worker\(s\) or host\(s\).*'worker-9'"),
        (["worker-0", "nowhere"], WORKERS, r"unknown.*'nowhere'.*Known workers: worker-0"),
        (["worker-0", "host-b"], WORKERS, r"mixes workers and hosts.*\['worker-0'\].*\['host-b'\]"),
        (["worker-1", "worker-1"], WORKERS, r"more than once.*\['worker-1'\]"),
        (["host-a", "host-a"], WORKERS, r"more than once.*\['host-a'\]"),
        (["worker-1", W1.address], WORKERS, r"same worker twice.*worker-1"),
        ([], WORKERS, r"empty list.*Known workers"),
        (pd.DataFrame({"worker": pd.Series([], dtype=object)}), WORKERS, r"empty table"),
        (pd.DataFrame({"worker": ["worker-7"]}), WORKERS, r"unknown workers.*'worker-7'"),
        (pd.DataFrame({"hostname": ["host-z"]}), WORKERS, r"unknown hosts.*'host-z'.*host-a"),
        ("gpu_workers", [W1, W3], r"no worker reports a GPU.*Declare GPUs.*all_workers"),
        ("all_workers", [], r"no workers"),
        ("all_workers", [W0, W3_NO_VINEYARD], r"no vineyardd.*worker-3 \(tcp://127.0.0.1:4003"),
        (
            "all_workers",
            [W0, W3_DEAD_VINEYARD],
            r"vineyardd of selected workers is not running"
            r".*worker-3 .*socket /tmp/v3.sock",
        ),
    ],
)
def test_resolve_refuses(value: object, workers: list[WorkerInfo], match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        resolve_rules(value, workers)


def test_unselected_worker_without_vineyard_is_fine() -> None:
    assert _names(resolve_rules(["worker-0"], [W0, W1, W2, W3_NO_VINEYARD])) == ["worker-0"]


def test_known_workers_list_is_bounded() -> None:
    many = [_worker(i, f"host-{i % 3}") for i in range(50)]
    with pytest.raises(PlacementError, match=r"and 30 more") as info:
        resolve_rules("worker-99", many)
    assert "host-0" in str(info.value)


@pytest.mark.parametrize(
    ("value", "given"),
    [
        ("all_segments", "all_segments"),
        ("worker-2", "worker-2"),
        (("host-b",), ["host-b"]),
        (
            GPU_TABLE.head(1),
            {
                "table": [
                    {
                        "hostname": "host-a",
                        "worker": W0.address,
                        "worker_name": "worker-0",
                        "gpu_index": 0,
                        "gpu_descr": "GPU 0: NVIDIA H100",
                    }
                ]
            },
        ),
    ],
)
def test_describe_resolution(value: object, given: object) -> None:
    rules = DistributionRules.parse(value)
    targets = resolve_rules(rules, WORKERS)
    record = describe_resolution(rules, targets)
    assert record["given"] == given
    assert record["kind"] == rules.kind
    assert [r["name"] for r in record["resolved"]] == _names(targets)
    first = record["resolved"][0]
    assert set(first) == {"worker", "name", "host", "vineyard_instance_id"}
    assert first["vineyard_instance_id"] == targets[0].vineyard_instance_id
    assert json.loads(json.dumps(record)) == record


@pytest.mark.parametrize(
    ("rules", "given"),
    [
        (DistributionRules("all_workers"), "all_workers"),
        (DistributionRules("hosts", ("host-a",)), ["host-a"]),
    ],
)
def test_describe_rules_built_directly(rules: DistributionRules, given: object) -> None:
    assert describe_resolution(rules, resolve_rules(rules, WORKERS))["given"] == given


def test_describe_table_with_nan_is_json() -> None:
    frame = pd.DataFrame({"worker": ["worker-0"], "score": [float("nan")]})
    record = describe_resolution(frame, resolve_rules(frame, WORKERS))
    assert record["given"] == {"table": [{"worker": "worker-0", "score": None}]}
    json.dumps(record, allow_nan=False)


@pytest.mark.parametrize(
    ("kind", "items", "error"),
    [
        ("segments", (), ValueError),
        ("all_workers", ("worker-0",), ValueError),
        ("workers", ["worker-0"], TypeError),
        ("workers", (1,), TypeError),
    ],
)
def test_constructor_validates(kind: str, items: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        DistributionRules(kind, items)  # type: ignore[arg-type]


def test_rules_are_hashable_and_compare_without_given() -> None:
    a = DistributionRules.parse(["worker-0"])
    b = DistributionRules("workers", ("worker-0",), given="something else")
    assert a == b
    assert hash(a) == hash(b)
