"""The shape of the code: one trainer runtime under the schedulers, no private imports, short
functions (docs/architecture.md, "Training: one runtime, several schedulers")."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "dvml"
MAX_FUNCTION_LINES = 80
SCHEDULERS = ("dvml.train.fit", "dvml.train.fit_multiple")


def _modules() -> list[pathlib.Path]:
    return sorted(ROOT.rglob("*.py"))


def _name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``from dvml.x import _y`` and ``x._y`` where ``x`` is an imported dvml module."""
    found = []
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dvml"):
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dvml") and alias.asname:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}: {what}"
        for path in _modules()
        for line, what in _private_imports(ast.parse(path.read_text()))
    ]
    assert not offenders, "private names used across modules:\n" + "\n".join(offenders)


def test_the_check_finds_a_private_import() -> None:
    tree = ast.parse("from dvml.train.fit import _plan\nfrom dvml import x\nx._y()\n")
    assert [w for _, w in _private_imports(tree)] == ["from dvml.train.fit import _plan", "x._y"]


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the ``def`` to the end of the body, without the docstring."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if docstring and isinstance(first.value.value, str):  # type: ignore[attr-defined]
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def test_no_function_in_train_is_longer_than_80_lines() -> None:
    """Code lines, docstrings aside: a numpydoc docstring is documentation, not length."""
    long = []
    for path in sorted((ROOT / "train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = _code_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    long.append(f"{where} {node.name} {lines}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_runtime_imports_no_scheduler() -> None:
    offenders = []
    for path in sorted((ROOT / "train" / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            hits = [n for n in names if n in SCHEDULERS]
            if hits:
                offenders.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {hits}")
    assert not offenders, "the runtime must not import a scheduler:\n" + "\n".join(offenders)
