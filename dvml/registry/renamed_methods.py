"""The :class:`~dvml.registry.database.Registry` methods renamed in 0.2, kept for one release.

``delete_*`` became ``drop_*`` (one verb for removing a named thing across the public API: see
``docs/architecture.md``, "Verbs of the public API"). Each old name forwards to the new one and
warns through :func:`dvml.deprecation.renamed`. A mixin, so the registry's own module does not
grow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dvml.deprecation import renamed

__all__ = ["RENAMED", "RenamedMethods"]

# old method name -> new method name
RENAMED: dict[str, str] = {
    "delete_architecture": "drop_architecture",
    "delete_custom_function": "drop_custom_function",
    "delete_model": "drop_model",
    "delete_model_selection": "drop_model_selection",
}


def _forward(new: str) -> Callable[..., Any]:
    """A method that calls ``self.<new>`` with its arguments."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, new)(*args, **kwargs)

    method.__qualname__ = f"Registry.{new}"
    return method


def _alias(old: str) -> Callable[..., Any]:
    new = RENAMED[old]
    return renamed(_forward(new), f"Registry.{old}", f"Registry.{new}")


class RenamedMethods:
    """The deprecated ``Registry.delete_*`` names: each warns and calls ``drop_*``."""

    delete_architecture = _alias("delete_architecture")
    delete_custom_function = _alias("delete_custom_function")
    delete_model = _alias("delete_model")
    delete_model_selection = _alias("delete_model_selection")
