"""The error contract: every error dvml raises on purpose is a ``DvmlError``.

A static walk of ``dvml/`` and ``workflows/`` fails on any ``raise ValueError(...)`` (or any
other builtin exception) that is neither on the allow-list below nor one of the protocol raises
that Python itself expects. The classes that are both a ``DvmlError`` and a builtin keep
``except ValueError`` / ``except TypeError`` callers working; the behavioural tests check that
with real validation functions.
"""

from __future__ import annotations

import ast
import builtins
import pathlib

import pytest

import dvml
from dvml import exceptions
from dvml.cluster.spec import check_shared_memory, plan_workers
from dvml.exceptions import (
    ArgumentError,
    ArgumentTypeError,
    DvmlError,
    LockHeldError,
    ParameterError,
    SharedMemoryError,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("dvml", "workflows")

BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}

# Builtin raises that are deliberate and stay, keyed by (file, enclosing function, exception).
# Every entry says why; an entry that no longer matches a raise fails test_allow_list_is_current.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("dvml/cluster/serve.py", "on_signal", "KeyboardInterrupt"): (
        "the SIGTERM handler aborts a cluster that is still starting exactly as Ctrl-C does: "
        "LocalCluster stops what it had started on KeyboardInterrupt and re-raises it"
    ),
    ("dvml/cluster/spec.py", "parse_memory", "ValueError"): (
        "internal control flow: caught by the except clause around it and re-raised as "
        "ArgumentError with the full message"
    ),
    ("dvml/registry/weights.py", "weights_from_bytes", "ValueError"): (
        "internal control flow: each is caught by the except clause around it and re-raised "
        "as RegistryError naming the stored bytes"
    ),
}

# Raises that Python's own protocols require, allowed wherever the protocol applies:
# module/class __getattr__ must raise AttributeError, __next__ must raise StopIteration.
PROTOCOL = {"AttributeError": {"__getattr__"}, "StopIteration": {"__next__"}}

# Exception classes defined outside dvml/exceptions.py that need not be DvmlErrors.
PRIVATE_CLASSES: dict[tuple[str, str], str] = {
    ("dvml/configs/literals.py", "Refused"): (
        "internal to the literal reader: always caught there and turned into ParameterError"
    ),
    ("dvml/preprocess/admission.py", "Planned"): (
        "control flow of dvml.plan.pack: raised only under planning_only() and caught there "
        "(not a DvmlError, so that no handler of dvml errors wraps it)"
    ),
}


def _files() -> list[pathlib.Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name):
        return exc.id
    if isinstance(exc, ast.Attribute) and isinstance(exc.value, ast.Name):
        return exc.attr if exc.value.id == "builtins" else None
    return None


