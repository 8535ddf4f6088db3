"""The model registry: architectures, trained models, their summaries and custom functions.

This package owns the registry database (SQLAlchemy 2; an SQLite file under ``~/.dvml`` by
default, any URL allowed): Keras architectures as JSON with optional initial weights, trained
models with their MADlib-style summary and per-iteration metrics, custom loss/metric
functions as Python source, and model selection tables (MADlib's ``mst_key``, ``model_id``,
``compile_params``, ``fit_params``; planned and checked by :mod:`dvml.train.model_selection`).
It never imports TensorFlow except to compile custom functions
(:meth:`Registry.load_custom_objects`). Training lives in :mod:`dvml.train`.

Weights are data, stored as ``.npz`` bytes and loaded without pickle. Custom functions are code
registered on purpose: whoever may write to the registry may run code where they are loaded.

The module-level functions use MADlib's names; each takes ``registry=`` (a :class:`Registry`,
a URL string, or None for the configured default).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dvml.deprecation import renamed
from dvml.registry.weights import weights_from_bytes, weights_to_bytes

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    from dvml.registry.database import Registry
    from dvml.registry.model_lineage import Lineage

# The database (SQLAlchemy, ~0.3 s to import) loads on first use: trainers import this
# package for the weights codec alone.


def __getattr__(name: str) -> Any:
    if name == "Registry":
        from dvml.registry.database import Registry

        return Registry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextmanager
def _opened(registry: Registry | str | None) -> Iterator[Registry]:
    """:func:`dvml.registry.database.opened_registry`, imported on first use."""
    from dvml.registry.database import opened_registry as opened

    with opened(registry) as reg:
        yield reg


__all__ = [
    "Registry",
    "describe_architecture",
    "describe_model",
    "drop_architecture",
    "drop_custom_function",
    "drop_model",
    "lineage",
    "list_architectures",
    "list_custom_functions",
    "list_models",
    "load_keras_model",
    "register_custom_function",
    "weights_from_bytes",
    "weights_to_bytes",
]


def load_keras_model(
    model_json: Any,
    weights: Sequence[npt.NDArray[Any]] | None = None,
    name: str | None = None,
    description: str | None = None,
    registry: Registry | str | None = None,
) -> int:
    """Add a Keras architecture to the registry (MADlib's ``load_keras_model``).

    Parameters
    ----------
    model_json : str or tf-keras model
        ``model.to_json()``, or the model itself: then its JSON is stored and, when
        ``weights`` is None, its current weights too (pass ``model.to_json()`` to store the
        architecture alone). A Keras 3 model (``from tensorflow.keras import ...`` without
        ``TF_USE_LEGACY_KERAS=1``) is converted to tf-keras' form, which the trainers use,
        when all its layers are common ones (Dense, convolutions, pooling, normalization,
        dropout, activations, reshaping, merging, Embedding, LSTM/GRU); otherwise it is
        refused here, by layer name, with how to build it with ``import tf_keras``.
    weights : list of numpy.ndarray, optional
        Initial weights, for example pre-trained ones.
    name, description : str, optional
    registry : Registry, str or None

    Returns
    -------
    int
        The architecture id, for fit's ``arch_id``.
    """
    if not isinstance(model_json, str) and callable(getattr(model_json, "to_json", None)):
        model = model_json
        model_json = model.to_json()
        if weights is None and callable(getattr(model, "get_weights", None)):
            weights = list(model.get_weights())
    with _opened(registry) as reg:
        return reg.add_architecture(model_json, weights, name=name, description=description)


def list_architectures(registry: Registry | str | None = None) -> pd.DataFrame:
    """The architectures in the registry, without JSON or weights.

    Parameters
    ----------
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Returns
    -------
    pandas.DataFrame
        One row per architecture.
    """
    with _opened(registry) as reg:
        return reg.list_architectures()


def describe_architecture(arch_id: int, registry: Registry | str | None = None) -> dict[str, Any]:
    """Everything stored about one architecture (:meth:`Registry.get_architecture`).

    Parameters
    ----------
    arch_id : int
        The architecture's id, as :func:`load_keras_model` returned it.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one (``dvml.registry.url``).

    Returns
    -------
    dict
        ``id``, ``name``, ``description``, ``model_json``, ``weights`` (a list of arrays or
        None), ``input_shapes``, ``output_shape``, ``created_at``.

    Raises
    ------
    RegistryNotFoundError
        When no architecture has this id.
    """
    with _opened(registry) as reg:
        return reg.get_architecture(arch_id)


def drop_architecture(arch_id: int, registry: Registry | str | None = None) -> None:
    """Remove an architecture from the registry; models trained from it stay.

    Parameters
    ----------
    arch_id : int
        The architecture's id.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Raises
    ------
    RegistryNotFoundError
        When no architecture has this id.
    """
    with _opened(registry) as reg:
        reg.drop_architecture(arch_id)


def list_models(registry: Registry | str | None = None) -> pd.DataFrame:
    """The trained models in the registry, without weights.

    Parameters
    ----------
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Returns
    -------
    pandas.DataFrame
        One row per model.
    """
    with _opened(registry) as reg:
        return reg.list_models()


def lineage(model: Any, registry: Registry | str | None = None) -> Lineage:
    """Which data, which preprocessing and which code trained ``model``.

    Parameters
    ----------
    model : str or dvml.Model
        The model (its name in the registry).
    registry : Registry or str, optional
        The registry (default: config ``dvml.registry.url``).

    Returns
    -------
    dvml.registry.model_lineage.Lineage
        The dataset versions it trained and validated on with their digests and sources
        (files, sizes, mtimes or ETags, preprocessing parameters), the code (dvml version,
        architecture id and content hash, compile/fit parameters), the model it warm-started
        from (``parent``, a chain) and its promotions by the retrain workflow. ``to_dict()``
        gives plain values.

    Raises
    ------
    RegistryNotFoundError
        When no model has that name.
    """
    from dvml.registry.model_lineage import from_summary

    name = model if isinstance(model, str) else getattr(model, "name", model)
    with _opened(registry) as reg:
        entry = reg.get_model(name)
    return from_summary(entry["name"], entry["version"], entry["summary"])


def describe_model(name: str, registry: Registry | str | None = None) -> dict[str, Any]:
    """Everything stored about one model (:meth:`Registry.get_model`).

    Parameters
    ----------
    name : str
        The model's name.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Returns
    -------
    dict
        ``id``, ``name``, ``arch_id``, ``version``, ``weights``, ``summary`` (MADlib's fit
        summary fields), ``created_at``, ``updated_at``.

    Raises
    ------
    RegistryNotFoundError
        When no model has this name.
    """
    with _opened(registry) as reg:
        return reg.get_model(name)


def drop_model(name: str, registry: Registry | str | None = None) -> None:
    """Remove a model and its iteration records, or a ``fit_multiple``/``automl`` run.

    Parameters
    ----------
    name : str
        A model's name, or a run's ``model_output``: then its info, summary and models go
        (MADlib's ``DROP TABLE x, x_info, x_summary``).
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Raises
    ------
    RegistryNotFoundError
        When no model or run has this name.
    """
    with _opened(registry) as reg:
        reg.drop_model(name)


def register_custom_function(
    name: str,
    source: str,
    kind: str = "loss",
    description: str | None = None,
    replace: bool = False,
    registry: Registry | str | None = None,
) -> int:
    """Register the source of ``def name(y_true, y_pred)`` as a custom loss or metric.

    The code runs wherever it is later loaded; see :meth:`Registry.register_custom_function`.

    Parameters
    ----------
    name : str
        The function's name, as ``compile_params`` will name it.
    source : str
        Python source that defines ``name`` (checked with :mod:`ast`, stored as text; never
        pickle).
    kind : {"loss", "metric"}
        What it is.
    description : str, optional
        Free text.
    replace : bool
        Replace a function registered under this name before.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Returns
    -------
    int
        The function's id.
    """
    with _opened(registry) as reg:
        return reg.register_custom_function(name, source, kind, description, replace)


def list_custom_functions(registry: Registry | str | None = None) -> pd.DataFrame:
    """The custom functions in the registry, with their source."""
    with _opened(registry) as reg:
        return reg.list_custom_functions()


def drop_custom_function(name: str, registry: Registry | str | None = None) -> None:
    """Remove a custom function from the registry.

    Parameters
    ----------
    name : str
        The function's name, as registered.
    registry : Registry, str or None
        The registry, its URL, or None for the configured one.

    Raises
    ------
    RegistryNotFoundError
        When no custom function has this name.
    """
    with _opened(registry) as reg:
        reg.drop_custom_function(name)


# Deprecated names (docs/architecture.md, "Verbs of the public API"), kept for one release.
show_architecture = renamed(
    describe_architecture, "dvml.show_architecture", "dvml.describe_architecture"
)
show_model = renamed(describe_model, "dvml.show_model", "dvml.describe_model")
delete_architecture = renamed(
    drop_architecture, "dvml.delete_architecture", "dvml.drop_architecture"
)
delete_model = renamed(drop_model, "dvml.delete_model", "dvml.drop_model")
delete_custom_function = renamed(
    drop_custom_function, "dvml.registry.delete_custom_function",
    "dvml.registry.drop_custom_function",
)  # fmt: skip
