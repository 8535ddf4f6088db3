"""WebDataset-style shards: brace patterns, tar grouping, images and labels."""

from __future__ import annotations

import io
import pathlib
import tarfile

import numpy as np
import pytest
from PIL import Image

from dvml.exceptions import ArgumentError, DataError
from dvml.preprocess.shards import (
    expand_braces,
    read_tar_samples,
    sample_ids,
    samples_to_images_labels,
    shard_names,
)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("plain.tar", ["plain.tar"]),
        ("shard-{0..2}.tar", ["shard-0.tar", "shard-1.tar", "shard-2.tar"]),
        ("shard-{0000..0002}.tar", ["shard-0000.tar", "shard-0001.tar", "shard-0002.tar"]),
        ("s{08..11}", ["s08", "s09", "s10", "s11"]),
        ("s{8..11}", ["s8", "s9", "s10", "s11"]),
        ("s{3..1}", ["s3", "s2", "s1"]),
        ("s{-1..1}", ["s-1", "s0", "s1"]),
        ("{train,val}-{0..1}.tar", ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]),
        ("{a,b}{x,y}", ["ax", "ay", "bx", "by"]),
        ("{a,{b,c}d}", ["a", "bd", "cd"]),
        ("x{a,}", ["xa", "x"]),
        ("/data/{0..1}/part-{00..01}.tar", [
            "/data/0/part-00.tar", "/data/0/part-01.tar",
            "/data/1/part-00.tar", "/data/1/part-01.tar",
        ]),
    ],
)  # fmt: skip
def test_expand_braces(pattern: str, expected: list[str]) -> None:
    assert expand_braces(pattern) == expected


def test_expand_braces_large_range() -> None:
    names = expand_braces("shard-{0000..0147}.tar")
    assert len(names) == 148
    assert names[0] == "shard-0000.tar" and names[-1] == "shard-0147.tar"


@pytest.mark.parametrize(
    ("pattern", "match"),
    [
        ("shard-{0..3.tar", r"'\{' without its '\}'"),
        ("shard-0..3}.tar", r"'\}' without its '\{'"),
        ("shard-{}.tar", "empty group"),
        ("shard-{abc}.tar", r"neither a range"),
        ("shard-{a..e}.tar", r"neither a range"),
        ("shard-{1...3}.tar", r"neither a range"),
        ("{a,{b}", r"without its"),
    ],
)
def test_expand_braces_refuses(pattern: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        expand_braces(pattern)


def _png(color: tuple[int, int, int], size: tuple[int, int] = (5, 4)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _jpg(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (5, 4), color).save(buf, format="JPEG")
    return buf.getvalue()


def _write_tar(
    path: pathlib.Path, members: list[tuple[str, bytes | None]], mode: str = "w"
) -> None:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:  # a directory entry
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_read_tar_samples(tmp_path: pathlib.Path) -> None:
    shard = tmp_path / "shard-0000.tar"
    members: list[tuple[str, bytes | None]] = [
        ("sub", None),
        ("0001.jpg", b"J1"),
        ("0001.cls", b"3"),
        ("0002.PNG", b"P2"),
        ("0002.cls", b"1\n"),
        ("./sub/0003.seg.png", b"S3"),
        ("sub/0003.cls", b"0"),
        ("README", b"no extension"),
        ("._0001.jpg", b"resource fork"),
    ]
    _write_tar(shard, members)
    samples = read_tar_samples(str(shard))
    assert samples == [
        ("0001", {"jpg": b"J1", "cls": b"3"}),
        ("0002", {"png": b"P2", "cls": b"1\n"}),
        ("sub/0003", {"seg.png": b"S3", "cls": b"0"}),
    ]


def test_read_tar_samples_compressed(tmp_path: pathlib.Path) -> None:
    shard = tmp_path / "shard.tar.gz"
    _write_tar(shard, [("a.txt", b"x"), ("a.jpg", b"y")], mode="w:gz")
    assert read_tar_samples(str(shard)) == [("a", {"txt": b"x", "jpg": b"y"})]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"this is not a tar file" * 30, "Cannot read the tar shard"),
        (None, "same extension twice.*'0001'.*'jpg'"),
    ],
)
def test_read_tar_samples_refuses(
    tmp_path: pathlib.Path, content: bytes | None, match: str
) -> None:
    shard = tmp_path / "bad.tar"
    if content is None:
        _write_tar(shard, [("0001.jpg", b"a"), ("0001.JPG", b"b")])
    else:
        shard.write_bytes(content)
    with pytest.raises(DataError, match=match):
        read_tar_samples(str(shard))