def _is_abstract_body(function: ast.AST) -> bool:
    """A body that is only a docstring and ``raise NotImplementedError``: an abstract method."""
    body = list(getattr(function, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _builtin_raises() -> list[tuple[str, int, str, str, ast.AST | None]]:
    """(file, line, enclosing function, exception, function node) of every builtin raise.

    Also a builtin exception built anywhere else (``return ValueError(...)`` in a helper whose
    result the caller raises): it reaches the user all the same.
    """
    found = []
    for path in _files():
        tree = ast.parse(path.read_text(), filename=str(path))
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                if isinstance(node.exc, ast.Call):
                    continue  # the call itself is visited below
                name = _raised_name(node)
            elif isinstance(node, ast.Call):
                name = _raised_name(ast.Raise(exc=node))
            else:
                continue  # a bare `raise` re-raises the error being handled
            if name not in BUILTIN_EXCEPTIONS:
                continue  # a DvmlError, or a variable holding a caught exception
            enclosing = [f for f in functions if f.lineno <= node.lineno <= (f.end_lineno or 0)]
            inner = max(enclosing, key=lambda f: f.lineno) if enclosing else None
            rel = path.relative_to(ROOT).as_posix()
            found.append((rel, node.lineno, inner.name if inner else "<module>", name, inner))
    return found


def _offenders() -> list[str]:
    offenders = []
    for rel, line, function, name, node in _builtin_raises():
        if (rel, function, name) in ALLOWED:
            continue
        if function in PROTOCOL.get(name, ()):
            continue
        if name == "NotImplementedError" and node is not None and _is_abstract_body(node):
            continue
        offenders.append(f"{rel}:{line}: {name} raised or built in {function}()")
    return offenders


def test_no_bare_builtin_raise() -> None:
    offenders = _offenders()
    assert not offenders, (
        "Raise a dvml.exceptions class instead (ArgumentError / ArgumentTypeError when no "
        "specific one fits), or add a commented entry to ALLOWED:\n" + "\n".join(offenders)
    )


def test_the_scan_sees_a_builtin_raise() -> None:
    # The allow-listed raises are found: the walk is not vacuous.
    seen = {(rel, function, name) for rel, _, function, name, _ in _builtin_raises()}
    assert ("dvml/cluster/serve.py", "on_signal", "KeyboardInterrupt") in seen
    assert ("dvml/__init__.py", "__getattr__", "AttributeError") in seen


def test_allow_list_is_current() -> None:
    seen = {(rel, function, name) for rel, _, function, name, _ in _builtin_raises()}
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"ALLOWED entries that match no raise any more: {stale}"


def test_exception_classes_are_dvml_errors() -> None:
    """A class with a builtin exception base must also derive from a dvml error class."""
    offenders = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            if not any(b in BUILTIN_EXCEPTIONS for b in bases):
                continue
            if rel == "dvml/exceptions.py" and (node.name == "DvmlError" or len(bases) > 1):
                continue
            if (rel, node.name) not in PRIVATE_CLASSES:
                offenders.append(f"{rel}:{node.lineno}: class {node.name}({', '.join(bases)})")
    assert not offenders, "Derive these from a dvml.exceptions class:\n" + "\n".join(offenders)


def test_exception_tree() -> None:
    assert sorted(exceptions.__all__) == sorted(
        [
            "ArgumentError",
            "ArgumentTypeError",
            "ClusterError",
            "ClusterStartError",
            "ConfigError",
            "DaemonDiedError",
            "DataError",
            "DatasetExistsError",
            "DatasetInUseError",
            "DatasetNotFoundError",
            "DvmlError",
            "FitRunningError",
            "LeaseBrokenError",
            "LockHeldError",
            "MemoryPlanError",
            "ModelMismatchError",
            "NoClusterError",
            "ParameterError",
            "PlacementError",
            "ProtocolError",
            "RegistryError",
            "RegistryNotFoundError",
            "SharedMemoryError",
            "StoreError",
            "TrainerFailedError",
            "TrainerStoppedError",
            "TrainingError",
            "VineyardMemoryError",
            "VineyarddDiedError",
            "WorkerDepartedError",
        ]
    )
    for name in exceptions.__all__:
        cls = getattr(exceptions, name)
        assert issubclass(cls, DvmlError), name
        assert name in (exceptions.__doc__ or ""), f"{name} is missing from the drawn tree"
    assert issubclass(ArgumentError, ValueError)
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(SharedMemoryError, exceptions.ClusterError)
    assert issubclass(SharedMemoryError, ValueError)


def test_workflows_lock_error_is_the_dvml_one() -> None:
    from workflows._runtime import LockHeldError as RuntimeLockHeldError

    assert RuntimeLockHeldError is LockHeldError


def _caught_by_both(call, builtin: type[Exception]) -> DvmlError:
    """Run ``call`` twice: its error must be caught by ``except DvmlError`` and by ``builtin``."""
    try:
        call()
    except dvml.DvmlError as exc:
        caught = exc
    else:
        raise AssertionError("no error was raised")
    try:
        call()
    except builtin as exc:
        assert type(exc) is type(caught)
    return caught


def test_fit_argument_error_is_a_dvml_error_and_a_value_error() -> None:
    from dvml.train.runtime.plan import check_fit_args

    exc = _caught_by_both(lambda: check_fit_args("digits", 0, None), ValueError)
    assert isinstance(exc, ArgumentError)
    assert "Received: num_iterations=0" in str(exc)


def test_preprocessor_argument_error_is_a_dvml_error_and_a_value_error() -> None:
    from dvml.preprocess.api import _check_arguments

    exc = _caught_by_both(lambda: _check_arguments("train", 0, 255.0, 10, 1), ValueError)
    assert "buffer_size must be a positive int" in str(exc)


def test_params_error_is_a_dvml_error_and_a_value_error() -> None:
    from dvml.configs import parse_compile_params

    exc = _caught_by_both(lambda: parse_compile_params("loss=__import__('os')"), ValueError)
    assert isinstance(exc, ParameterError)


def test_argument_type_error_is_a_dvml_error_and_a_type_error() -> None:
    exc = _caught_by_both(lambda: plan_workers("2"), TypeError)  # type: ignore[arg-type]
    assert isinstance(exc, ArgumentTypeError)
    assert "Received: n_workers='2'" in str(exc)


def test_full_shared_memory_is_a_dvml_error(tmp_path: pathlib.Path) -> None:
    import shutil

    free = shutil.disk_usage(tmp_path).free
    exc = _caught_by_both(
        lambda: check_shared_memory(free // 2 + 1, 2, shm_path=str(tmp_path)), ValueError
    )
    assert isinstance(exc, SharedMemoryError)
    assert "enlarge /dev/shm" in str(exc)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_fit_rejects_every_bad_iteration_count(bad: object) -> None:
    from dvml.train.runtime.plan import check_fit_args

    with pytest.raises(ArgumentError, match="num_iterations must be a positive int"):
        check_fit_args("digits", bad, None)
