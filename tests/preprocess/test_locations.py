"""Locations: paths, URLs, patterns and folders told apart by content (no cluster).

Local cases use real files; store cases use moto's S3 server (the ``s3_server`` fixture).
"""

from __future__ import annotations

import io
import pathlib
import tarfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from dvml.exceptions import DataError
from dvml.preprocess.locations import is_url, locate, read_bytes, read_table
from tests.helpers.s3 import S3Server


def _tar(path: pathlib.Path, mode: str = "w") -> None:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        data = b"1"
        info = tarfile.TarInfo("k.cls")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _png(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (3, 3), (1, 2, 3)).save(path)


@pytest.mark.parametrize(
    ("path", "remote"),
    [("s3://b/k", True), ("gs://b/k", True), ("https://h/x.tar", True), ("az://c/p", True),
     ("file:///tmp/x", False), ("/tmp/x", False), ("rel/x.parquet", False),
     ("a/b://c", False)],
)  # fmt: skip
def test_is_url(path: str, remote: bool) -> None:
    assert is_url(path) is remote


def test_shard_patterns(tmp_path: pathlib.Path) -> None:
    for i in range(3):
        _tar(tmp_path / f"shard-{i:06d}.tar")
    _tar(tmp_path / "shard-7.tar")  # not a %06d name
    _tar(tmp_path / "seed-0.tgz", "w:gz")
    _tar(tmp_path / "seed-1.tar.gz", "w:gz")
    expected = [str(tmp_path / f"shard-{i:06d}.tar") for i in range(3)]
    assert locate(str(tmp_path / "shard-%06d.tar")).paths == expected
    assert locate(str(tmp_path / "shard-{000000..000002}.tar")).paths == expected
    assert locate(str(tmp_path / "shard-00000?.tar")).paths == expected
    assert locate(f"file://{tmp_path}/shard-%06d.tar").paths == expected
    listed = locate([expected[2], str(tmp_path / "seed-0.tgz")])
    assert listed.kind == "shards" and listed.paths == [expected[2], str(tmp_path / "seed-0.tgz")]
    seeds = locate(str(tmp_path / "seed-*"))
    assert seeds.kind == "shards" and len(seeds.paths) == 2
    with pytest.raises(DataError, match=r"1 of 4 files of the pattern do not exist.*000003"):
        locate(str(tmp_path / "shard-{000000..000003}.tar"))
    with pytest.raises(DataError, match="Nothing matches the pattern"):
        locate(str(tmp_path / "none-*.tar"))


def test_directories_by_content(tmp_path: pathlib.Path) -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1], "part": list("aabb")})
    hive = tmp_path / "hive"
    pq.write_to_dataset(pa.Table.from_pandas(frame), hive, partition_cols=["part"])
    (hive / "_SUCCESS").write_text("")
    found = locate(hive)
    assert found.kind == "parquet" and found.root == str(hive) and len(found.paths) == 2
    table = read_table(found).compute()
    # the hive partition column is kept
    assert sorted(table.columns) == ["label", "part", "x"]
    assert sorted(zip(table["x"], table["part"].astype(str), strict=True)) == [
        (1.0, "a"), (2.0, "a"), (3.0, "b"), (4.0, "b")
    ]  # fmt: skip

    csvs = tmp_path / "csvs"
    csvs.mkdir()
    frame.iloc[:2].to_csv(csvs / "a.csv", index=False)
    frame.iloc[2:].to_csv(csvs / "b.csv", index=False)
    found = locate(csvs)
    assert found.kind == "csv"
    assert read_table(found).compute()["x"].tolist() == [1.0, 2.0, 3.0, 4.0]

    images = tmp_path / "images"
    _png(images / "cat" / "1.png")
    _png(images / "dog" / "deep" / "2.png")
    (images / "cat" / "notes.txt").write_text("ignored, as Keras ignores it")
    found = locate(images)
    assert found.kind == "images" and found.labels == ["cat", "dog"]
    assert [p.rsplit("/", 1)[1] for p in found.paths] == ["1.png", "2.png"]

    shards = tmp_path / "shards"
    shards.mkdir()
    _tar(shards / "a.tar")
    _tar(shards / "b.tgz", "w:gz")
    assert locate(shards).kind == "shards"

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("a.json", "b.json", "c.txt"):
        (mixed / name).write_text("{}")
    with pytest.raises(
        DataError, match=r"Cannot tell what the source folder holds.*2 \.json files, 1 \.txt file"
    ):
        locate(mixed)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no data file"):
        locate(tmp_path / "empty")
    loose = tmp_path / "loose"
    _png(loose / "1.png")
    with pytest.raises(DataError, match=r"lie directly in the folder.*'1.png'"):
        locate(loose)


