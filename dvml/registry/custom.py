"""Custom loss and metric functions kept as Python source, never as pickled bytes.

A custom function is code that a registry user registers on purpose: the trust boundary is who
may write to the registry, as for any code repository. Weights, in contrast, are data and load
without running anything (:mod:`dvml.registry.weights`).

The source is checked with :mod:`ast` when it is registered and again before it is compiled, so
that running the module's top level does nothing but two allowed imports and one ``def``: no
decorators, annotations or default values other than literal constants, which Python would
evaluate at definition time. The ``def`` may take any arguments Keras can call as
``(y_true, y_pred)``, or none: then it is a factory, called once when the source is compiled,
that returns the loss or metric (MADlib takes any Keras-valid callable).
"""

from __future__ import annotations

import ast
import inspect
import keyword
from collections.abc import Callable, Mapping
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError

__all__ = [
    "KINDS",
    "MAX_SOURCE_LENGTH",
    "check_name",
    "check_source",
    "compile_function",
    "custom_objects_from_sources",
]

KINDS = ("loss", "metric")
"""The kinds of custom function the registry keeps."""

MAX_SOURCE_LENGTH = 100_000
"""Longest source accepted, in characters."""

_ALLOWED_IMPORTS = {("tensorflow", "tf"), ("numpy", "np")}


def check_name(name: Any) -> str:
    """Check that ``name`` can name a custom function (a Python identifier).

    Raises
    ------
    ArgumentTypeError, ArgumentError
    """
    if not isinstance(name, str):
        raise ArgumentTypeError(f"name must be a string. Received: {type(name).__name__} {name!r}.")
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ArgumentError(
            f"name must be a Python identifier, the name of the function defined in the "
            f"source. Received: name={name!r}. Use letters, digits and underscores."
        )
    return name


def _refuse(name: str, what: str, line: int | None = None) -> ArgumentError:
    where = f" (line {line})" if line else ""
    return ArgumentError(
        f"The source of custom function {name!r} is refused. Received: source that {what}"
        f"{where}. The source must be `def {name}(y_true, y_pred): ...` (or a factory "
        f"`def {name}():` that returns such a function), optionally "
        "after `import tensorflow as tf` and `import numpy as np`, with nothing else at top "
        "level; put helpers inside the function."
    )


def check_source(name: str, source: Any) -> ast.Module:
    """Check that ``source`` defines exactly one function ``name(y_true, y_pred)``.

    Parameters
    ----------
    name : str
        The function's name.
    source : str
        Python source text.

    Returns
    -------
    ast.Module
        The parsed source.

    Raises
    ------
    ArgumentTypeError
        When ``source`` is not a string.
    ArgumentError
        When it does not parse or contains anything beyond the allowed imports and the one
        ``def``.
    """
    check_name(name)
    if not isinstance(source, str):
        raise ArgumentTypeError(
            f"source must be Python source text. Received: {type(source).__name__}. Pass the "
            f"text of `def {name}(y_true, y_pred): ...` (inspect.getsource gives it)."
        )
    if len(source) > MAX_SOURCE_LENGTH:
        raise _refuse(name, f"is {len(source)} characters long, over {MAX_SOURCE_LENGTH}")
    try:
        tree = ast.parse(source, filename=f"<custom function {name}>", mode="exec")
    except SyntaxError as exc:
        raise _refuse(name, f"does not parse: {exc.msg}", exc.lineno) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise _refuse(name, f"cannot be parsed ({type(exc).__name__})") from None
    functions = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if (alias.name, alias.asname) not in _ALLOWED_IMPORTS:
                    raise _refuse(name, f"imports {alias.name!r}", stmt.lineno)
        elif isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            _check_function(name, stmt)
            functions += 1
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            raise _refuse(name, f"defines {stmt.name!r} at top level", stmt.lineno)
        else:
            raise _refuse(name, f"has a top-level {type(stmt).__name__} statement", stmt.lineno)
    if functions != 1:
        raise _refuse(name, f"defines {name!r} {functions} times")
    return tree


def _check_function(name: str, node: ast.FunctionDef) -> None:
    """Any signature Keras can call as ``fn(y_true, y_pred)``, or a factory that takes no
    argument and returns such a callable (MADlib takes any Keras-valid callable)."""
    if node.decorator_list:
        raise _refuse(name, "has a decorator", node.lineno)
    if getattr(node, "type_params", None):
        raise _refuse(name, "has type parameters", node.lineno)
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    if node.returns is not None or any(a is not None and a.annotation for a in every):
        raise _refuse(name, "has annotations", node.lineno)
    # Defaults are evaluated when the source is loaded: literal constants only.
    defaults = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    if not all(isinstance(d, ast.Constant) for d in defaults):
        raise _refuse(name, "has a default value that is not a literal constant", node.lineno)
    if not (_takes_two(node.args) or is_factory(node)):
        raise _refuse(name, "can be called neither as (y_true, y_pred) nor with no argument",
                      node.lineno)  # fmt: skip


def _takes_two(args: ast.arguments) -> bool:
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    kw_required = any(d is None for d in args.kw_defaults)
    return not kw_required and required <= 2 and (positional >= 2 or args.vararg is not None)


def is_factory(node: ast.FunctionDef) -> bool:
    """Whether ``def name(...)`` is a factory: callable with no argument and not as
    ``(y_true, y_pred)``; the trainers call it once to get the loss or metric."""
    args = node.args
    positional = len(args.posonlyargs) + len(args.args)
    no_required = positional == len(args.defaults) and all(d is not None for d in args.kw_defaults)
    return no_required and not _takes_two(args)


def compile_function(
    name: str, source: str, namespace: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """Run checked ``source`` in a fresh namespace and return the function ``name``.

    This runs registered code: call it only on source from a registry you trust to write.

    Parameters
    ----------
    name, source : str
        As given to :func:`check_source`, which runs again first.
    namespace : dict, optional
        Globals the function sees besides builtins, for example ``{"tf": tf, "np": np}``.
    """
    tree = check_source(name, source)
    scope: dict[str, Any] = {"__name__": f"dvml_custom_{name}", **(namespace or {})}
    exec(compile(tree, f"<dvml custom function {name}>", "exec"), scope)
    function = scope[name]
    if not callable(function):  # pragma: no cover - check_source guarantees a def
        raise ArgumentError(f"Custom function {name!r} did not define a function.")
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    if is_factory(node):
        function = function()  # a factory: the loss or metric is what it returns
        if not callable(function):
            raise ArgumentError(
                f"Custom function {name!r} takes no argument, so it is called as a factory, "
                f"but it returned {type(function).__name__}, not a callable. Received: "
                f"{name}() = {function!r:.80}. Return the loss or metric function."
            )
        if inspect.isfunction(function):
            function.__name__ = name  # Keras reports a metric by its function's name
    return function


def custom_objects_from_sources(sources: Mapping[str, str]) -> dict[str, Callable[..., Any]]:
    """Compile registered custom losses and metrics with ``tf`` (started through
    :mod:`dvml.tf_runtime`) and ``np`` in their namespace: the one place that does it for the
    registry, the trainers and the workers' inference tasks."""
    if not sources:
        return {}
    import numpy as np

    from dvml import tf_runtime

    namespace = {"tf": tf_runtime.tensorflow(), "np": np}
    return {name: compile_function(name, src, namespace) for name, src in sources.items()}
