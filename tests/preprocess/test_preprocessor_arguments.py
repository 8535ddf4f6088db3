"""The preprocessors' arguments, checked before any cluster is needed: ``name`` is required
(and says so), and an image source's ``channels`` comes from its images when not given."""

from __future__ import annotations

import inspect
import io
import pathlib

import pandas as pd
import pytest
from PIL import Image

import dvml
from dvml.exceptions import ArgumentError
from dvml.preprocess.images import channels_of_image
from dvml.preprocess.sources import source_parts
from tests.helpers import write_image_folder, write_tar_shards


@pytest.mark.parametrize("fn", [dvml.training_preprocessor, dvml.validation_preprocessor])
def test_name_is_required_and_the_signature_says_so(fn: object) -> None:
    name = inspect.signature(fn).parameters["name"]  # type: ignore[arg-type]
    assert name.default is inspect.Parameter.empty
    assert name.kind is inspect.Parameter.KEYWORD_ONLY


def test_name_none_says_what_to_pass() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1]})
    with pytest.raises(ArgumentError, match=r"name= is required.*Received: name=None.*name='"):
        dvml.training_preprocessor(frame, y="y", x="x", name=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "fmt", "expected"),
    [("L", "PNG", 1), ("LA", "PNG", 1), ("I;16", "PNG", 1), ("1", "BMP", 1), ("L", "JPEG", 1),
     ("RGB", "JPEG", 3), ("RGBA", "PNG", 3), ("CMYK", "JPEG", 3)],
)  # fmt: skip
def test_channels_of_image(mode: str, fmt: str, expected: int) -> None:
    buf = io.BytesIO()
    Image.new(mode, (4, 3)).save(buf, format=fmt)
    buf.seek(0)
    assert channels_of_image(buf) == expected


def test_channels_of_a_palette_image() -> None:
    grey, colour = io.BytesIO(), io.BytesIO()
    Image.new("L", (4, 3), 90).convert("P").save(grey, format="GIF")
    Image.new("RGB", (4, 3), (200, 30, 60)).convert("P").save(colour, format="GIF")
    assert channels_of_image(io.BytesIO(grey.getvalue())) == 1
    assert channels_of_image(io.BytesIO(colour.getvalue())) == 3


@pytest.mark.parametrize("kind", ["folder", "shards"])
@pytest.mark.parametrize(("grey", "expected"), [(True, 1), (False, 3)])
def test_image_source_channels_come_from_the_images(
    kind: str, grey: bool, expected: int, tmp_path: pathlib.Path
) -> None:
    """channels=None (the default): a grey source is packed with one channel, not three."""
    if kind == "folder":
        source = str(write_image_folder(tmp_path / "images", 2, grey=grey))
    else:
        source = write_tar_shards(tmp_path / "shards", 2, 2, grey=grey)
    src = source_parts(source, None, None, 1, "raise", (8, 8), None)
    assert src.channels == expected
    given = source_parts(source, None, None, 1, "raise", (8, 8), 3)
    assert given.channels == 3  # an explicit channels= wins


def test_channels_argument_is_checked() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1]})
    with pytest.raises(ArgumentError, match=r"channels must be 1 \(grey\), 3 \(RGB\) or None"):
        dvml.training_preprocessor(frame, y="y", x="x", name="a", channels=2)