def test_missing_local_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(DataError, match=r"No file or object matches the source.*nope.parquet"):
        locate(str(tmp_path / "nope.parquet"))
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"Cannot tell the format.*1 \.bin file"):
        locate(str(tmp_path / "x.bin"))


def test_store_listing_and_errors(s3_server: S3Server, tmp_path: pathlib.Path) -> None:
    bucket = s3_server.bucket("locations")
    _png(tmp_path / "imgs" / "cat" / "1.png")
    _png(tmp_path / "imgs" / "dog" / "2.png")
    s3_server.upload(tmp_path / "imgs", f"{bucket}/imgs")
    options = s3_server.storage_options
    found = locate(f"{bucket}/imgs", options)
    assert found.kind == "images" and found.remote
    assert found.paths == [f"{bucket}/imgs/cat/1.png", f"{bucket}/imgs/dog/2.png"]
    assert found.labels == ["cat", "dog"]
    contents = read_bytes(found.paths, options)
    assert contents == [(tmp_path / "imgs" / "cat" / "1.png").read_bytes(),
                        (tmp_path / "imgs" / "dog" / "2.png").read_bytes()]  # fmt: skip

    wrong = {**options, "key": "AKIAWRONGKEY0000"}
    with pytest.raises(DataError, match=r"refused access.*credentials.*storage_options") as e:
        locate(f"{bucket}/imgs", wrong)
    assert "Check the path" not in str(e.value)
    with pytest.raises(DataError, match=r"The bucket 'no-such-bucket' does not exist"):
        locate("s3://no-such-bucket/data.parquet", options)
    with pytest.raises(DataError, match=r"No file or object matches.*missing.parquet"):
        locate(f"{bucket}/missing.parquet", options)


def test_store_without_credentials_is_one_clear_error(
    s3_server: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key anywhere (options, environment, AWS files): a DataError naming the URL and how
    to give credentials, not botocore's NoCredentialsError and its traceback."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probe
    bucket = s3_server.bucket("nocredentials")
    options = {"client_kwargs": {"endpoint_url": s3_server.endpoint}}
    url = f"{bucket}/imgs"
    with pytest.raises(DataError, match=r"No credentials were found") as e:
        locate(url, options)
    message = str(e.value)
    assert repr(url) in message
    assert "AWS_ACCESS_KEY_ID" in message and "storage_options={'key'" in message
    with pytest.raises(DataError, match=r"No credentials were found"):
        read_bytes([f"{url}/cat/1.png"], options)  # what a worker runs


def test_parts_carry_names_not_bytes(s3_server: S3Server, tmp_path: pathlib.Path) -> None:
    """The tasks built on the client name the files; the workers fetch the bytes."""
    import cloudpickle
    import numpy as np

    from dvml.preprocess.sources import source_parts

    rng = np.random.default_rng(0)
    with tarfile.open(tmp_path / "big-000000.tar", "w") as tar:
        for i in range(20):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", b"1")):
                info = tarfile.TarInfo(f"k{i:02d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    bucket = s3_server.bucket("graphs")
    s3_server.upload(tmp_path / "big-000000.tar", f"{bucket}/big-000000.tar")
    shard_bytes = (tmp_path / "big-000000.tar").stat().st_size
    assert shard_bytes > 200_000
    src = source_parts(f"{bucket}/big-%06d.tar", None, None, 2, "raise", (8, 8), 3,
                       storage_options=s3_server.storage_options)  # fmt: skip
    graph_bytes = sum(len(cloudpickle.dumps(dict(p.__dask_graph__()))) for p in src.parts)
    assert len(src.parts) == 1 and graph_bytes < 10_000
