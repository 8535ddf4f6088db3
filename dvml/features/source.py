"""What a feature cache is computed from: a packed dataset, or raw images packed on the way.

:func:`plan_source` looks at the source WITHOUT doing any work: the shape of one image (to
check the backbone before anything runs), the preprocessing parameters and the identity of the
data, which both go into the cache key. A packed dataset is identified by its ``dataset_id``
(new whenever it is preprocessed again); raw arrays by Dask's token of their content; image
folders and tar shards (at a path or any fsspec URL, as :func:`dvml.training_preprocessor`
reads them) by the names, sizes and modification times (or ETags) of their files. Storage
options reach the workers that read the files but never the cache key or summary.

Raw sources are packed by :func:`dvml.training_preprocessor` into a dataset under
:data:`~dvml.preprocess.api.INTERNAL_PREFIX` (:func:`pack_source`), which the cache drops
once its features are published.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import TYPE_CHECKING, Any

from dvml.exceptions import ArgumentError, ArgumentTypeError, DataError, DatasetNotFoundError
from dvml.preprocess.api import training_preprocessor, validation_preprocessor
from dvml.preprocess.images import check_size
from dvml.preprocess.locations import Location, is_url, locate
from dvml.preprocess.sources import is_file_source
from dvml.store.datasets import Dataset, describe

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["PREPROCESS_KEYS", "SourcePlan", "pack_source", "plan_source"]

PREPROCESS_KEYS = (
    "y", "x", "buffer_size", "normalizing_const", "num_classes", "on_invalid", "image_size",
    "channels", "seed", "image_ext", "label_ext", "storage_options",
)  # fmt: skip
# How files are reached, not what they hold: never part of the cache key (it may hold secrets).
_ACCESS_KEYS = ("storage_options",)


@dataclasses.dataclass
class SourcePlan:
    """A source, described without running anything.

    Attributes
    ----------
    kind : {"dataset", "arrays", "images"}
    input_shape : list of int
        Shape of one image (the backbone's input).
    identity : dict
        What identifies the data, for the cache key.
    preprocessing : dict
        ``image_size``, ``channels``, ``normalizing_const`` (and, for raw sources, every
        preprocessing argument), for the cache key.
    dataset : Dataset or None
        The packed dataset (kind ``"dataset"``).
    raw : object
        The raw source to pack (other kinds).
    """

    kind: str
    description: str
    input_shape: list[int]
    identity: dict[str, Any]
    preprocessing: dict[str, Any]
    dataset: Dataset | None = None
    raw: Any = None
    preprocess_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def plan_source(source: Any, client: Client, preprocess_kwargs: dict[str, Any]) -> SourcePlan:
    """Describe ``source`` (see :func:`dvml.features.cache`) without running anything.

    Raises
    ------
    DatasetNotFoundError
        A dataset name that does not exist (dropped).
    ArgumentTypeError, ArgumentError, DataError
        A source of an unknown type, unknown preprocessing arguments, or data that cannot be
        one image per row.
    """
    unknown = sorted(set(preprocess_kwargs) - set(PREPROCESS_KEYS))
    if unknown:
        raise ArgumentTypeError(
            f"Unknown keyword arguments {unknown}. Received: {sorted(preprocess_kwargs)}. The "
            f"preprocessing arguments a raw source takes are {list(PREPROCESS_KEYS)}."
        )
    if isinstance(source, Dataset):
        return _dataset(source.name, client, preprocess_kwargs)
    if _names_files(source):
        where = locate(source, preprocess_kwargs.get("storage_options"))
        if where.kind not in ("images", "shards"):
            raise DataError(
                f"A feature cache is computed from images: a folder of class folders of images "
                f"or tar shards. Received: {where.spec!r}, which holds {where.kind} data. "
                "Preprocess tables with dvml.training_preprocessor instead."
            )
        return _images(where, source, preprocess_kwargs)
    if isinstance(source, str | os.PathLike):
        return _dataset(os.fspath(source), client, preprocess_kwargs)
    if isinstance(source, dict):
        return _arrays(source, preprocess_kwargs)
    raise ArgumentTypeError(
        "source must be a dataset (its name or a dvml.Dataset), a dict of image and label "
        "arrays, an image folder or a tar-shard pattern. Received: "
        f"{type(source).__name__}."
    )


def _names_files(source: Any) -> bool:
    """Whether ``source`` names files (a URL, a path, a pattern, a list) rather than a
    dataset (a name, which holds no ``/``)."""
    if not is_file_source(source):
        return False
    if not isinstance(source, str | os.PathLike):
        return True  # a list
    path = os.fspath(source)
    return is_url(path) or os.sep in path or "/" in path or os.path.exists(path)


def _dataset(name: str, client: Client, kwargs: dict[str, Any]) -> SourcePlan:
    if kwargs:
        raise ArgumentTypeError(
            f"Preprocessing arguments {sorted(kwargs)} apply to raw sources only; dataset "
            f"{name!r} is preprocessed already. Received: {sorted(kwargs)}."
        )
    # Always read the CURRENT dataset: a handle may be stale (dropped or replaced since).
    try:
        ds = describe(name, client)
    except DatasetNotFoundError as exc:
        if os.sep not in name:
            raise
        raise DatasetNotFoundError(
            f"{exc} {name!r} is not an existing folder either; for images, pass a folder laid "
            "out as root/<class>/<image> or a tar-shard pattern."
        ) from None
    s = ds.summary
    if len(s["x_shapes"]) != 1:
        raise DataError(
            f"Dataset {name!r} has {len(s['x_shapes'])} x inputs; a feature cache takes one "
            f"(the images). Received: x shapes {s['x_shapes']}."
        )
    if not isinstance(s["dependent_varname"], str):
        # featurize carries one label field (y) into the cache: the other outputs would be lost
        raise DataError(
            f"Dataset {name!r} has several label columns {s['dependent_varname']} (a "
            "multi-output dataset); a feature cache keeps one. Preprocess the images with the "
            "one label column the head predicts."
        )
    preprocessing = {
        "image_size": s.get("image_size"),
        "channels": s.get("channels"),
        "normalizing_const": s["normalizing_const"],
    }
    return SourcePlan(
        kind="dataset", description=name, input_shape=list(s["x_shapes"][0]),
        # the version too: an append keeps the dataset_id and adds rows (dvml.features.incremental)
        identity={"dataset_id": s["dataset_id"], "version": ds.version},
        preprocessing=preprocessing, dataset=ds,
    )  # fmt: skip


def _arrays(source: dict[str, Any], kwargs: dict[str, Any]) -> SourcePlan:
    import dask.array as da
    from dask.base import tokenize

    kwargs = {"x": "image", "y": "label", **kwargs}
    x, y = kwargs["x"], kwargs["y"]
    if not isinstance(x, str) or not isinstance(y, str):
        raise ArgumentTypeError(
            f"For a dict of arrays, x and y name one array each. Received: x={x!r}, y={y!r}."
        )
    missing = [k for k in (x, y) if k not in source]
    if missing:
        raise DataError(
            f"Arrays {missing} are missing from the source dict. Received: keys "
            f"{sorted(source)}. Pass x= and y= naming the image and label arrays."
        )
    images = da.asarray(source[x])
    if any(s != s for s in images.shape):  # unknown (nan) chunk sizes
        raise DataError(
            f"The image array {x!r} has unknown chunk sizes {images.shape}. Call "
            ".compute_chunk_sizes() on it first."
        )
    preprocessing = {k: kwargs.get(k) for k in PREPROCESS_KEYS}
    if preprocessing["normalizing_const"] is None:
        preprocessing["normalizing_const"] = 1.0
    token = tokenize(source[x], source[y])
    return SourcePlan(
        kind="arrays", description=f"arrays({x}, {y})", input_shape=list(images.shape[1:]),
        identity={"arrays": token}, preprocessing=preprocessing, raw=source,
        preprocess_kwargs=kwargs,
    )  # fmt: skip


def _files_token(where: Location) -> str:
    h = hashlib.sha256()
    for path, size, stamp in sorted(zip(where.paths, where.sizes, where.stamps, strict=True)):
        h.update(f"{path}\0{size}\0{stamp}\n".encode())
    return h.hexdigest()


def _images(where: Location, source: Any, kwargs: dict[str, Any]) -> SourcePlan:
    size = kwargs.get("image_size")
    if size is None:
        raise ArgumentError(
            f"image_size=(height, width) is required for an image source. Received: "
            f"image_size=None for {where.spec!r}."
        )
    height, width = check_size(size)
    channels = kwargs.get("channels", 3)
    preprocessing = {k: kwargs.get(k) for k in PREPROCESS_KEYS if k not in _ACCESS_KEYS}
    preprocessing.update(image_size=[height, width], channels=channels)
    if preprocessing["normalizing_const"] is None:
        preprocessing["normalizing_const"] = 1.0
    spec = where.spec if where.remote else os.path.abspath(where.spec)
    return SourcePlan(
        kind="images", description=where.spec, input_shape=[height, width, int(channels)],
        identity={"files": _files_token(where), "path": spec, "count": len(where.paths)},
        preprocessing=preprocessing,
        raw=os.fspath(source) if isinstance(source, os.PathLike) else source,
        preprocess_kwargs={**kwargs, "image_size": (height, width)},
    )  # fmt: skip


def pack_source(
    plan: SourcePlan,
    name: str,
    distribution_rules: Any,
    client: Client,
    training_cache: Dataset | None = None,
) -> Dataset:
    """Pack a raw source into the dataset ``name`` (replacing any leftover of that name).

    With ``training_cache``, the source is a validation set: it is packed with the class
    values, normalization, image size and placement of the images that cache was computed from.
    """
    if plan.dataset is not None:
        return plan.dataset
    if training_cache is None:
        # stored as any pack is (compact by default: uint8 pixels, a quarter of float32);
        # featurize normalizes each batch of raw pixels for the backbone
        return training_preprocessor(
            plan.raw, distribution_rules=distribution_rules or "all_workers", name=name,
            overwrite=True, client=client, **plan.preprocess_kwargs,
        )  # fmt: skip
    s = training_cache.summary
    # The images' side of the training cache, as validation_preprocessor reads a training set.
    images = dataclasses.replace(training_cache, summary={
        **s, "normalizing_const": s["source_normalizing_const"],
        "image_size": s["source_image_size"], "channels": s["source_channels"],
        "x_shapes": [plan.input_shape],
    })  # fmt: skip
    kwargs = {k: v for k, v in plan.preprocess_kwargs.items()
              if k in ("y", "x", "buffer_size", "on_invalid", "seed", "storage_options",
                       "image_ext", "label_ext")}  # fmt: skip
    return validation_preprocessor(
        plan.raw, training=images, distribution_rules=distribution_rules, name=name,
        overwrite=True, client=client, **kwargs,
    )  # fmt: skip