def test_samples_to_images_labels(tmp_path: pathlib.Path) -> None:
    shard = tmp_path / "shard-0000.tar"
    _write_tar(
        shard,
        [
            ("0001.jpg", _jpg((250, 0, 0))),
            ("0001.cls", b"3"),
            ("0002.png", _png((0, 0, 250))),
            ("0002.cls", b" 12 \n"),
            ("0003.jpeg", _jpg((0, 250, 0))),
            ("0003.cls", b"7"),
            ("0003.txt", b"a green square"),  # a caption: never the label
        ],
    )
    images, labels = samples_to_images_labels(read_tar_samples(str(shard)), (4, 5))
    assert images.shape == (3, 4, 5, 3) and images.dtype == np.uint8
    # webdataset decodes .cls with int(): 12 sorts after 3, not before as the text "12" would
    assert labels == [3, 12, 7] and all(type(v) is int for v in labels)
    assert tuple(images[1, 0, 0]) == (0, 0, 250)
    assert images[0, ..., 0].min() > 200


def test_samples_to_images_labels_class_names_stay_text() -> None:
    samples = [("k", {"png": _png((9, 9, 9)), "cls": b"cat"})]
    assert samples_to_images_labels(samples, (2, 2))[1] == ["cat"]


def test_samples_to_images_labels_grayscale_and_custom_ext() -> None:
    samples = [("k", {"png": _png((9, 9, 9)), "y": b"1"})]
    images, labels = samples_to_images_labels(samples, (2, 2), label_ext=("y",), channels=1)
    assert images.shape == (1, 2, 2, 1) and labels == ["1"]


def test_samples_to_images_labels_picks_image_ext() -> None:
    samples = [
        ("k", {"png": _png((9, 0, 0)), "jpg": _jpg((0, 0, 250)), "seg.png": _png((0, 250, 0)),
               "label": b"dog", "cls": b"1"}),
    ]  # fmt: skip
    images, labels = samples_to_images_labels(samples, (2, 2), image_ext="seg.png")
    assert labels == [1] and tuple(images[0, 0, 0]) == (0, 250, 0)
    images, labels = samples_to_images_labels(samples, (2, 2), image_ext=".png", label_ext="label")
    assert labels == ["dog"] and tuple(images[0, 0, 0]) == (9, 0, 0)
    with pytest.raises(DataError, match=r"has no label.*\['cls', 'jpg', 'label', 'png'.*"):
        samples_to_images_labels(samples, (2, 2), image_ext="jpg", label_ext="txt")


def test_samples_to_images_labels_empty() -> None:
    images, labels = samples_to_images_labels([], (3, 3))
    assert images.shape == (0, 3, 3, 3) and labels == []


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        ({"cls": b"1"}, r"Sample '0007' in 'shard-3.tar' has no image.*\['cls'\].*image_ext="),
        ({"jpg": _jpg((1, 1, 1))}, r"has no label.*\['jpg'\].*label_ext="),
        ({"jpg": _jpg((1, 1, 1)), "txt": b"a dog"}, r"has no label.*caption.*label_ext="),
        ({"jpg": _jpg((1, 1, 1)), "cls": b"  "}, r"label of sample '0007'.*is empty"),
        ({"jpg": _jpg((1, 1, 1)), "cls": b"\xff\xfe"}, r"not UTF-8"),
        ({"jpg": b"broken", "cls": b"1"}, r"'shard-3.tar:0007.jpg'"),
        (
            {"jpg": _jpg((1, 1, 1)), "png": _png((1, 1, 1)), "seg.png": b"", "cls": b"1"},
            r"several images: \['jpg', 'png', 'seg.png'\]\. Pass image_ext=",
        ),
    ],
)
def test_samples_to_images_labels_refuses(sample: dict[str, bytes], match: str) -> None:
    with pytest.raises(DataError, match=match):
        samples_to_images_labels([("0007", sample)], (4, 4), source="shard-3.tar")


def test_dotted_keys_are_grouped_as_webdataset_does_with_a_short_message(
    tmp_path: pathlib.Path,
) -> None:
    shard = tmp_path / "dots.tar"
    members: list[tuple[str, bytes | None]] = []
    for i in range(500):
        members += [(f"img.{i:04d}.jpg", _jpg((1, 1, 1))), (f"img.{i:04d}.cls", b"1")]
    _write_tar(shard, members)
    samples = read_tar_samples(str(shard))
    assert [key for key, _ in samples] == ["img"] and len(samples[0][1]) == 1000
    with pytest.raises(DataError, match=r"keys seem to hold dots.*FIRST dot.*1000 files") as e:
        samples_to_images_labels(samples, (4, 4), source=str(shard))
    assert len(str(e.value)) < 700


def test_sample_ids_are_the_shard_file_name_and_the_key() -> None:
    # Issue 42 item 3: keys repeat from shard to shard; the file name makes the ids unique.
    paths = ["s3://bucket/test/shard-000000.tar", "/data/test/shard-000001.tar"]
    names = shard_names(paths)
    assert names == ["shard-000000.tar", "shard-000001.tar"]
    ids = [i for name in names for i in sample_ids(name, ["0010", "0011"])]
    assert ids == ["shard-000000.tar/0010", "shard-000000.tar/0011",
                   "shard-000001.tar/0010", "shard-000001.tar/0011"]  # fmt: skip
    with pytest.raises(ArgumentError, match=r"share a file name.*'/b/shard-0.tar'.*separate"):
        shard_names(["s3://a/shard-0.tar", "/b/shard-0.tar"])
