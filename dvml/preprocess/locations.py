"""Where data lives: local paths and fsspec URLs, listed and told apart by their content.

A *location* is what a user writes for data that sits in files: a path or any fsspec URL
(``s3://``, ``gs://``, ``az://``, ``https://``, ``file://``), a glob, a brace pattern
(``shard-{0000..0147}.tar``), webdataset's ``ShardWriter`` pattern (``shard-%06d.tar``) or a
list of them. :func:`locate` lists the files (names and sizes only, on the client) and says
what they hold:

- ``parquet``: Parquet files, or a Parquet data set directory (hive partitions ``key=value/``
  included; their columns are kept);
- ``csv``: CSV files, or a folder of them;
- ``shards``: WebDataset tar shards (``.tar``, ``.tar.gz``, ``.tgz``);
- ``images``: a folder of class folders of images (``root/<class>/<image>.jpg``; other files
  beside the images are ignored, as Keras does).

The data itself is read by the Dask tasks on the workers, each opening its own files with the
same ``storage_options`` (:func:`read_bytes`, :func:`open_binary`): no bulk data passes
through the client. Errors of the store (a wrong key, a missing bucket) become a
:class:`~dvml.exceptions.DataError` that says which (:func:`store_error`).

An S3 store that stops answering (it died, or the network to it did) is bounded by
``dvml.storage-timeout`` (seconds, :func:`bounded_options`): each request waits that long at
most to connect or for the next bytes, and a refused connection is not retried with
backoff, so the first read that fails fails the call, naming the URL and the timeout.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from dvml.exceptions import ArgumentTypeError, DataError
from dvml.preprocess.images import IMAGE_EXTENSIONS
from dvml.preprocess.shards import SHARD_SUFFIXES, expand_braces

__all__ = [
    "TABLE_KINDS",
    "Location",
    "bounded_options",
    "hive_partitions",
    "is_url",
    "locate",
    "missing_credentials",
    "open_binary",
    "read_bytes",
    "read_table",
    "store_error",
]

TABLE_KINDS = ("parquet", "csv")
_PARQUET = (".parquet", ".pq", ".parq")
_CSV = (".csv", ".csv.gz", ".csv.bz2", ".csv.zst")
_GLOB_CHARS = "*?["
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
             "abfs": "adlfs", "abfss": "adlfs"}  # fmt: skip
_PRINTF = re.compile(r"%(0?)(\d*)d")
_KINDS_READ = (
    "a Parquet file or data set (hive partitions allowed), CSV files or a folder of them, "
    "WebDataset tar shards (.tar, .tar.gz, .tgz), or a folder of class folders of images "
    "(root/<class>/<image>.jpg)"
)


@dataclasses.dataclass(frozen=True)
class Location:
    """Files a source names, and what they hold.

    Attributes
    ----------
    kind : {"parquet", "csv", "shards", "images"}
    spec : str
        As given (a list is joined with ``", "``).
    paths : list of str
        Every file, sorted (shards: in the order given): local paths, or URLs with their
        protocol for a remote store.
    root : str or None
        The directory given, when one was (a Parquet data set is read from it, so that hive
        partition columns are kept).
    labels : list of str
        For ``images``: the class folder of each path.
    storage_options : dict
        Passed to fsspec wherever these files are opened.
    sizes : list of int
        Bytes of each path (for fingerprints and plans).
    stamps : list of str
        What changes when a file is replaced: its modification time or ETag.
    """

    kind: str
    spec: str
    paths: list[str]
    root: str | None = None
    labels: list[str] = dataclasses.field(default_factory=list)
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    sizes: list[int] = dataclasses.field(default_factory=list)
    stamps: list[str] = dataclasses.field(default_factory=list)

    @property
    def remote(self) -> bool:
        return any(is_url(p) for p in self.paths)


def is_url(path: str) -> bool:
    """Whether ``path`` names a store other than the local file system (``s3://...``).

    ``file://`` URLs and plain paths are local.
    """
    head, sep, _ = path.partition("://")
    return bool(sep) and head.lower() not in ("file", "local") and "/" not in head


def hive_partitions(path: str) -> dict[str, Any]:
    """The hive partition values a file's path names (``.../label=3/part-0.parquet`` ->
    ``{"label": 3}``), as pyarrow reads a list of files: every ``key=value`` directory of
    the path, values URI-decoded, whole numbers as ``int`` (pure).

    A file read on its own (pandas) has none of these columns; a Dask read of the same
    files has them, so checks of single files add them to agree with what is packed.
    """
    from urllib.parse import unquote

    out: dict[str, Any] = {}
    for part in path.replace("\\", "/").split("/")[:-1]:
        key, sep, value = part.partition("=")
        if not sep or not key:
            continue
        text = unquote(value)
        out[unquote(key)] = int(text) if re.fullmatch(r"-?\d+", text) else text
    return out


def _local(path: str) -> str:
    for prefix in ("file://", "local://"):
        if path.lower().startswith(prefix):
            return path[len(prefix) :]
    return path


_S3_SCHEMES = ("s3", "s3a")
# A store that does not answer: botocore's, aiohttp's and the socket's words for it.
_UNREACHABLE = re.compile(
    r"EndpointConnectionError|ConnectTimeout|ReadTimeout|ConnectionClosed|ConnectionRefused|"
    r"ClientConnectorError|ServerDisconnected|Could not connect to the endpoint"
)


def bounded_options(
    specs: Sequence[str], storage_options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``storage_options`` with the ``dvml.storage-timeout`` bound where ``specs`` name S3 URLs.

    s3fs passes ``config_kwargs`` to botocore: ``connect_timeout`` and ``read_timeout`` (the
    longest wait to connect, or for the next bytes, of one request) and ``retries`` (one
    attempt: botocore's default retries a refused connection 4 times with backoff, s3fs
    still retries a timed-out request). Keys the caller gave win. The options travel to the
    workers with the read tasks, so the workers' reads are bounded too."""
    from dvml import config

    options = dict(storage_options or {})
    if not any(str(s).partition("://")[0].lower() in _S3_SCHEMES for s in specs):
        return options
    timeout = float(config.get("storage-timeout"))
    bounds = {"connect_timeout": timeout, "read_timeout": timeout,
              "retries": {"max_attempts": 1, "mode": "standard"}}  # fmt: skip
    options["config_kwargs"] = {**bounds, **dict(options.get("config_kwargs") or {})}
    return options


