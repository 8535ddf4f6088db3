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


def _functions(fn: Callable[..., Any]) -> list[types.FunctionType]:
    """``fn`` and the functions of its module it calls by name, transitively."""
    found: list[types.FunctionType] = []
    stack: list[Any] = [fn]
    while stack:
        f = stack.pop()
        if not isinstance(f, types.FunctionType) or any(f is g for g in found):
            continue
        found.append(f)
        for code in _codes(f.__code__):
            for name in code.co_names:
                called = f.__globals__.get(name)
                if isinstance(called, types.FunctionType) and called.__globals__ is f.__globals__:
                    stack.append(called)
    return found


def _codes(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code objects nested in it (inner functions, comprehensions)."""
    out = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out.extend(_codes(const))
    return out


def source_texts(fn: Callable[..., Any]) -> dict[str, Any]:
    """What a trainer needs to show ``fn``'s source lines in a traceback: ``files``, the text
    of each source file of ``fn`` and of the functions of its module it calls by name, as the
    client's :mod:`linecache` has them (a script, or a notebook cell IPython registered); and
    ``functions``, ``[qualname, first line, file]`` of each.

    cloudpickle names the file of every function it ships by value ``<dynamic-code>``;
    :func:`register_sources` gives each its file back in the trainer, so that its traceback
    shows the user's lines even where the file does not exist (a cell, another machine)."""
    files: dict[str, str] = {}
    functions = []
    total = 0
    for f in _functions(fn):
        code = f.__code__
        functions.append([code.co_qualname, code.co_firstlineno, code.co_filename])
        if code.co_filename in files:
            continue
        text = "".join(linecache.getlines(code.co_filename))
        if text and total + len(text) <= _MAX_SOURCE_CHARS:
            files[code.co_filename] = text
            total += len(text)
    return {"files": files, "functions": functions}


def register_sources(fn: Callable[..., Any], sources: Mapping[str, Any]) -> None:
    """In a trainer: give the shipped ``fn`` (and the functions it calls) their files back and
    put those files' lines (:func:`source_texts`) into :mod:`linecache`. No modification time:
    ``linecache.checkcache`` keeps them even where no such file exists."""
    for filename, text in (sources.get("files") or {}).items():
        lines = text.splitlines(keepends=True)
        linecache.cache[filename] = (len(text), None, lines, filename)
    where = {(q, int(n)): name for q, n, name in sources.get("functions") or []}
    for f in _functions(fn):
        filename = where.get((f.__code__.co_qualname, f.__code__.co_firstlineno))
        if filename is not None and f.__code__.co_filename != filename:
            f.__code__ = _renamed(f.__code__, filename)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(
        _renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)
