"""WebDataset-style tar shards: brace patterns, samples grouped by key, images and labels.

A shard is a tar file whose members are grouped into samples by key: ``0001.jpg`` and
``0001.cls`` are the image and the label of sample ``0001`` (the key is the member path up to
the first dot of its base name, the extension everything after it, lower-cased). Shard lists
are written as brace patterns, ``shard-{0000..0147}.tar``.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import tarfile
from collections.abc import Sequence

import numpy as np

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError
from dvml.preprocess.images import check_size, decode_image

__all__ = ["expand_braces", "read_tar_samples", "samples_to_images_labels"]

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


def read_tar_samples(path: str) -> list[tuple[str, dict[str, bytes]]]:
    """Read a tar shard and group its members into samples by key.

    Parameters
    ----------
    path : str
        A ``.tar`` file (compressed tars are read too).

    Returns
    -------
    list of (str, dict of str to bytes)
        ``(key, {ext: content})`` in order of first appearance. Members without an extension,
        hidden members (base name starting with ``.``) and non-files are skipped.

    Raises
    ------
    DataError
        When the file is not a readable tar, or a sample has the same extension twice.
    OSError
        When the file cannot be opened (for example FileNotFoundError).
    """
    samples: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
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


def _require(sample: dict[str, bytes], exts: Sequence[str], key: str, role: str, where: str) -> str:
    for ext in exts:
        if ext.lower() in sample:
            return ext.lower()
    raise DataError(
        f"Sample {key!r}{where} has no {role}. Received: extensions {sorted(sample)}; looked "
        f"for {list(exts)}. Add the file, or pass {role}_ext= with the extension the shards use."
    )


def samples_to_images_labels(
    samples: Sequence[tuple[str, dict[str, bytes]]],
    size: tuple[int, int],
    image_ext: Sequence[str] = ("jpg", "jpeg", "png"),
    label_ext: Sequence[str] = ("cls", "label", "txt"),
    channels: int = 3,
    source: str | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Decode the images of shard samples and read their labels.

    Parameters
    ----------
    samples : sequence of (key, dict of ext to bytes)
        As :func:`read_tar_samples` returns them.
    size : tuple of int
        ``(height, width)`` of every image.
    image_ext, label_ext : sequence of str
        Extensions tried in order for the image and for the label (UTF-8 text, stripped).
    channels : {1, 3, 4}
    source : str, optional
        The shard path, named in errors.

    Returns
    -------
    images : numpy.ndarray
        uint8 of shape ``(n, height, width, channels)``.
    labels : list of str

    Raises
    ------
    DataError
        For a sample without an image or a label, an empty or non-UTF-8 label, or an image
        that does not decode.
    """
    height, width = check_size(size)
    if channels not in (1, 3, 4) or isinstance(channels, bool):
        raise ArgumentError(f"channels must be 1, 3 or 4. Received: channels={channels!r}.")
    images = np.empty((len(samples), height, width, channels), dtype=np.uint8)
    labels: list[str] = []
    where = f" in {source!r}" if source else ""
    for i, (key, sample) in enumerate(samples):
        img_ext = _require(sample, image_ext, key, "image", where)
        lab_ext = _require(sample, label_ext, key, "label", where)
        member = f"{key}.{img_ext}"
        images[i] = decode_image(
            sample[img_ext],
            (height, width),
            channels,
            source=f"{source}:{member}" if source else member,
        )
        try:
            label = sample[lab_ext].decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise DataError(
                f"The label of sample {key!r}{where} is not UTF-8 text. Received: "
                f"{sample[lab_ext][:20]!r}. Write labels as text, for example b'3'."
            ) from e
        if not label:
            raise DataError(
                f"The label of sample {key!r}{where} is empty. Received: "
                f"{sample[lab_ext]!r}. Write the class into the .{lab_ext} file."
            )
        labels.append(label)
    return images, labels
