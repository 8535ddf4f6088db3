"""A job file's data in an S3-compatible store (moto's server): the job's datasets are packed
from a hive-partitioned Parquet data set and from webdataset shards, with the store's
options from the configuration (dvml.storage-options), as a scheduled job runs."""

from __future__ import annotations

import io
import pathlib
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest

import dvml
from dvml.jobs.data import prepare_datasets, resolve_source
from dvml.jobs.schemas import JOB_SCHEMA
from dvml.jobs.yaml_schema import load

pytestmark = pytest.mark.cluster
MODEL_COMPILE = "  compile_params: \"loss='categorical_crossentropy', optimizer='adam'\""


def _job(path: pathlib.Path, name: str, data: list[str], validation: list[str]) -> dict[str, Any]:
    text = "\n".join([f"name: {name}", "registry: sqlite:///unused.db", "data:",
                      *[f"  {line}" for line in data], "validation:",
                      *[f"  {line}" for line in validation],
                      "model:", "  architecture: builtin:digits-cnn", MODEL_COMPILE])  # fmt: skip
    path.write_text(text + "\n")
    return load(path, JOB_SCHEMA)


def test_job_data_from_the_store(
    cluster2: dvml.LocalCluster, s3_server: Any, tmp_path: pathlib.Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds
    from PIL import Image

    client = cluster2.client
    bucket = s3_server.bucket("jobdata")
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"a": rng.normal(size=80), "b": rng.normal(size=80),
                          "label": rng.integers(0, 3, 80),
                          "day": np.repeat([1, 2], 40)})  # fmt: skip
    pq.write_to_dataset(pa.Table.from_pandas(frame), tmp_path / "t", partition_cols=["day"])
    s3_server.upload(tmp_path / "t", f"{bucket}/table")
    (tmp_path / "wds").mkdir()
    with wds.ShardWriter(str(tmp_path / "wds" / "s-%06d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(30):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).save(buf, "PNG")
            sink.write({"__key__": f"k{i:03d}", "png": buf.getvalue(), "cls": i % 3})
    s3_server.upload(tmp_path / "wds", f"{bucket}/wds")
    names = ["jobs3-train", "jobs3-val", "jobimg-train", "jobimg-val"]
    try:
        with dask.config.set({"dvml.storage-options": s3_server.storage_options}):
            source = resolve_source(f"{bucket}/table")
            assert source.kind == "table" and source.format == "parquet"
            job = _job(tmp_path / "t.yaml", "jobs3",
                       [f"source: {bucket}/table", "x: [[a, b, day]]", "y: label"],
                       ["split: 0.25"])  # fmt: skip
            train, val = prepare_datasets(job, client, tmp_path, source)
            assert train.rows + val.rows == 80 and val.rows > 0
            assert train.summary["independent_varname"] == [["a", "b", "day"]]

            job = _job(tmp_path / "i.yaml", "jobimg",
                       [f"source: {bucket}/wds/s-%06d.tar", "image_size: [4, 4]"],
                       [f"source: {bucket}/wds/s-000002.tar"])  # fmt: skip
            train, val = prepare_datasets(job, client, tmp_path)
            assert train.rows == 30 and val.rows == 10
            assert train.summary["class_values"] == [0, 1, 2]
    finally:
        for name in names:
            if dvml.datasets.exists(name, client=client):
                dvml.datasets.drop(name, client=client)
