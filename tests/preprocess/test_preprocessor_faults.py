"""Every way the preprocessors can fail, on real clusters: a clear error and nothing lost.

"Nothing lost" is checked on every vineyardd with a plain vineyard client: no dataset is
published, and each instance holds the same tensors, staging names and bytes as before.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import (
    ClusterError,
    DataError,
    MemoryPlanError,
    PlacementError,
    VineyardMemoryError,
)
from tests.helpers import poll_for, running_cluster, snapshot

pytestmark = pytest.mark.cluster


# -- worker-side probes (top-level, so they pickle by reference) ---------------------------


def read_local(ids: Sequence[int]) -> list[np.ndarray]:
    """On a worker: copies of local tensors, checked to live on this worker's instance."""
    import vineyard

    client = vineyard.connect()  # shared connection: never closed (see tests.helpers)
    out = []
    for raw in ids:
        oid = vineyard.ObjectID(int(raw))
        if int(client.get_meta(oid).instance_id) != int(client.instance_id):
            raise AssertionError(f"object {raw} is not local to {client.instance_id}")
        out.append(np.array(client.get(oid)))
    return out


# -- helpers ------------------------------------------------------------------------------------


def find_error(exc: BaseException, cls: type[BaseException]) -> BaseException | None:
    """``exc`` or the first exception of type ``cls`` it was raised from (Dask may wrap)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, cls):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def assert_nothing_left(cluster: dvml.LocalCluster, name: str, before: dict[int, Any]) -> None:
    assert not dvml.datasets.exists(name, client=cluster.client)
    assert name not in set(dvml.datasets.list(client=cluster.client)["name"])
    assert snapshot(cluster) == before


def content(cluster: dvml.LocalCluster, ds: dvml.Dataset) -> dict[str, Any]:
    """Rows per worker, class values and the sorted rows of a dataset (read on its owners), in
    the model's terms whatever the layout: x float32 and normalized, y one-hot."""
    workers = {w.vineyard_instance_id: w for w in cluster.refresh()}
    rows: dict[str, int] = {}
    blocks = []
    for b in ds.layout["buffers"]:
        owner = workers[b["instance_id"]]
        ids = [b["fields"][f]["id"] for f in ("x_0", "y")]
        x, y = cluster.client.submit(
            read_local, ids, workers=[owner.address], allow_other_workers=False, pure=False
        ).result(timeout=120)
        if x.dtype == np.uint8:  # the compact layout keeps uint8 x raw: normalize it here
            x = x.astype(np.float32) / np.float32(ds.summary["normalizing_const"])
        if y.ndim == 1:  # the compact layout's class indices: one-hot, as the trainers read y
            y = np.eye(ds.summary["y_shape"][0], dtype=np.float32)[y.astype(np.int64)]
        blocks.append(np.hstack([x.reshape(len(y), -1), y]))
        rows[owner.name] = rows.get(owner.name, 0) + b["rows"]
    matrix = np.concatenate(blocks)
    return {
        "rows": rows,
        "class_values": ds.summary["class_values"],
        "sorted_rows": matrix[np.lexsort(matrix.T[::-1])],
    }


