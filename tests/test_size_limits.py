"""No module in dvml/ over 600 lines, no function over 60 code lines (issue 41, item 4).

A ratchet: the modules and functions over a limit when the check came in are listed below with
their size then as a ceiling. The lists may only shrink: a new offender fails, a listed one
that grows past its ceiling fails, and an entry that is no longer over the limit fails until it
is removed (so the lists stay tight). A split that brings one under the limit deletes its entry.

Module size: physical lines. Function size: code lines from the ``def`` to the end of its body
(nested functions and classes included), not counting blank lines, comment-only lines and
docstrings (a numpydoc docstring is documentation, not length). Pure: parses the source with
:mod:`ast` and :mod:`tokenize`, imports nothing of dvml.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "dvml"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

# Issue 41: today's offenders, each with its size as a ceiling. This list may only shrink.
MODULE_CEILINGS: dict[str, int] = {
    "dvml/jobs/schemas.py": 700,
    "dvml/preprocess/api.py": 907,
    "dvml/preprocess/tasks.py": 645,
    "dvml/registry/database.py": 914,
    "dvml/registry/keras_json.py": 657,
    "dvml/testing/netns.py": 664,
    "dvml/train/runtime/sessions.py": 633,
}

# Issue 41: today's offenders ("path::qualified name": code lines). This list may only shrink.
FUNCTION_CEILINGS: dict[str, int] = {
    "dvml/cli/cluster_cmd.py::_status": 68,
    "dvml/cluster/pinned.py::run_pinned": 72,
    "dvml/features/backbone.py::_from_application": 62,
    "dvml/features/build.py::cache": 71,
    "dvml/placement/planner.py::plan_layout": 73,
    "dvml/preprocess/api.py::_preprocess": 94,
    "dvml/preprocess/api.py::_plan_and_pack": 126,
    "dvml/preprocess/exchange.py::fetch_slices": 77,
    "dvml/preprocess/graph.py::_pack": 61,
    "dvml/search/driver.py::automl": 63,
    "dvml/search/driver.py::_asha": 62,
    "dvml/search/simulation.py::simulate_asha": 64,
    "dvml/store/catalog.py::publish": 70,
    "dvml/train/predict.py::_predict": 66,
    "dvml/train/predict.py::predict_byom": 64,
    "dvml/train/run.py::run": 72,
    "dvml/train/summary.py::build_summary": 74,
}


def _non_code_lines(source: str, tree: ast.AST) -> set[int]:
    """Line numbers that hold only a comment, or part of a docstring."""
    skipped = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
            skipped.add(token.start[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                skipped.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return skipped


def function_sizes(source: str) -> dict[str, int]:
    """Code lines of every function in ``source``, by qualified name (``Class.method``,
    ``outer.inner``); the largest where a name is defined twice."""
    tree = ast.parse(source)
    lines = source.splitlines()
    skipped = _non_code_lines(source, tree)
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    span = range(child.lineno, (child.end_lineno or child.lineno) + 1)
                    size = sum(1 for i in span if lines[i - 1].strip() and i not in skipped)
                    sizes[name] = max(size, sizes.get(name, 0))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return sizes


def _measure() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT.parent).as_posix()
        source = path.read_text()
        modules[where] = len(source.splitlines())
        for name, size in function_sizes(source).items():
            functions[f"{where}::{name}"] = size
    return modules, functions


@pytest.fixture(scope="module")
def sizes() -> tuple[dict[str, int], dict[str, int]]:
    return _measure()


def _ratchet(sizes: dict[str, int], ceilings: dict[str, int], limit: int) -> list[str]:
    """Everything wrong with ``ceilings`` against the measured ``sizes``."""
    problems = []
    for name, size in sorted(sizes.items()):
        if size > limit and name not in ceilings:
            problems.append(f"{name}: {size} lines, over the limit of {limit}: split it")
        elif name in ceilings and size > ceilings[name]:
            problems.append(f"{name}: {size} lines, grew past its ceiling {ceilings[name]}")
    for name, ceiling in sorted(ceilings.items()):
        if name not in sizes:
            problems.append(f"{name}: listed (ceiling {ceiling}) but gone: remove its entry")
        elif sizes[name] <= limit:
            problems.append(
                f"{name}: {sizes[name]} lines, now within the limit of {limit}: remove its entry"
            )
    return problems


def test_no_module_is_over_600_lines_beyond_the_ratchet(
    sizes: tuple[dict[str, int], dict[str, int]],
) -> None:
    problems = _ratchet(sizes[0], MODULE_CEILINGS, MAX_MODULE_LINES)
    assert not problems, "module sizes (issue 41):\n" + "\n".join(problems)


def test_no_function_is_over_60_code_lines_beyond_the_ratchet(
    sizes: tuple[dict[str, int], dict[str, int]],
) -> None:
    problems = _ratchet(sizes[1], FUNCTION_CEILINGS, MAX_FUNCTION_LINES)
    assert not problems, "function sizes, in code lines (issue 41):\n" + "\n".join(problems)


def test_the_ratchet_fails_a_new_offender_a_growth_and_a_stale_entry() -> None:
    ceilings = {"a.py": 700, "b.py": 650, "c.py": 620, "gone.py": 900}
    measured = {"a.py": 700, "b.py": 651, "c.py": 600, "d.py": 601, "e.py": 599}
    assert _ratchet(measured, ceilings, 600) == [
        "b.py: 651 lines, grew past its ceiling 650",
        "d.py: 601 lines, over the limit of 600: split it",
        "c.py: 600 lines, now within the limit of 600: remove its entry",
        "gone.py: listed (ceiling 900) but gone: remove its entry",
    ]
    assert _ratchet({"a.py": 650}, {"a.py": 700}, 600) == []  # shrunk, still over: allowed


def test_code_lines_leave_out_docstrings_comments_and_blank_lines() -> None:
    source = '''\
def outer(x):
    """A docstring
    of three lines.
    """
    # a comment

    y = x  # a trailing comment: code
    text = """a string that is
    # not a comment
    """

    def inner():
        """Its docstring."""
        return y

    return inner, text


class Box:
    """A class."""

    def method(self):
        return 1
'''
    # outer: def, y =, the 3 lines of text, def inner, return y, return inner
    assert function_sizes(source) == {"outer": 8, "outer.inner": 2, "Box.method": 2}
