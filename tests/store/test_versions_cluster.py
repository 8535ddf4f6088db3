"""Dataset versions and appends on a real 2-worker cluster (issue 39, items 1 and 2).

An append publishes version n+1 over the SAME vineyard objects as version n (checked by object
id) plus new ones placed where they keep the workers equal; every buffer's recorded digest is
the digest of the bytes a worker reads back; a reader of version n (holding a lease) reads the
same bytes after an append and is protected from a drop; a source with a new class value or
other x shapes is refused and leaves the dataset as it was.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.exceptions import DataError, DatasetInUseError
from dvml.resolve.by_id import read_buffer
from dvml.store.leases import holding
from dvml.store.versions import buffer_digest, field_digest
from tests.helpers import tls_environment

if TYPE_CHECKING:
    from distributed import Client

pytestmark = pytest.mark.cluster

NAME = "versions_iris"


def _iris(rows: slice) -> pd.DataFrame:
    from sklearn.datasets import load_iris

    d = load_iris()
    return pd.DataFrame(
        {"x": list(d.data.astype("float32")[rows]), "label": d.target[rows]}
    ).reset_index(drop=True)


def _digests_on_workers(client: Client, ds: dvml.Dataset) -> dict[int, str]:
    """Buffer index -> the digest of the bytes its worker reads back now (no copy leaves it)."""
    by_instance = dvml.datasets.vineyard_workers(client)
    found = {}
    for b in ds.layout["buffers"]:
        worker = by_instance[b["instance_id"]]
        fields = {}
        for field, spec in b["fields"].items():
            fields[field] = {
                "digest": client.submit(
                    _read_digest, spec["id"], workers=[worker.address],
                    allow_other_workers=False, pure=False,
                ).result(timeout=60)
            }  # fmt: skip
        found[b["index"]] = buffer_digest({"fields": fields})
    return found


def _read_digest(object_id: int) -> str:
    return field_digest(read_buffer(object_id))


@pytest.fixture(scope="module")
def packed(cluster2: dvml.LocalCluster) -> Iterator[dvml.Dataset]:
    """Iris rows 0..119 (the 3 classes) as version 1 of NAME: 60 rows a worker."""
    client = cluster2.client
    ds = dvml.training_preprocessor(
        _iris(slice(0, 120)), y="label", x="x", name=NAME, overwrite=True, client=client
    )
    try:
        yield ds
    finally:
        if dvml.datasets.exists(NAME, client=client):
            dvml.datasets.drop(NAME, client=client, force=True)


def _ids(ds: dvml.Dataset) -> set[int]:
    return {f["id"] for b in ds.layout["buffers"] for f in b["fields"].values()}


def _rows_per_worker(ds: dvml.Dataset) -> dict[str, int]:
    return dict(ds.distribution().set_index("worker_name")["rows"])


def test_append_shares_every_old_buffer_and_stays_balanced(
    cluster2: dvml.LocalCluster, packed: dvml.Dataset
) -> None:
    client = cluster2.client
    v1 = dvml.datasets.describe(NAME, client=client)
    assert (v1.version, [v["version"] for v in v1.versions]) == (1, [1])
    read_back = _digests_on_workers(client, v1)
    assert v1.versions[0]["digests"] == {str(i): d for i, d in read_back.items()}
    assert sorted(_rows_per_worker(v1).values()) == [60, 60]

    v2 = dvml.datasets.append(NAME, _iris(slice(120, 141)), client=client)  # 21 rows
    assert v2.version == 2
    old_buffers = {b["index"]: b for b in v1.layout["buffers"]}
    for b in v2.layout["buffers"]:
        if b["index"] in old_buffers:  # the same objects, same worker: nothing copied or moved
            assert b["fields"] == old_buffers[b["index"]]["fields"]
            assert (b["version"], b["instance_id"]) == (1, old_buffers[b["index"]]["instance_id"])
        else:
            assert b["version"] == 2
    assert _ids(v1) < _ids(v2)
    assert sorted(_rows_per_worker(v2).values()) == [70, 71]
    assert v2.rows == v2.summary["rows"] == 141
    assert v2.summary["class_values"] == v1.summary["class_values"]
    record = v2.versions[-1]
    assert (record["parent"], record["rows"]) == (1, 21)
    assert record["source"]["description"] == "pandas.DataFrame(21 rows)"
    assert record["source"]["params"]["normalizing_const"] == 1.0
    # every version records the parameters it applied: version 1's automatic buffer size and
    # class count too (it was given None for both), as the append's are
    first = v2.versions[0]["source"]["params"]
    applied = {k: v1.summary[k] for k in ("buffer_size", "num_classes")}
    assert {k: first[k] for k in applied} == applied == {k: record["source"]["params"][k]
                                                         for k in applied}  # fmt: skip
    assert record["digests"] == {
        str(i): d for i, d in _digests_on_workers(client, v2).items() if str(i) in record["digests"]
    }

    # One row more goes to the worker that holds fewer.
    fewer = min(_rows_per_worker(v2), key=_rows_per_worker(v2).get)
    v3 = dvml.datasets.append(NAME, _iris(slice(141, 142)), client=client)
    assert _rows_per_worker(v3) == {**_rows_per_worker(v2), fewer: 71}
    table = dvml.datasets.versions(NAME, client=client)
    assert table[["version", "rows_added", "rows"]].values.tolist() == [
        [1, 120, 120],
        [2, 21, 141],
        [3, 1, 142],
    ]
    # A reader names a version: its handle holds that version's buffers only.
    again = dvml.datasets.describe(NAME, client=client, version=1)
    assert (again.version, again.rows, _ids(again)) == (1, 120, _ids(v1))


def test_a_reader_of_an_old_version_is_not_disturbed(
    cluster2: dvml.LocalCluster, packed: dvml.Dataset
) -> None:
    client = cluster2.client
    latest = dvml.datasets.describe(NAME, client=client)
    n = latest.version
    with holding([NAME], job="a test reader of version n", client=client):
        old = dvml.datasets.describe(NAME, client=client, version=n)
        before = _digests_on_workers(client, old)
        grown = dvml.datasets.append(NAME, _iris(slice(0, 10)), client=client)
        assert grown.version == n + 1
        with pytest.raises(DatasetInUseError, match="a test reader of version n"):
            dvml.datasets.drop(NAME, client=client)
        assert _digests_on_workers(client, old) == before
        assert dvml.datasets.describe(NAME, client=client, version=n).layout == old.layout
    dvml.datasets.drop(NAME, client=client)
    assert not dvml.datasets.exists(NAME, client=client)
    # the fixture's dataset is gone: pack it again for any test that follows
    dvml.training_preprocessor(
        _iris(slice(0, 120)), y="label", x="x", name=NAME, overwrite=True, client=client
    )


def test_a_new_class_or_another_schema_is_refused(
    cluster2: dvml.LocalCluster, packed: dvml.Dataset
) -> None:
    client = cluster2.client
    before = dvml.datasets.describe(NAME, client=client)
    new_class = _iris(slice(0, 10)).assign(label=7)
    with pytest.raises(DataError, match=r"Cannot append to 'versions_iris'.*\[7\].*class values"):
        dvml.datasets.append(NAME, new_class, client=client)
    wider = pd.DataFrame({"x": [np.zeros(5, "float32")] * 10, "label": np.zeros(10, dtype=int)})
    with pytest.raises(DataError, match=r"Cannot append to 'versions_iris'.*x shapes \[\[5\]\]"):
        dvml.datasets.append(NAME, wider, client=client)
    with pytest.raises(DataError):  # a missing column
        dvml.datasets.append(NAME, _iris(slice(0, 10)).rename(columns={"x": "z"}), client=client)
    after = dvml.datasets.describe(NAME, client=client)
    assert (after.id, after.version, after.layout) == (before.id, before.version, before.layout)


def test_cli_append_records_the_files_of_the_source(
    cluster2: dvml.LocalCluster, packed: dvml.Dataset, tmp_path: pathlib.Path
) -> None:
    client = cluster2.client
    before = dvml.datasets.describe(NAME, client=client)
    path = tmp_path / "day-2.parquet"
    _iris(slice(60, 80)).assign(x=lambda f: f["x"].map(list)).to_parquet(path)
    done = subprocess.run(
        [sys.executable, "-m", "dvml", "datasets", "append", NAME, str(path), "--json",
         "--scheduler", cluster2.scheduler_address],
        capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, **tls_environment(cluster2)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert (out["version"], out["rows_added"]) == (before.version + 1, 20)
    source = dvml.datasets.describe(NAME, client=client).versions[-1]["source"]
    (entry,) = source["files"]
    assert entry["path"].endswith("day-2.parquet")
    assert (entry["size"], entry["mtime"]) == (path.stat().st_size, path.stat().st_mtime)
    assert source["params"]["seed"] == before.summary["seed"] + before.version
