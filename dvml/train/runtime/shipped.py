"""User code shipped to the trainers as cloudpickle bytes (as Dask ships tasks)."""

from __future__ import annotations

import linecache
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["pickle_by_value", "register_sources", "source_texts"]

# Source shipped with a train_fn, at most: a notebook's cells or a script, not a package.
_MAX_SOURCE_CHARS = 2_000_000

# Modules every trainer imports itself: pickled by reference.
_INSTALLED = ("__main__", "builtins", "dvml", "tensorflow", "tf_keras")


def pickle_by_value(fn: Callable[..., Any]) -> bytes:
    """``fn`` as cloudpickle bytes, BY VALUE with the rest of its module: the trainers cannot
    import a test module, a script or a package that is only on the client."""
    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    top = module.__name__.split(".")[0] if module is not None else "builtins"
    by_value = top not in _INSTALLED
    if module is not None and by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps(fn))
    finally:
        if module is not None and by_value:
            cloudpickle.unregister_pickle_by_value(module)


def source_texts(fn: Callable[..., Any]) -> dict[str, str]:
    """The source files of ``fn``, of the functions nested in it and of the functions of its
    module it calls by name, as the client's :mod:`linecache` has them (a script, a notebook
    cell, an exec'd string IPython registered): ``{filename: text}``.

    Shipped with ``fn`` so that a trainer's traceback shows the user's source lines, also where
    the file does not exist on the trainer's host (a notebook cell, another machine)."""
    files: list[str] = []
    seen: set[int] = set()
    names = getattr(fn, "__globals__", {})
    stack = [getattr(fn, "__code__", None)]
    while stack:
        code = stack.pop()
        if not isinstance(code, types.CodeType) or id(code) in seen:
            continue
        seen.add(id(code))
        if code.co_filename not in files:
            files.append(code.co_filename)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        for name in code.co_names:
            called = names.get(name)
            if isinstance(called, types.FunctionType) and called.__globals__ is names:
                stack.append(called.__code__)
    out: dict[str, str] = {}
    total = 0
    for filename in files:
        text = "".join(linecache.getlines(filename))
        if text and total + len(text) <= _MAX_SOURCE_CHARS:
            out[filename] = text
            total += len(text)
    return out


def register_sources(sources: Mapping[str, str]) -> None:
    """In a trainer: put shipped sources (:func:`source_texts`) into :mod:`linecache`, so
    that tracebacks show those lines. No modification time: ``linecache.checkcache`` keeps
    them even where no such file exists."""
    for filename, text in sources.items():
        lines = text.splitlines(keepends=True)
        linecache.cache[filename] = (len(text), None, lines, filename)
