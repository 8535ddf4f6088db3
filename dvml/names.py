"""The names users give datasets, feature caches and models: one character set, checked once.

Names end up in vineyard object names, registry rows and file paths (checkpoints live under
``state_dir/checkpoints/<model>-<job key>``; a workers' ``rmtree`` removes them later). A name
like ``../../escaped`` or ``/etc`` must never reach a path, so every user-facing name is
checked here before anything runs. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from dvml.exceptions import ArgumentError

__all__ = ["INTERNAL_PREFIX", "MAX_NAME_LENGTH", "check_name", "check_suffixed_name"]

# Names dvml gives its own hidden objects (e.g. the packed source of a feature cache).
INTERNAL_PREFIX = "__dvml_internal__/"
MAX_NAME_LENGTH = 128
# Letters, digits and . _ - @ + ; no '/', no whitespace or control characters; it starts
# with a letter or a digit (so never '.', '..' or a '__' prefix).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")


def check_name(name: Any, what: str = "name", internal: bool = False) -> str:
    """Return ``name`` if it is a valid user name, else raise an ArgumentError saying why.

    Parameters
    ----------
    name : Any
        The name to check.
    what : str
        The argument's name, for the message (``"model"``, ``"name"``).
    internal : bool
        Also accept dvml's own ``__dvml_internal__/<name>`` names.

    Returns
    -------
    str
        ``name``, unchanged.
    """
    segments = [name]
    if internal and isinstance(name, str) and name.startswith(INTERNAL_PREFIX):
        # dvml's own names nest one valid name per segment: __dvml_internal__/kind/name
        segments = name[len(INTERNAL_PREFIX) :].split("/")
    if not all(
        isinstance(s, str) and len(s) <= MAX_NAME_LENGTH and _NAME.fullmatch(s) for s in segments
    ):
        raise ArgumentError(
            f"{what} must be 1 to {MAX_NAME_LENGTH} characters of letters, digits and . _ - @ +"
            f", starting with a letter or a digit (no '/', '..', spaces or control characters)."
            f" Received: {what}={name!r}. For example 'digits_cnn' or 'model@candidate'."
        )
    return str(name)


def check_suffixed_name(name: Any, suffixes: Any, what: str = "name") -> str:
    """Check ``name`` and that every ``name + suffix`` dvml derives from it is a name too.

    ``fit_multiple`` registers ``f"{model_output}_{mst_key}"``: a 128-character
    ``model_output`` made 130-character model names that the rest of dvml refuses. Called up
    front, before anything trains.

    Parameters
    ----------
    name : Any
        The name given.
    suffixes : iterable of str
        What dvml appends to it (``"_1"``, ``"_12"``).
    what : str
        The argument's name, for the message.

    Returns
    -------
    str
        ``name``, unchanged.
    """
    name = check_name(name, what)
    longest = max((str(s) for s in suffixes), key=len, default="")
    if len(name) + len(longest) > MAX_NAME_LENGTH:
        room = MAX_NAME_LENGTH - len(longest)
        raise ArgumentError(
            f"{what} is too long for the names made from it: {name!r} + {longest!r} has "
            f"{len(name) + len(longest)} characters, and names have at most {MAX_NAME_LENGTH}. "
            f"Received: {what} of {len(name)} characters. Use at most {room} characters."
        )
    check_name(name + longest, what)
    return name
