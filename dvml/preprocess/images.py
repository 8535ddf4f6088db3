"""Image folders and image decoding (Pillow), for the image ingest paths.

:func:`list_image_folder` reads the layout Keras' ``image_dataset_from_directory`` expects
(``root/<class>/<image>``); :func:`decode_image` turns the bytes of one file into a fixed-size
uint8 array. Neither touches Dask or vineyard.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError

__all__ = [
    "IMAGE_EXTENSIONS",
    "channels_of_image",
    "check_size",
    "decode_image",
    "list_image_folder",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
# Pillow modes without colour: bilevel, 8/16/32-bit grey, float grey, grey with alpha.
_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


def _is_image(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def list_image_folder(root: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """List the images of a class-per-folder tree and their labels.

    Parameters
    ----------
    root : str or path-like
        A folder with one sub-folder per class; images may sit deeper inside a class folder.
        Files directly in ``root`` and hidden entries (``.name``) are ignored.

    Returns
    -------
    paths : list of str
        Image paths, sorted by class folder, then by path inside it.
    labels : list of str
        The class folder name of each image.

    Raises
    ------
    DataError
        When ``root`` is not a folder or holds no image in a class folder.
    """
    root_path = os.fspath(root)
    if not os.path.isdir(root_path):
        raise DataError(
            f"The image folder does not exist or is not a folder. Received: root={root_path!r}. "
            f"Pass a folder laid out as root/<class>/<image>.jpg."
        )
    paths: list[str] = []
    labels: list[str] = []
    with os.scandir(root_path) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    for label in classes:
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(root_path, label)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            found.extend(os.path.join(dirpath, n) for n in filenames if _is_image(n))
        paths.extend(sorted(found))
        labels.extend([label] * len(found))
    if not paths:
        loose = [n for n in sorted(os.listdir(root_path)) if _is_image(n)]
        hint = (
            f" {len(loose)} image(s) lie directly in root (e.g. {loose[0]!r}); move them into "
            f"one sub-folder per class."
            if loose
            else ""
        )
        raise DataError(
            f"No images found in the class folders of root. Received: root={root_path!r} with "
            f"class folders {classes[:10]}; extensions looked for: "
            f"{', '.join(IMAGE_EXTENSIONS)} (any case).{hint} Lay the folder out as "
            f"root/<class>/<image>.jpg."
        )
    return paths, labels


def check_size(size: Sequence[int]) -> tuple[int, int]:
    """Validate an image ``(height, width)`` and return it as a tuple of two ints."""
    if (
        not isinstance(size, tuple | list)
        or len(size) != 2
        or not all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in size)
    ):
        raise ArgumentTypeError(
            f"size must be a (height, width) pair of ints. Received: size={size!r}."
        )
    height, width = int(size[0]), int(size[1])
    if height <= 0 or width <= 0:
        raise ArgumentError(f"size must be positive. Received: size={size!r}.")
    return height, width


def channels_of_image(file: IO[bytes], source: str | None = None) -> int:
    """The channels an image is stored with: 1 for a grey image, 3 for anything in colour.

    Only the image's header is read (Pillow opens lazily), so this is cheap on the client.

    Parameters
    ----------
    file : binary file
        The image (JPEG, PNG, BMP, GIF ...).
    source : str, optional
        Where the image came from, named in errors.

    Returns
    -------
    int
        1 or 3.
    """
    from PIL import Image

    try:
        with Image.open(file) as img:
            mode = img.mode
            if mode == "P":  # a palette: grey when every palette entry is
                palette = img.getpalette() or []
                triples = zip(palette[0::3], palette[1::3], palette[2::3], strict=False)
                return 1 if all(r == g == b for r, g, b in triples) else 3
    except Exception as e:  # Pillow raises many types for bad files; all mean the same here
        where = f" {source!r}" if source else ""
        raise DataError(
            f"Cannot read the image{where} to find its channels: {type(e).__name__}: {e}. "
            f"Pass channels=1 (grey) or channels=3 (RGB), or replace that file."
        ) from e
    return 1 if mode in _GREY_MODES else 3


def decode_image(
    data: bytes, size: tuple[int, int], channels: int = 3, source: str | None = None
) -> np.ndarray:
    """Decode one image file into a uint8 array of a fixed size.

    Parameters
    ----------
    data : bytes
        The content of a JPEG, PNG, BMP or GIF file (the first frame of an animation).
    size : tuple of int
        ``(height, width)`` of the result, as Keras' ``image_size``; resized bilinearly
        without keeping the aspect ratio, as Keras does by default.
    channels : {1, 3, 4}
        Grayscale (``L``), ``RGB`` or ``RGBA``.
    source : str, optional
        Where the bytes came from (a path or a shard member), named in errors.

    Returns
    -------
    numpy.ndarray
        uint8 of shape ``(height, width, channels)``.

    Raises
    ------
    DataError
        When the bytes are not a readable image.
    """
    from PIL import Image

    if not isinstance(data, bytes | bytearray | memoryview):
        raise ArgumentTypeError(f"data must be bytes. Received: {type(data).__name__}.")
    height, width = check_size(size)
    mode = _MODES.get(channels) if not isinstance(channels, bool) else None
    if mode is None:
        raise ArgumentError(f"channels must be 1, 3 or 4. Received: channels={channels!r}.")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            converted: Any = img.convert(mode)
            if converted.size != (width, height):
                converted = converted.resize((width, height), Image.Resampling.BILINEAR)
            array = np.asarray(converted, dtype=np.uint8)
    except Exception as e:  # Pillow raises many types for bad files; all mean the same here
        where = f" from {source!r}" if source else ""
        raise DataError(
            f"Cannot decode the image{where}: {type(e).__name__}: {e}. Received: "
            f"{len(data)} bytes starting {bytes(data[:8])!r}. Replace or remove that file."
        ) from e
    return array.reshape(height, width, channels)
