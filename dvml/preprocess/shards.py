"""WebDataset-style tar shards: brace patterns, samples grouped by key, images and labels.

A shard is a tar file whose members are grouped into samples by key: ``0001.jpg`` and
``0001.cls`` are the image and the label of sample ``0001`` (the key is the member path up to
the first dot of its base name, the extension everything after it, lower-cased). Shard lists
are written as brace patterns, ``shard-{0000..0147}.tar`` (globs, lists and webdataset's
``shard-%06d.tar`` are expanded by :mod:`dvml.preprocess.locations`).

The conventions are webdataset's: a sample's image is its one member with an image extension
(``image_ext=`` picks one when there are several), its label the ``cls`` member decoded as an
int (``label_ext=`` names another; ``txt`` is a caption, read as a label only when asked).
"""

from __future__ import annotations

import itertools
import posixpath
import re
import tarfile
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError
from dvml.preprocess.images import check_size, decode_image

__all__ = [
    "IMAGE_SUFFIXES",
    "INT_LABEL_EXTENSIONS",
    "SHARD_SUFFIXES",
    "expand_braces",
    "first_image_member",
    "read_tar_samples",
    "sample_ids",
    "samples_to_images_labels",
    "shard_names",
]

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# What Pillow decodes; a member whose LAST extension is one of these is an image (webdataset
# decodes "seg.png" as an image too).
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "bmp", "gif", "ppm", "pgm", "pbm", "pnm", "tif",
                  "tiff", "webp")  # fmt: skip
