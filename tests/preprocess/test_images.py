"""Class-per-folder image trees and Pillow decoding, on images written into tmp_path."""

from __future__ import annotations

import io
import pathlib
from typing import Any

import numpy as np
import pytest
from PIL import Image

from dvml.exceptions import DataError
from dvml.preprocess.images import decode_image, list_image_folder


def _image_bytes(
    fmt: str, size: tuple[int, int] = (8, 6), color: Any = (200, 30, 60), mode: str = "RGB"
) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format=fmt)
    return buf.getvalue()


def _write(path: pathlib.Path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_image_bytes(fmt))


def test_list_image_folder(tmp_path: pathlib.Path) -> None:
    files = {
        "dog/b.JPG": "JPEG",
        "dog/a.png": "PNG",
        "cat/z.jpeg": "JPEG",
        "cat/deeper/y.bmp": "BMP",
        "cat/x.gif": "GIF",
        "bird/only.Png": "PNG",
    }
    for rel, fmt in files.items():
        _write(tmp_path / rel, fmt)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "cat" / ".hidden.jpg").write_bytes(b"")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    _write(tmp_path / ".ipynb_checkpoints" / "c.jpg", "JPEG")
    _write(tmp_path / "loose.jpg", "JPEG")
    (tmp_path / "empty_class").mkdir()

    paths, labels = list_image_folder(tmp_path)
    relative = [str(pathlib.Path(p).relative_to(tmp_path)) for p in paths]
    assert relative == [
        "bird/only.Png",
        "cat/deeper/y.bmp",
        "cat/x.gif",
        "cat/z.jpeg",
        "dog/a.png",
        "dog/b.JPG",
    ]
    assert labels == ["bird", "cat", "cat", "cat", "dog", "dog"]
    assert list_image_folder(str(tmp_path)) == (paths, labels)


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ({}, r"No images found.*class folders \[\]"),
        ({"cat/readme.txt": None}, r"No images found.*\['cat'\].*jpg"),
        ({"a.jpg": "JPEG", "b.png": "PNG"}, r"2 image\(s\) lie directly in root.*'a.jpg'"),
    ],
)
def test_list_image_folder_refuses_empty(
    tmp_path: pathlib.Path, layout: dict[str, str | None], match: str
) -> None:
    for rel, fmt in layout.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt is None:
            path.write_text("text")
        else:
            _write(path, fmt)
    with pytest.raises(DataError, match=match):
        list_image_folder(tmp_path)


def test_list_image_folder_refuses_missing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        list_image_folder(tmp_path / "nope")


@pytest.mark.parametrize(
    ("fmt", "mode", "color", "size", "channels", "pixel"),
    [
        ("JPEG", "RGB", (255, 0, 0), (4, 4), 3, None),
        ("PNG", "RGB", (10, 20, 30), (8, 6), 3, (10, 20, 30)),  # no resize: exact pixels
        ("PNG", "RGB", (10, 20, 30), (3, 5), 3, (10, 20, 30)),  # flat colour survives resize
        ("PNG", "L", 77, (6, 8), 3, (77, 77, 77)),
        ("PNG", "RGB", (0, 0, 0), (6, 8), 1, (0,)),
        ("PNG", "RGBA", (1, 2, 3, 4), (6, 8), 4, (1, 2, 3, 4)),
        ("BMP", "RGB", (5, 5, 5), (2, 2), 3, (5, 5, 5)),
        ("GIF", "P", 3, (6, 8), 3, None),
    ],
)
def test_decode_image(
    fmt: str,
    mode: str,
    color: object,
    size: tuple[int, int],
    channels: int,
    pixel: tuple[int, ...] | None,
) -> None:
    # written 8 wide and 6 high: size is (height, width)
    out = decode_image(_image_bytes(fmt, (8, 6), color, mode), size, channels)
    assert out.shape == (*size, channels)
    assert out.dtype == np.uint8
    if pixel is not None:
        assert tuple(out[0, 0]) == pixel
    if fmt == "JPEG":
        assert out[..., 0].min() > 200 and out[..., 1].max() < 60


def test_decode_image_keeps_orientation() -> None:
    img = Image.new("L", (8, 6), 0)
    img.putpixel((7, 0), 255)  # top right
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    out = decode_image(buf.getvalue(), (6, 8), channels=1)
    assert out[0, 7, 0] == 255 and out[5, 0, 0] == 0


@pytest.mark.parametrize(
    ("data", "source", "match"),
    [
        (b"not an image at all", "cats/1.jpg", r"from 'cats/1.jpg'.*19 bytes"),
        (_image_bytes("JPEG")[:40], None, r"Cannot decode the image: "),
        (_image_bytes("PNG")[:-30], "x.png", r"'x.png'"),
        (b"", "empty.jpg", r"0 bytes"),
    ],
)
def test_decode_image_refuses_corrupt(data: bytes, source: str | None, match: str) -> None:
    with pytest.raises(DataError, match=match):
        decode_image(data, (4, 4), source=source)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"size": (0, 4)}, ValueError),
        ({"size": (4,)}, TypeError),
        ({"size": (4.0, 4)}, TypeError),
        ({"size": (4, 4), "channels": 2}, ValueError),
        ({"size": (4, 4), "channels": True}, ValueError),
    ],
)
def test_decode_image_validates(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_image(_image_bytes("PNG"), **kwargs)


def test_decode_image_refuses_str() -> None:
    with pytest.raises(TypeError, match="bytes"):
        decode_image("abc", (4, 4))  # type: ignore[arg-type]