# -- distribution rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "match"),
    [
        ("worker-9", r"unknown worker\(s\) or host\(s\)\. Received: \['worker-9'\]"),
        (["worker-0", "worker-9"], r"Received: \['worker-9'\]"),
        (["host-7"], r"Received: \['host-7'\]"),
        (pd.DataFrame({"host": ["host-0", "host-7"]}), r"unknown hosts\. Received: \['host-7'\]"),
        (pd.DataFrame({"worker": ["worker-5"]}), r"unknown workers\. Received: \['worker-5'\]"),
        (["worker-0", "worker-0"], r"more than once\. Received: duplicates \['worker-0'\]"),
        (["host-1", "host-1"], r"duplicates \['host-1'\]"),
        ([], r"empty list\. Received: distribution_rules=\[\]"),
        ("gpu_empty", r"empty table"),
        (["worker-0", "host-1"], r"mixes workers and hosts.*\['worker-0'\].*\['host-1'\]"),
    ],
    ids=[
        "unknown-worker", "unknown-in-list", "unknown-host", "unknown-host-table",
        "unknown-worker-table", "duplicate-worker", "duplicate-host", "empty-list",
        "empty-gpu-selection", "mixed",
    ],
)  # fmt: skip
def test_bad_rules(cluster4: dvml.LocalCluster, rules: Any, match: str) -> None:
    if isinstance(rules, str) and rules == "gpu_empty":
        gpus = dvml.gpu_configuration(cluster4.client)
        rules = gpus[gpus["hostname"] == "host-1"]  # host-1 has no GPU: selects nothing
        assert rules.empty
    before = snapshot(cluster4)
    with pytest.raises(PlacementError, match=match):
        dvml.training_preprocessor(
            pd.DataFrame({"a": np.arange(8.0), "y": [0, 1] * 4}), y="y", x="a",
            distribution_rules=rules, name="pp_bad_rules", client=cluster4.client,
        )  # fmt: skip
    assert_nothing_left(cluster4, "pp_bad_rules", before)


def test_same_worker_by_name_and_address(cluster4: dvml.LocalCluster) -> None:
    address = next(w.address for w in cluster4.workers if w.name == "worker-1")
    with pytest.raises(PlacementError, match=rf"'worker-1' and '{address}' are both worker-1"):
        dvml.training_preprocessor(
            pd.DataFrame({"a": np.arange(8.0), "y": [0, 1] * 4}), y="y", x="a",
            distribution_rules=["worker-1", address], name="pp_twice", client=cluster4.client,
        )  # fmt: skip


def test_gpu_workers_without_gpus(cluster2: dvml.LocalCluster) -> None:
    before = snapshot(cluster2)
    with pytest.raises(PlacementError, match=r"distribution_rules='gpu_workers'.*no worker"):
        dvml.training_preprocessor(
            pd.DataFrame({"a": np.arange(8.0), "y": [0, 1] * 4}), y="y", x="a",
            distribution_rules="gpu_workers", name="pp_no_gpu", client=cluster2.client,
        )  # fmt: skip
    assert_nothing_left(cluster2, "pp_no_gpu", before)


# -- bad data and arguments ---------------------------------------------------------------------


def _good(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.normal(size=n),
            "name": [f"s{i}" for i in range(n)],
            "vec": [rng.normal(size=3) for _ in range(n)],
            "y": rng.integers(0, 3, size=n),
        }
    )


def _ragged() -> pd.DataFrame:
    frame = _good()
    cells = frame["vec"].tolist()
    cells[17] = np.zeros(4)  # one row of another shape
    return frame.assign(vec=cells)


def _ragged_partitions() -> Any:
    # Every partition is regular on its own; the shapes differ from one partition to the next.
    frame = pd.DataFrame({"vec": [np.zeros(3)] * 10 + [np.ones(5)] * 10, "y": [0, 1] * 10})
    # Dask would turn the array cells into strings.
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(frame, npartitions=2, sort=False)


def _empty_arrays() -> dict[str, Any]:
    return {"x": da.zeros((0, 3), chunks=1), "y": da.zeros((0,), chunks=1)}


