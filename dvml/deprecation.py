"""Deprecated names kept for one release: one helper, :func:`renamed`, so every alias warns alike.

A public name that changes (a verb made consistent, see ``docs/architecture.md``, "Verbs of the
public API") keeps its old spelling for one release as an alias that still works and warns
with :class:`DeprecationWarning` naming the new spelling. The command line does the same for
its old subcommand names (:func:`dvml.cli._common.add_alias`), on stderr.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["REMOVED_AFTER", "renamed"]

P = ParamSpec("P")
R = TypeVar("R")

# The release after which the aliases go: they are kept for exactly one.
REMOVED_AFTER = "0.2"


def renamed(new: Callable[P, R], old: str, new_name: str) -> Callable[P, R]:
    """A deprecated alias of ``new`` under its old name ``old``.

    Works for functions and for methods (assign it in the class body: ``self`` passes
    through).

    Parameters
    ----------
    new : callable
        The function or method under its new name.
    old : str
        The old spelling users call, as they type it (``"dvml.delete_model"``).
    new_name : str
        The new spelling, as they should type it (``"dvml.drop_model"``).

    Returns
    -------
    callable
        A function that warns with :class:`DeprecationWarning` (naming ``new_name``, at the
        caller's line), then returns what ``new`` returns.
    """

    @functools.wraps(new)
    def alias(*args: P.args, **kwargs: P.kwargs) -> R:
        warnings.warn(
            f"{old} is deprecated and will be removed after dvml {REMOVED_AFTER}: use "
            f"{new_name} (same arguments).",
            DeprecationWarning,
            stacklevel=2,
        )
        return new(*args, **kwargs)

    short = old.rpartition(".")[2]
    owner = new.__qualname__.rpartition(".")[0]  # a method's class: "Registry"
    alias.__name__ = short
    alias.__qualname__ = f"{owner}.{short}" if owner else short
    alias.__doc__ = f"Deprecated alias of ``{new_name}`` (kept until dvml {REMOVED_AFTER})."
    alias.__deprecated_alias_of__ = new_name  # type: ignore[attr-defined]
    return alias