def _filesystem(path: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The fsspec file system of ``path`` and the path inside it."""
    from fsspec.core import url_to_fs

    try:
        return url_to_fs(path, **dict(storage_options or {}))
    except ImportError as e:
        scheme = path.partition("://")[0]
        package = _PACKAGES.get(scheme, "its fsspec package")
        raise DataError(
            f"Reading {scheme}:// URLs needs {package}, which is not installed: {e}. Received: "
            f"{path!r}. Install it on the client and on every worker (pip install {package}"
            f"{' or dvml[s3]' if package == 's3fs' else ''})."
        ) from e
    except (ValueError, TypeError) as e:
        raise DataError(
            f"Cannot open a file system for {path!r}: {type(e).__name__}: {e}. Received: "
            f"storage_options keys {sorted(storage_options or {})}. Check the URL and the "
            "storage options your store's fsspec implementation takes."
        ) from e


def _full(fs: Any, path: str, remote: bool) -> str:
    return fs.unstrip_protocol(path) if remote else path


def store_error(
    exc: BaseException, path: str, storage_options: Mapping[str, Any] | None
) -> DataError:
    """A :class:`DataError` that says what the store's error means for ``path``.

    A refused request names the credentials; a missing bucket names the bucket; a missing
    object names the object.
    """
    keys = sorted(storage_options or {})
    cause = f"{type(exc).__name__}: {exc}"
    chained = exc.__cause__ or exc.__context__
    text = f"{type(exc).__name__} {exc} {type(chained).__name__} {chained or ''}"
    where = f"Received: {path!r} with storage_options keys {keys}"
    if missing_credentials(exc):
        return DataError(
            f"No credentials were found to read {path!r} ({cause}). {where}. Pass "
            "storage_options={'key': ..., 'secret': ...} (for job files, the "
            "dvml.storage-options configuration), or set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) where the client and every worker run; "
            "storage_options={'anon': True} reads a public bucket."
        )
    if _UNREACHABLE.search(text):
        bound = dict((storage_options or {}).get("config_kwargs") or {}).get("read_timeout")
        within = f" within {bound:g} s (dvml.storage-timeout)" if bound else ""
        return DataError(
            f"The store of {path!r} did not answer{within}: {cause}. It stopped, or the "
            f"network to it did; nothing was published. {where}. Check that the store is up "
            "and reachable at its endpoint (storage_options={'client_kwargs': "
            "{'endpoint_url': ...}}), then run the call again; raise dvml.storage-timeout "
            "for a store that is slow to answer."
        )
    if isinstance(exc, PermissionError) or re.search(
        r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|Forbidden|\b403\b", text
    ):
        return DataError(
            f"The store refused access to the data ({cause}): the credentials are wrong, "
            f"missing, or not allowed to read it. {where}. Pass storage_options= with a key "
            "and secret that may read it (for job files, the dvml.storage-options "
            "configuration), or set the store's usual environment variables."
        )
    if re.search(r"NoSuchBucket|bucket does not exist", text, re.IGNORECASE):
        bucket = path.partition("://")[2].split("/", 1)[0]
        return DataError(
            f"The bucket {bucket!r} does not exist ({cause}). {where}. Check the bucket name "
            "and the store's endpoint (storage_options={'client_kwargs': {'endpoint_url': "
            "...}} for an S3-compatible server)."
        )
    if isinstance(exc, FileNotFoundError):
        return DataError(
            f"No file or object matches the source: {cause}. {where}. Check the path; "
            "globs (*), brace patterns ({0000..0147}) and shard patterns (%06d) are expanded."
        )
    return DataError(
        f"Cannot read the source from its store: {cause}. {where}. Check the URL, the network "
        "and storage_options."
    )


# The stores' own "no credentials" errors, which are not OSError (botocore's come through
# s3fs unchanged; google-auth's through gcsfs). By name: those packages are optional.
_NO_CREDENTIALS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"}
)


def missing_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it chains) says the store found no credentials to sign with."""
    seen: BaseException | None = exc
    for _ in range(4):  # a short chain: s3fs/fsspec wrap at most a few times
        if seen is None:
            return False
        if any(c.__name__ in _NO_CREDENTIALS for c in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextmanager
def _store_errors(path: str, storage_options: Mapping[str, Any] | None) -> Iterator[None]:
    try:
        yield
    except DataError:
        raise
    except OSError as e:
        raise store_error(e, path, storage_options) from e
    except Exception as e:
        # botocore's EndpointConnectionError and NoCredentialsError are no OSError: a store
        # that died, and missing credentials, are named too
        if missing_credentials(e):
            raise store_error(e, path, storage_options) from e
        if _UNREACHABLE.search(type(e).__name__):
            raise store_error(e, path, storage_options) from None
        raise


def _suffix_kind(name: str) -> str | None:
    lower = name.lower()
    if lower.endswith(SHARD_SUFFIXES):
        return "shards"
    if lower.endswith(_PARQUET):
        return "parquet"
    if lower.endswith(_CSV):
        return "csv"
    if lower.endswith(IMAGE_EXTENSIONS):
        return "images"
    return None


def _hidden(relative: str) -> bool:
    # Spark and pyarrow write _SUCCESS, _metadata and _common_metadata beside the data files;
    # editors and macOS leave dot files.
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _printf_regex(pattern: str) -> tuple[str, re.Pattern[str]] | None:
    """webdataset's ``shard-%06d.tar``: a glob that lists candidates and a regex that keeps
    the names the pattern can write."""
    if not _PRINTF.search(pattern):
        return None
    glob_parts, regex_parts, last = [], [], 0
    for m in _PRINTF.finditer(pattern):
        literal = pattern[last : m.start()]
        glob_parts.append(literal)
        regex_parts.append(re.escape(literal))
        width = int(m.group(2) or 0)
        glob_parts.append("*")
        regex_parts.append(
            rf"\d{{{width}}}" if m.group(1) and width else rf"\d{{{max(width, 1)},}}"
        )
        last = m.end()
    glob_parts.append(pattern[last:])
    regex_parts.append(re.escape(pattern[last:]))
    return "".join(glob_parts), re.compile("".join(regex_parts) + r"\Z")


def _expand(fs: Any, path: str, spec: str) -> list[str] | None:
    """The files a pattern names (None when ``path`` is no pattern): braces first, then
    ``%06d``, then globs, each sorted."""
    if "{" in path:
        out = []
        for name in expand_braces(path):
            out.extend(_expand(fs, name, spec) or [name])
        return out
    printf = _printf_regex(path)
    if printf is not None:
        glob, regex = printf
        return sorted(p for p in _glob_files(fs, glob) if regex.match(p))
    if any(c in path for c in _GLOB_CHARS):
        return sorted(_glob_files(fs, path))
    return None


def _glob_files(fs: Any, pattern: str) -> list[str]:
    # One listing with details, not one request per match to tell files from directories.
    found = fs.glob(pattern, detail=True)
    return [name for name, info in found.items() if info.get("type") != "directory"]


def locate(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
    key: str = "source",
) -> Location:
    """List the files of ``source`` and tell what they hold (names and sizes only).

    Parameters
    ----------
    source : str, path-like, or list of them
        A path or fsspec URL; a glob; a brace pattern; webdataset's ``%06d`` shard pattern;
        or a list of files (all shards, or all tables of one format).
    storage_options : dict, optional
        For fsspec (``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}``).
    key : str
        How errors name the source (``"data.source"`` in a job file).

    Returns
    -------
    Location

    Raises
    ------
    DataError
        Nothing matches; the store refuses access or has no such bucket; or the files are of
        a kind dvml cannot read (the message lists what was found).
    """
    if isinstance(source, str | os.PathLike):
        specs = [os.fspath(source)]
    elif (
        isinstance(source, Sequence)
        and source
        and all(isinstance(s, str | os.PathLike) for s in source)
    ):
        specs = [os.fspath(s) for s in source]
    else:
        raise ArgumentTypeError(
            f"{key} must be a path, a URL, a pattern or a non-empty list of them. Received: "
            f"{source!r}."
        )
    options = bounded_options(specs, storage_options)
    spec_text = ", ".join(specs)
    if len(specs) == 1:
        found = _locate_one(specs[0], options, key)
        return dataclasses.replace(found, spec=spec_text)
    parts = [_locate_one(s, options, key) for s in specs]
    kinds = sorted({p.kind for p in parts})
    if len(kinds) != 1 or kinds[0] == "images":
        raise DataError(
            f"A list of sources must name files of one kind (tar shards, Parquet or CSV). "
            f"Received: {key}={specs[:5]}{'...' if len(specs) > 5 else ''}, which hold {kinds}."
        )
    return Location(
        kind=kinds[0], spec=spec_text, paths=[p for part in parts for p in part.paths],
        storage_options=options, sizes=[s for part in parts for s in part.sizes],
        stamps=[s for part in parts for s in part.stamps],
    )  # fmt: skip


def _stamp(info: Mapping[str, Any]) -> str:
    for name in ("ETag", "etag", "mtime", "LastModified", "updated", "last_modified", "created"):
        if info.get(name) is not None:
            return str(info[name])
    return ""


def _locate_one(spec: str, options: dict[str, Any], key: str) -> Location:
    path = _local(os.path.expanduser(spec))
    remote = is_url(path)
    fs, inner = _filesystem(path, options)
    with _store_errors(spec, options):
        expanded = _expand(fs, inner, spec)
        if expanded is not None:
            if not expanded:
                raise DataError(
                    f"Nothing matches the pattern. Received: {key}={spec!r}. Check the path; "
                    "the pattern is expanded as a brace pattern, a %06d shard pattern or a glob."
                )
            infos = _infos(fs, expanded, spec, key)
            names = [_full(fs, i["name"], remote) for i in infos]
            kind = _files_kind(names, spec, key)
            return Location(kind, spec, names, storage_options=options,
                            sizes=[int(i.get("size") or 0) for i in infos],
                            stamps=[_stamp(i) for i in infos])  # fmt: skip
        try:
            info = fs.info(inner)
        except FileNotFoundError as e:
            raise store_error(e, spec, options) from e
        if info.get("type") != "directory":
            name = _full(fs, info["name"], remote)
            kind = _files_kind([name], spec, key)
            return Location(kind, spec, [name], storage_options=options,
                            sizes=[int(info.get("size") or 0)], stamps=[_stamp(info)])  # fmt: skip
        return _directory(fs, inner, spec, options, key, remote)


def _infos(fs: Any, paths: list[str], spec: str, key: str) -> list[dict[str, Any]]:
    infos = []
    missing = []
    for p in paths:
        try:
            infos.append(fs.info(p))
        except FileNotFoundError as e:
            if "bucket" in str(e).lower():
                raise
            missing.append(p)
    if missing:
        raise DataError(
            f"{len(missing)} of {len(paths)} files of the pattern do not exist, e.g. "
            f"{missing[0]!r}. Received: {key}={spec!r}. Check the pattern's range."
        )
    return infos


def _files_kind(names: list[str], spec: str, key: str) -> str:
    kinds = {_suffix_kind(n) for n in names}
    if len(kinds) == 1 and None not in kinds and "images" not in kinds:
        return kinds.pop()  # type: ignore[return-value]
    raise DataError(
        f"Cannot tell the format of the source: dvml reads {_KINDS_READ}. Received: {key}="
        f"{spec!r}, which names {_found(names)}. Use those suffixes, or read the files "
        "yourself into a Dask DataFrame."
    )


def _found(names: Sequence[str]) -> str:
    """``"3 .json files, 1 .txt file"``: what a listing holds, most common first."""
    counts: dict[str, int] = {}
    for n in names:
        base = posixpath.basename(n)
        ext = "." + base.split(".", 1)[1].lower() if "." in base.lstrip(".") else "(no suffix)"
        counts[ext] = counts.get(ext, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{n} {ext} file{'s' if n > 1 else ''}" for ext, n in ordered[:6])
    return text + (f" and {len(ordered) - 6} other suffixes" if len(ordered) > 6 else "")


def _directory(
    fs: Any, inner: str, spec: str, options: dict[str, Any], key: str, remote: bool
) -> Location:
    listing = fs.find(inner, withdirs=False, detail=True)
    root = inner.rstrip("/")
    files = []
    for name, info in sorted(listing.items()):
        relative = name[len(root) :].lstrip("/")
        if relative and not _hidden(relative):
            files.append((relative, info))
    if not files:
        raise DataError(
            f"The source folder holds no data file (hidden and _-prefixed files are skipped). "
            f"Received: {key}={spec!r}. Put {_KINDS_READ} there."
        )
    kinds = {_suffix_kind(rel) for rel, _ in files}
    names = [_full(fs, info["name"], remote) for _, info in files]
    sizes = [int(info.get("size") or 0) for _, info in files]
    stamps = [_stamp(info) for _, info in files]
    full_root = _full(fs, root, remote)

    def location(kind: str, **extra: Any) -> Location:
        return Location(kind, spec, names, root=full_root, storage_options=options,
                        sizes=sizes, stamps=stamps, **extra)  # fmt: skip

    if kinds == {"parquet"}:
        return location("parquet")
    if kinds == {"csv"}:
        return location("csv")
    if kinds == {"shards"}:
        return location("shards")
    nested = [(rel, info) for rel, info in files if "/" in rel and _suffix_kind(rel) == "images"]
    if nested and not kinds & {"parquet", "csv", "shards"}:
        # As Keras' image_dataset_from_directory: other files (notes, labels.txt) are ignored.
        return Location(
            "images", spec, [_full(fs, info["name"], remote) for _, info in nested],
            root=full_root, labels=[rel.split("/", 1)[0] for rel, _ in nested],
            storage_options=options, sizes=[int(info.get("size") or 0) for _, info in nested],
            stamps=[_stamp(info) for _, info in nested],
        )  # fmt: skip
    loose = [rel for rel, _ in files if "/" not in rel and _suffix_kind(rel) == "images"]
    hint = (
        f" {len(loose)} image(s) lie directly in the folder (e.g. {loose[0]!r}): images go in "
        "one sub-folder per class."
        if loose
        else ""
    )
    raise DataError(
        f"Cannot tell what the source folder holds: dvml reads {_KINDS_READ}, one kind per "
        f"folder. Received: {key}={spec!r}, which holds {_found([r for r, _ in files])}.{hint} "
        "Point the source at the files of one kind (a glob or a list works too)."
    )


def read_table(location: Location) -> Any:
    """A Dask DataFrame of a ``parquet`` or ``csv`` location, read on the workers.

    A Parquet directory is read as a data set from its root, so that hive partition columns
    (``label=3/part-0.parquet``) are kept as columns.
    """
    import dask.dataframe as dd

    options = location.storage_options or None
    with _store_errors(location.spec, location.storage_options):
        if location.kind == "parquet":
            target: Any = location.root or location.paths
            return dd.read_parquet(target, storage_options=options)
        if location.kind == "csv":
            return dd.read_csv(location.paths, storage_options=options)
    raise DataError(
        f"Rows can only be read from Parquet or CSV files. Received: {location.spec!r}, which "
        f"holds {location.kind}."
    )


def read_bytes(
    paths: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> list[bytes]:
    """The contents of ``paths`` (runs on a worker): local files read directly, remote ones
    fetched concurrently in one call per store."""
    if not any(is_url(p) for p in paths):
        out = []
        for p in paths:
            with open(_local(p), "rb") as f:
                out.append(f.read())
        return out
    from fsspec.core import strip_protocol

    fs, _ = _filesystem(paths[0], storage_options)
    inner = [strip_protocol(p) for p in paths]
    with _store_errors(paths[0], storage_options):
        found = fs.cat(inner, on_error="raise")
    return [found[p] for p in inner]


@contextmanager
def open_binary(path: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A binary file object of ``path`` (local or remote), closed on exit; store errors are
    :class:`DataError`."""
    if not is_url(path):
        with open(_local(path), "rb") as f:
            yield f
        return
    fs, inner = _filesystem(path, storage_options)
    with _store_errors(path, storage_options), fs.open(inner, "rb") as f:
        yield f
