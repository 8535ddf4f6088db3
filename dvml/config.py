"""Configuration: defaults in ``dvml.yaml``, read through :mod:`dask.config`.

Every value lives under the ``dvml`` namespace, so the usual Dask mechanisms apply: YAML files
in ``~/.config/dask/``, environment variables such as ``DASK_DVML__CLUSTER__N_WORKERS=4``, and
``dask.config.set({"dvml.cluster.n-workers": 4})``. A keyword argument left as ``None`` falls
back to the configuration.
"""

from __future__ import annotations

import copy
import os
import pathlib
from typing import Any

import dask.config
import yaml

from dvml.exceptions import ConfigError

__all__ = ["defaults", "get", "registry_url", "state_dir", "validate"]

_DEFAULTS_FILE = pathlib.Path(__file__).with_name("dvml.yaml")
_loaded = False
_defaults: dict[str, Any] = {}


def defaults() -> dict[str, Any]:
    """Return dvml's defaults as a nested dict (the content of ``dvml.yaml``)."""
    global _loaded, _defaults
    if not _loaded:
        with open(_DEFAULTS_FILE) as f:
            _defaults = yaml.safe_load(f)
        dask.config.update_defaults(_defaults)
        _loaded = True
    elif "dvml" not in dask.config.config:
        # Loaded first inside a ``dask.config.set({"dvml...": ...})`` block: leaving the block
        # removed the whole new "dvml" key, defaults included. Put them back under the user's.
        dask.config.update(dask.config.config, copy.deepcopy(_defaults), priority="old")
    return _defaults


def get(key: str, override: Any = None) -> Any:
    """Return ``override`` if it is not None, else the configured value of ``dvml.<key>``.

    This is ``dask.config.get(f"dvml.{key}", override_with=override)``, with dvml's default
    (from ``dvml.yaml``) as the fallback and the key checked against the known keys first, so
    a misspelt key fails even when an override is given.

    Parameters
    ----------
    key : str
        Dotted key under the ``dvml`` namespace, for example ``"cluster.n-workers"``
        (``_`` and ``-`` are interchangeable, as everywhere in Dask's configuration).
    override : optional
        A keyword argument given by the caller; wins when not None.

    Raises
    ------
    ConfigError
        When ``key`` is not a dvml configuration key, naming the known keys at that level.
    """
    default = _default_of(key)
    return dask.config.get(f"dvml.{key}", default=default, override_with=override)


def _default_of(key: str) -> Any:
    """The value of ``dvml.<key>`` in ``dvml.yaml``; ConfigError when there is no such key."""
    node: Any = defaults()["dvml"]
    path = "dvml"
    for part in key.split("."):
        name = part.replace("_", "-")
        if not isinstance(node, dict) or name not in node:
            known = sorted(node) if isinstance(node, dict) else []
            raise ConfigError(
                f"Unknown configuration key dvml.{key}. Received: key={key!r}. Known keys under "
                f"{path!r}: {known}. The keys are listed in dvml/dvml.yaml."
            )
        node = node[name]
        path = f"{path}.{name}"
    return node


def validate() -> None:
    """Check that every key set under ``dvml`` is a known one.

    Raises
    ------
    ConfigError
        Naming the unknown key and the known keys at that level.
    """
    known = defaults()["dvml"]
    _check_keys(dask.config.get("dvml"), known, "dvml")


def _check_keys(given: Any, known: Any, path: str) -> None:
    if not isinstance(known, dict):
        return
    if not isinstance(given, dict):
        raise ConfigError(
            f"Configuration key {path!r} must be a mapping. Received: {given!r}. "
            f"Known keys there: {sorted(known)}."
        )
    for key, value in given.items():
        canonical = str(key).replace("_", "-")
        if canonical not in known:
            raise ConfigError(
                f"Unknown configuration key {path}.{key}. Known keys under {path!r}: "
                f"{sorted(known)}. Check your dask config files and DASK_DVML__* variables."
            )
        _check_keys(value, known[canonical], f"{path}.{canonical}")


def state_dir() -> pathlib.Path:
    """The directory where dvml keeps local state (cluster state file, default registry)."""
    return pathlib.Path(os.path.expanduser(str(get("cluster.state-dir"))))


def registry_url() -> str:
    """The SQLAlchemy URL of the model registry."""
    url = get("registry.url")
    if url:
        return str(url)
    return f"sqlite:///{state_dir() / 'registry.db'}"