# webdataset's basichandlers decode these as int; "txt" is a caption (a str), never a label.
INT_LABEL_EXTENSIONS = ("cls", "cls2", "class", "count", "index", "inx", "id")

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Expand a brace pattern into the list of names it stands for.

    Parameters
    ----------
    pattern : str
        Text with any number of brace groups: ranges ``{0000..0147}`` (zero padding kept,
        descending allowed) and alternatives ``{train,val}`` (which may nest groups).

    Returns
    -------
    list of str
        In order, the leftmost group varying slowest; ``[pattern]`` without braces.

    Raises
    ------
    ArgumentTypeError
        When ``pattern`` is not a string.
    ArgumentError
        For unbalanced braces, an empty group, or a group that is neither a range of integers
        nor a comma list.
    """
    if not isinstance(pattern, str):
        raise ArgumentTypeError(f"pattern must be a str. Received: {type(pattern).__name__}.")
    return _expand(pattern, pattern)


def _expand(text: str, pattern: str) -> list[str]:
    parts: list[list[str]] = []
    literal_start = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char == "}":
            raise ArgumentError(_brace_error(pattern, "a '}' without its '{'"))
        if char != "{":
            i += 1
            continue
        end = _matching_brace(text, i, pattern)
        parts.append([text[literal_start:i]])
        parts.append(_expand_group(text[i + 1 : end], pattern))
        i = literal_start = end + 1
    parts.append([text[literal_start:]])
    return ["".join(combo) for combo in itertools.product(*parts)]


def _matching_brace(text: str, start: int, pattern: str) -> int:
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise ArgumentError(_brace_error(pattern, "a '{' without its '}'"))


def shard_names(paths: Sequence[str]) -> list[str]:
    """The file names of ``paths`` (local paths or URLs), which prefix the ids of their samples
    (:func:`sample_ids`), checked to be distinct.

    Raises
    ------
    ArgumentError
        Two shards share a file name (``a/shard-0.tar`` and ``b/shard-0.tar``): the ids of
        their samples could repeat.
    """
    names = [posixpath.basename(str(p).rstrip("/")) for p in paths]
    seen: dict[str, str] = {}
    for path, name in zip(paths, names, strict=True):
        if name in seen:
            raise ArgumentError(
                "Two shards share a file name, so the ids of their samples (file name/key) "
                f"could repeat. Received: {seen[name]!r} and {path!r}. Predict them in separate "
                "calls, or rename one of them."
            )
        seen[name] = path
    return names


def sample_ids(shard_name: str, keys: Sequence[str]) -> list[str]:
    """The ids of a shard's samples: ``"<shard file name>/<key>"`` (``"shard-000003.tar/0042"``).

    webdataset's keys are per shard (``ShardWriter`` numbers samples from 0 in every shard,
    and the same key in two shards is two samples), so the key alone is not an id; the file
    name makes it unique across the shards of one call and stable from call to call."""
    return [f"{shard_name}/{key}" for key in keys]


def _split_top_level(body: str) -> list[str]:
    pieces, depth, start = [], 0, 0
    for j, char in enumerate(body):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(body[start:j])
            start = j + 1
    pieces.append(body[start:])
    return pieces


def _expand_group(body: str, pattern: str) -> list[str]:
    if not body:
        raise ArgumentError(_brace_error(pattern, "an empty group '{}'"))
    alternatives = _split_top_level(body)
    if len(alternatives) > 1:
        return [name for alt in alternatives for name in _expand(alt, pattern)]
    match = _RANGE.match(body)
    if match is None:
        raise ArgumentError(
            _brace_error(
                pattern,
                f"the group {{{body}}} is neither a range like {{0..9}} nor a "
                "comma list like {a,b}",
            )
        )
    first, last = match.group(1), match.group(2)
    width = max(len(first.lstrip("-")), len(last.lstrip("-")))
    padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in (first, last))
    lo, hi = int(first), int(last)
    step = 1 if hi >= lo else -1
    return [_format(n, width if padded else 0) for n in range(lo, hi + step, step)]


def _format(n: int, width: int) -> str:
    return f"-{abs(n):0{width}d}" if n < 0 else f"{n:0{width}d}"


def _brace_error(pattern: str, what: str) -> str:
    return (
        f"Malformed brace pattern: {what}. Received: pattern={pattern!r}. Write ranges as "
        f"shard-{{0000..0147}}.tar and alternatives as {{train,val}}."
    )


def _key_and_ext(member_name: str) -> tuple[str, str] | None:
    # Shards made with `tar cf shard.tar .` name their members "./0001.jpg".
    while member_name.startswith("./"):
        member_name = member_name[2:]
    directory, base = posixpath.split(member_name)
    if base.startswith(".") or "." not in base:
        return None
    stem, ext = base.split(".", 1)
    return posixpath.join(directory, stem), ext.lower()


def read_tar_samples(
    path: str, fileobj: IO[bytes] | None = None
) -> list[tuple[str, dict[str, bytes]]]:
    """Read a tar shard and group its members into samples by key.

    Parameters
    ----------
    path : str
        A ``.tar``, ``.tar.gz`` or ``.tgz`` file; named in errors when ``fileobj`` is given.
    fileobj : binary file, optional
        The shard's content, read as a stream (a remote object need not be seekable).

    Returns
    -------
    list of (str, dict of str to bytes)
        ``(key, {ext: content})`` in order of first appearance. The key is the member's path
        up to the FIRST dot of its base name (webdataset's grouping), the extension the rest.
        Members without an extension, hidden members (base name starting with ``.``) and
        non-files are skipped.

    Raises
    ------
    DataError
        When the file is not a readable tar, or a sample has the same extension twice.
    OSError
        When the file cannot be opened (for example FileNotFoundError).
    """
    samples: dict[str, dict[str, bytes]] = {}
    try:
        # A stream ("r|*") reads a remote object front to back, without seeking.
        args: dict[str, Any] = (
            {"fileobj": fileobj, "mode": "r|*"}
            if fileobj is not None
            else {"name": path, "mode": "r:*"}
        )
        with tarfile.open(**args) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                parsed = _key_and_ext(member.name)
                if parsed is None:
                    continue
                key, ext = parsed
                sample = samples.setdefault(key, {})
                if ext in sample:
                    raise DataError(
                        f"A sample of the shard holds the same extension twice. Received: key "
                        f"{key!r}, extension {ext!r} in {path!r}. Give each file of a sample "
                        f"its own extension."
                    )
                handle = tar.extractfile(member)
                sample[ext] = handle.read() if handle is not None else b""
    except (tarfile.TarError, EOFError) as e:
        raise DataError(
            f"Cannot read the tar shard: {type(e).__name__}: {e}. Received: path={path!r}. "
            f"Check that the file is a complete tar archive."
        ) from e
    return list(samples.items())


def first_image_member(
    fileobj: IO[bytes], path: str, image_ext: str | Sequence[str] | None = None
) -> bytes | None:
    """The content of the first image member of a shard, read as a stream up to it (not the
    whole shard); None when it holds no image. ``image_ext`` picks the image members, as for
    :func:`samples_to_images_labels`."""
    wanted = _as_exts(image_ext, "image_ext")
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for member in tar:
                parsed = _key_and_ext(member.name) if member.isfile() else None
                if parsed is None:
                    continue
                ext = parsed[1]
                if ext in wanted if wanted else ext.rsplit(".", 1)[-1] in IMAGE_SUFFIXES:
                    handle = tar.extractfile(member)
                    return handle.read() if handle is not None else b""
    except (tarfile.TarError, EOFError) as e:
        raise DataError(
            f"Cannot read the tar shard: {type(e).__name__}: {e}. Received: path={path!r}. "
            f"Check that the file is a complete tar archive."
        ) from e
    return None


def _as_exts(value: str | Sequence[str] | None, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else tuple(value)
    if not items or not all(isinstance(e, str) and e.strip(".") for e in items):
        raise ArgumentTypeError(
            f"{name} must be an extension or a list of them, such as 'jpg' or ['png', "
            f"'seg.png']. Received: {name}={value!r}."
        )
    return tuple(e.lower().lstrip(".") for e in items)


def _short(exts: Sequence[str], limit: int = 8) -> str:
    shown = sorted(exts)[:limit]
    more = f" and {len(exts) - limit} more" if len(exts) > limit else ""
    return f"{shown}{more}"


def _dotted_hint(key: str, exts: Sequence[str]) -> str:
    # "img.0001.jpg", "img.0002.jpg" ... all fall into the sample "img": the keys hold dots.
    if len(exts) > 2 and sum("." in e for e in exts) > len(exts) // 2:
        return (
            f" The shard's keys seem to hold dots: webdataset groups a sample's files by the "
            f"base name up to the FIRST dot, so {len(exts)} files fell into the sample "
            f"{key!r}. Rename the members without dots in the key (img_0001.jpg)."
        )
    return ""


def _image_ext(
    sample: dict[str, bytes], wanted: tuple[str, ...] | None, key: str, where: str
) -> str:
    if wanted is not None:
        found = [e for e in wanted if e in sample]
        if len(found) == 1:
            return found[0]
        what = "several of" if found else "none of"
        raise DataError(
            f"Sample {key!r}{where} holds {what} the image extensions asked for. Received: "
            f"extensions {_short(list(sample))}; image_ext={list(wanted)}. Pass image_ext= "
            f"with the one extension of the image to use.{_dotted_hint(key, list(sample))}"
        )
    found = [e for e in sample if e.rsplit(".", 1)[-1] in IMAGE_SUFFIXES]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(
            f"Sample {key!r}{where} has no image. Received: extensions {_short(list(sample))}; "
            f"images are members ending in {', '.join(IMAGE_SUFFIXES[:5])}, ... Add the image, "
            f"or pass image_ext= with the extension the shards use."
            f"{_dotted_hint(key, list(sample))}"
        )
    raise DataError(
        f"Sample {key!r}{where} holds several images: {_short(found)}. Pass image_ext= naming "
        f"the one to use, e.g. image_ext={sorted(found)[0]!r}.{_dotted_hint(key, list(sample))}"
    )


def _label(sample: dict[str, bytes], wanted: tuple[str, ...], key: str, where: str) -> int | str:
    ext = next((e for e in wanted if e in sample), None)
    if ext is None:
        caption = (
            " (a .txt member is a caption in webdataset, not a class)" if "txt" in sample else ""
        )
        raise DataError(
            f"Sample {key!r}{where} has no label. Received: extensions {_short(list(sample))}"
            f"{caption}; looked for {list(wanted)}. Add a .cls file with the class, or pass "
            f"label_ext= with the extension the shards use.{_dotted_hint(key, list(sample))}"
        )
    raw = sample[ext]
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise DataError(
            f"The label of sample {key!r}{where} is not UTF-8 text. Received: "
            f"{raw[:20]!r}. Write labels as text, for example b'3'."
        ) from e
    if not text:
        raise DataError(
            f"The label of sample {key!r}{where} is empty. Received: {raw!r}. Write the class "
            f"into the .{ext} file."
        )
    # webdataset decodes cls (and its kin) with int(); a class name there is kept as text.
    if ext.rsplit(".", 1)[-1] in INT_LABEL_EXTENSIONS and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return text


def samples_to_images_labels(
    samples: Sequence[tuple[str, dict[str, bytes]]],
    size: tuple[int, int],
    image_ext: str | Sequence[str] | None = None,
    label_ext: str | Sequence[str] = "cls",
    channels: int = 3,
    source: str | None = None,
    require_labels: bool = True,
) -> tuple[np.ndarray, list[Any]]:
    """Decode the images of shard samples and read their labels.

    Parameters
    ----------
    samples : sequence of (key, dict of ext to bytes)
        As :func:`read_tar_samples` returns them.
    size : tuple of int
        ``(height, width)`` of every image.
    image_ext : str or sequence of str, optional
        The extension of the image to use (or candidates, of which a sample must hold
        exactly one). Default: the sample's one member whose last extension is an image's
        (:data:`IMAGE_SUFFIXES`); a sample with several is refused.
    label_ext : str or sequence of str
        Extensions tried in order for the label. Default ``"cls"``. Labels of ``cls``,
        ``cls2``, ``class``, ``index``, ``id`` ... are ints when they are integers (as
        webdataset decodes them), text otherwise.
    channels : {1, 3, 4}
    source : str, optional
        The shard path, named in errors.
    require_labels : bool
        False for prediction: a sample without a label gets None.

    Returns
    -------
    images : numpy.ndarray
        uint8 of shape ``(n, height, width, channels)``.
    labels : list of int or str (or None)

    Raises
    ------
    DataError
        For a sample without an image or a label, with several candidate images, an empty or
        non-UTF-8 label, or an image that does not decode.
    """
    height, width = check_size(size)
    if channels not in (1, 3, 4) or isinstance(channels, bool):
        raise ArgumentError(f"channels must be 1, 3 or 4. Received: channels={channels!r}.")
    images_wanted = _as_exts(image_ext, "image_ext")
    labels_wanted = _as_exts(label_ext, "label_ext")
    if labels_wanted is None:
        raise ArgumentTypeError("label_ext must be an extension such as 'cls'. Received: None.")
    images = np.empty((len(samples), height, width, channels), dtype=np.uint8)
    labels: list[Any] = []
    where = f" in {source!r}" if source else ""
    for i, (key, sample) in enumerate(samples):
        img_ext = _image_ext(sample, images_wanted, key, where)
        if require_labels or any(e in sample for e in labels_wanted):
            labels.append(_label(sample, labels_wanted, key, where))
        else:
            labels.append(None)
        member = f"{key}.{img_ext}"
        images[i] = decode_image(
            sample[img_ext],
            (height, width),
            channels,
            source=f"{source}:{member}" if source else member,
        )
    return images, labels