def _mixed_labels() -> pd.DataFrame:
    frame = _good()
    frame["y"] = pd.Series([1, "1"] * (len(frame) // 2), dtype=object)  # in every partition
    return frame


def _empty_dask_frame() -> Any:
    return dd.from_pandas(pd.DataFrame({"a": np.zeros(0), "y": np.zeros(0, int)}), npartitions=1)


@pytest.mark.parametrize(
    ("source", "kwargs", "error", "match"),
    [
        (_good, {"x": "nope"}, DataError, r"Columns \['nope'\] are missing"),
        (_good, {"x": [["a", "zz"]]}, DataError, r"\['zz'\] are missing"),
        (_good, {"y": "label"}, DataError, r"Columns \['label'\] are missing"),
        (_good, {"x": [["a", "name"]]}, DataError, r"x column 'name' is not numeric"),
        (_ragged, {"x": "vec"}, DataError, r"'vec' holds arrays of different shapes.*\(4,\)"),
        (_ragged_partitions, {"x": "vec"}, DataError, r"different shapes across partitions"),
        (lambda: _good()[:0], {}, DataError, r"empty"),
        (_empty_arrays, {"x": "x"}, DataError, r"empty"),
        (_empty_dask_frame, {"x": "a"}, DataError, r"empty"),
        (_good, {"buffer_size": 0}, ValueError, r"buffer_size.*Received: 0"),
        (_good, {"buffer_size": -5}, ValueError, r"buffer_size.*Received: -5"),
        (_good, {"normalizing_const": 0}, ValueError, r"normalizing_const.*Received: 0"),
        (_good, {"normalizing_const": -255.0}, ValueError, r"normalizing_const.*-255"),
        (_good, {"num_classes": 2}, DataError, r"num_classes=2 is smaller than the 3 distinct"),
        (_good, {"normalizing_const": 1e-300}, ValueError, r"float32 can hold.*1e-300"),
        (_good, {"normalizing_const": 1e300}, ValueError, r"float32 can hold.*1e\+300"),
        (_mixed_labels, {}, DataError, r"mix value types.*\['int', 'str'\]"),
    ],
    ids=[
        "missing-x", "missing-x-in-group", "missing-y", "non-numeric-x", "ragged-rows",
        "ragged-partitions", "empty-pandas", "empty-arrays", "empty-dask", "buffer-size-0",
        "buffer-size-negative", "normalizing-const-0", "normalizing-const-negative",
        "num-classes-too-small", "normalizing-const-tiny", "normalizing-const-huge",
        "mixed-label-types",
    ],
)  # fmt: skip
def test_bad_data(
    cluster2: dvml.LocalCluster, source: Any, kwargs: dict, error: type, match: str
) -> None:
    before = snapshot(cluster2)
    args = {"y": "y", "x": [["a", "b"]], **kwargs}
    with pytest.raises(error, match=match):
        dvml.training_preprocessor(source(), name="pp_bad", client=cluster2.client, **args)
    assert_nothing_left(cluster2, "pp_bad", before)


def _with_invalid(n: int = 60) -> tuple[pd.DataFrame, list[int]]:
    frame = _good(n)
    frame.loc[[2, 30, 50], "a"] = np.nan  # spread over several partitions
    frame.loc[45, "b"] = np.inf
    frame.loc[50, "b"] = -np.inf  # a row with both: counted once as a row
    return frame, [2, 30, 45, 50]


def test_nan_and_inf_are_reported_with_counts(cluster2: dvml.LocalCluster) -> None:
    frame, bad = _with_invalid()
    before = snapshot(cluster2)
    with pytest.raises(DataError) as info:
        dvml.training_preprocessor(
            frame, y="y", x=[["a", "b"]], name="pp_nan", client=cluster2.client
        )
    message = str(info.value)
    assert "'a,b'" in message
    assert f"{len(bad)} of {len(frame)} rows" in message
    assert "3 NaN, 2 inf" in message
    assert "on_invalid='drop'" in message
    assert_nothing_left(cluster2, "pp_nan", before)


def test_values_beyond_float32_count_as_inf(cluster2: dvml.LocalCluster) -> None:
    # 1e300 is finite as float64 but would be stored as inf in the float32 buffers; so would
    # 1e30 divided by normalizing_const=1e-10.
    frame = _good(60)
    frame.loc[[4, 40], "a"] = 1e300
    frame.loc[10, "b"] = 1e30
    before = snapshot(cluster2)
    with pytest.raises(DataError, match=r"2 of 60 rows .*0 NaN, 2 inf"):
        dvml.training_preprocessor(
            frame, y="y", x=[["a", "b"]], name="pp_big", client=cluster2.client
        )
    with pytest.raises(DataError, match=r"3 of 60 rows .*0 NaN, 3 inf"):
        dvml.training_preprocessor(
            frame, y="y", x=[["a", "b"]], normalizing_const=1e-10, name="pp_big",
            client=cluster2.client,
        )  # fmt: skip
    assert_nothing_left(cluster2, "pp_big", before)


def test_nan_and_inf_rows_dropped(cluster2: dvml.LocalCluster) -> None:
    frame, bad = _with_invalid()
    before = snapshot(cluster2)
    ds = dvml.training_preprocessor(
        frame, y="y", x=[["a", "b"]], on_invalid="drop", name="pp_drop", client=cluster2.client
    )
    try:
        assert ds.summary["dropped_rows"] == len(bad)
        assert ds.summary["invalid_counts"] == {"a,b": len(bad)}
        assert ds.rows == ds.summary["rows"] == len(frame) - len(bad)
        kept = frame.drop(index=bad)
        x = kept[["a", "b"]].to_numpy().astype(np.float32)
        y = np.eye(3, dtype=np.float32)[kept["y"].to_numpy()]
        want = np.hstack([x, y])
        got = content(cluster2, ds)["sorted_rows"]
        np.testing.assert_array_equal(got, want[np.lexsort(want.T[::-1])])
    finally:
        ds.drop(client=cluster2.client)
    assert snapshot(cluster2) == before


# -- a vineyardd without room -----------------------------------------------------------------


@pytest.fixture(scope="module")
def small_cluster() -> Iterator[dvml.LocalCluster]:
    """2 workers whose vineyardds hold 32 MiB each."""
    with running_cluster(n_workers=2, vineyard_memory="32MiB") as c:
        yield c


def _float_rows(n: int, width: int = 256, seed: int = 1) -> dict[str, Any]:
    """``n`` rows of float64 x and 4 classes, :func:`_row_bytes` each once packed."""
    return {
        "x": da.random.default_rng(seed).random((n, width), chunks=(8192, width)),
        "y": da.random.default_rng(seed + 1).integers(0, 4, size=n, chunks=8192),
    }


def _row_bytes(width: int) -> int:
    """Bytes of one packed row of :func:`_float_rows` in the default (compact) layout: x as
    float32 (the source is float64, not uint8), y one uint8 class index."""
    return 4 * width + 1


def _as_frame(rows: dict[str, Any]) -> tuple[Any, list[list[str]]]:
    """The same rows as a Dask DataFrame (x one input of its float columns), whose row count
    is known only by reading it: the pack reads the source, then plans every field."""
    columns = [f"f{k}" for k in range(rows["x"].shape[1])]
    x = dd.from_dask_array(rows["x"], columns=columns)
    return dd.concat([x, dd.from_dask_array(rows["y"], columns="y")], axis=1), [columns]


def _pack_keys(stream: Any) -> list[str]:
    """Keys of the split and pack tasks a task stream saw (the tasks that write buffers)."""
    return [str(t["key"]) for t in stream.data
            if str(t["key"]).startswith(("pack_buffers", "split_group"))]  # fmt: skip


@pytest.mark.parametrize(
    "buffer_size",
    [None, 8192],
    ids=["one-buffer-too-big", "several-buffers-too-big"],
)
def test_vineyardd_without_room(small_cluster: dvml.LocalCluster, buffer_size: int | None) -> None:
    """48 MiB for a 32 MiB vineyardd: refused by the memory plan, whatever the buffer size,
    with the plan's numbers (of the default, compact layout), no put elsewhere, nothing left
    over.
    """
    client = small_cluster.client
    n, width = 49152, 256  # 48 MiB of float32 x
    before = snapshot(small_cluster)
    frame, x = _as_frame(_float_rows(n, width))
    with pytest.raises(MemoryPlanError) as info:
        dvml.training_preprocessor(
            frame, y="y", x=x, buffer_size=buffer_size,
            distribution_rules=["worker-0"], name="pp_full", client=client,
        )  # fmt: skip
    error = info.value
    assert isinstance(error, VineyardMemoryError)  # callers catching the old error still do
    row = error.plan.rows[0]
    assert row.workers == ("worker-0",) and len(error.plan.rows) == 1
    assert row.needed == n * _row_bytes(width) == 50_380_800
    assert row.limit == 32 * 2**20 and row.free < row.needed
    text = str(error)
    assert "'pp_full' does not fit" in text and "Nothing was written" in text
    assert f"Received: {n} rows of {_row_bytes(width)} bytes (48.0 MiB, compact layout)" in text
    assert "worker-0 (vineyardd" in text and "needs 48.0 MiB" in text and "of 32.0 MiB" in text
    assert "vineyard_memory: at least" in text and "more target workers" in text
    # Never a silent put on the other worker; nothing was put at all.
    assert_nothing_left(small_cluster, "pp_full", before)


def test_a_source_larger_than_shared_memory_is_refused_before_it_is_read(
    small_cluster: dvml.LocalCluster, tmp_path: Any
) -> None:
    """Dask arrays whose inputs alone (96 MiB of float32) exceed both vineyardds' free bytes
    (2 x 32 MiB): refused from their shapes, without computing a chunk (each chunk would
    leave a file behind), with the inputs' plan; nothing written."""
    client = small_cluster.client
    n, width = 98304, 256
    rows = _float_rows(n, width)

    def mark(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        (tmp_path / f"read-{block_info[0]['chunk-location'][0]}").touch()
        return block

    source = {"x": rows["x"].map_blocks(mark, dtype=rows["x"].dtype), "y": rows["y"]}
    before = snapshot(small_cluster)
    with pytest.raises(MemoryPlanError) as info:
        dvml.training_preprocessor(source, y="y", x="x", name="pp_huge", client=client)
    assert list(tmp_path.iterdir()) == []  # not one chunk was computed
    plan = info.value.plan
    assert plan.row_bytes == 4 * width and plan.needed == n * 4 * width
    assert sorted(w for r in plan.rows for w in r.workers) == ["worker-0", "worker-1"]
    text = str(info.value)
    assert "'pp_huge' does not fit" in text and "Nothing was written" in text
    assert (
        f"Received: {n} rows of {4 * width} bytes (96.0 MiB, compact layout, the inputs "
        "alone, counted before reading the source)" in text
    ), text
    assert_nothing_left(small_cluster, "pp_huge", before)


def test_oversubscribed_pack_is_refused_before_a_write(small_cluster: dvml.LocalCluster) -> None:
    """worker-0 holds 16 MiB of ballast; a pack of 24 MiB per worker fits worker-1 but not
    worker-0: refused before any split or pack task runs (worker-1 gets no buffer either),
    every vineyardd exactly as before. Once the ballast is dropped, the same pack fits."""
    from distributed import get_task_stream

    client = small_cluster.client
    ballast = dvml.training_preprocessor(
        _float_rows(16384, seed=5), y="y", x="x", distribution_rules=["worker-0"],
        name="pp_ballast", client=client,
    )  # fmt: skip
    try:
        before = snapshot(small_cluster)
        # dvml.plan.pack: the same plan without the pack, whether it fits or not
        with get_task_stream(client=client) as stream:
            planned = dvml.plan.pack(_float_rows(49152), y="y", x="x", name="pp_over",
                                     client=client)  # fmt: skip
        assert _pack_keys(stream) == []
        assert snapshot(small_cluster) == before
        assert not planned.fits and planned.row_bytes == _row_bytes(256)
        assert {r.workers[0]: r.fits for r in planned.rows} == {"worker-0": False,
                                                                "worker-1": True}  # fmt: skip
        assert list(planned.table()["needed"]) == [24576 * _row_bytes(256)] * 2
        with get_task_stream(client=client) as stream, pytest.raises(MemoryPlanError) as info:
            dvml.training_preprocessor(
                _float_rows(49152), y="y", x="x", name="pp_over", client=client
            )
        assert _pack_keys(stream) == []
        assert snapshot(small_cluster) == before  # bytes, tensors and staging of each vineyardd
        assert not dvml.datasets.exists("pp_over", client=client)
        fits = {r.workers[0]: r.fits for r in info.value.plan.rows}
        assert fits == {"worker-0": False, "worker-1": True}
        assert "worker-0 (vineyardd" in str(info.value) and "short by" in str(info.value)
    finally:
        dvml.datasets.drop(ballast.name, client=client)
    assert dvml.plan.pack(_float_rows(49152), y="y", x="x", name="pp_over", client=client).fits
    ds = dvml.training_preprocessor(_float_rows(49152), y="y", x="x", name="pp_over",
                                    client=client)  # fmt: skip
    try:
        assert ds.summary["rows_per_worker"] == {"worker-0": 24576, "worker-1": 24576}
    finally:
        dvml.datasets.drop(ds.name, client=client)


# -- a worker killed in the middle of packing -------------------------------------------------


def _kill_source() -> dict[str, Any]:
    # Generated on the workers; the same seeds give the same numbers on every computation.
    n, chunk = 60_000, 2_000
    return {
        "x": da.random.default_rng(11).random((n, 32), chunks=(chunk, 32)),
        "y": da.random.default_rng(12).integers(0, 5, size=n, chunks=chunk),
    }


def _kill_when_packing(
    cluster: dvml.LocalCluster, victim: str, stop: threading.Event, fired: dict[str, Any]
) -> None:
    """Wait until a pack task is on the victim, then SIGKILL the victim's worker process."""
    address = next(w.address for w in cluster.refresh() if w.name == victim)
    pid = cluster.processes()[f"dask worker {victim}"]

    def packing() -> bool:
        if stop.is_set():
            return True
        keys = cluster.client.processing(workers=[address]).get(address, ())
        return any(str(k).startswith("pack_buffers") for k in keys)

    if poll_for(packing, 120, interval=0.01) and not stop.is_set():
        os.kill(pid, signal.SIGKILL)
        fired["pid"] = pid


def test_worker_killed_while_packing(local_cluster: Callable[..., dvml.LocalCluster]) -> None:
    """SIGKILL a worker while it packs: the same result as an undisturbed run, or a clean
    failure; in both cases no orphan object in any vineyardd."""
    kwargs = {"y": "y", "x": "x", "buffer_size": 3_000, "seed": 5}
    cluster = local_cluster(n_workers=2, vineyard_memory="128MiB")
    client = cluster.client
    empty = snapshot(cluster)

    started = time.monotonic()
    reference = dvml.training_preprocessor(
        _kill_source(), name="pp_reference", client=client, **kwargs
    )
    reference_seconds = time.monotonic() - started
    expected = content(cluster, reference)
    reference.drop(client=client)
    assert snapshot(cluster) == empty

    stop, fired = threading.Event(), {}
    killer = threading.Thread(target=_kill_when_packing, args=(cluster, "worker-1", stop, fired))
    killer.start()
    outcome: Any
    try:
        outcome = dvml.training_preprocessor(
            _kill_source(), name="pp_killed", client=client, **kwargs
        )
    except ClusterError as exc:  # the one clean failure allowed (dvml.cluster.pinned); below
        outcome = exc
    finally:
        stop.set()
        killer.join()
    assert "pid" in fired, f"the worker was never killed (run took {reference_seconds:.1f}s)"
    # The Nanny restarts the worker under the same name, on the same vineyardd.
    assert poll_for(lambda: len(client.scheduler_info()["workers"]) == 2, 60)

    if isinstance(outcome, ClusterError):  # allowed, if clean: no dataset, no orphan
        assert_nothing_left(cluster, "pp_killed", empty)
        warnings.warn(f"the run failed cleanly after the kill: {outcome!r}", stacklevel=1)
        return
    got = content(cluster, outcome)
    assert got["rows"] == expected["rows"]
    assert got["class_values"] == expected["class_values"]
    np.testing.assert_array_equal(got["sorted_rows"], expected["sorted_rows"])
    # No orphan: each instance holds exactly the dataset's tensors, and no staging name.
    held = snapshot(cluster)
    for iid, state in held.items():
        mine = sorted(
            f["id"]
            for b in outcome.layout["buffers"]
            if b["instance_id"] == iid
            for f in b["fields"].values()
        )
        assert state["tensors"] == mine
        assert state["staging"] == []
    outcome.drop(client=client)
    assert snapshot(cluster) == empty
