"""dvml's import graph has no cycle, between modules or between packages, and follows the layers.

Every ``import`` of a dvml module counts: at module top level, inside functions (a lazy import
hides a cycle, it does not remove it) and under ``if TYPE_CHECKING:`` (a type that must be
imported upwards says the code sits in the wrong layer). Only the implicit import of parent
packages is left out: ``import dvml.store.catalog`` runs ``dvml/__init__.py`` (the public API,
which imports nearly everything) first, and counting that would make every module depend on
the API facade. Pure: parses the source with :mod:`ast`, imports nothing of dvml.

The layers, lowest first, are drawn in ``docs/architecture.md``; a unit (a subpackage, or a
top-level module) may import only units in lower layers.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "dvml"

# Lowest first. Units within one layer do not import each other.
LAYERS: list[set[str]] = [
    {"dvml._version", "dvml.exceptions", "dvml.deprecation"},
    {"dvml.tf_runtime", "dvml.vineyard_runtime"},
    {"dvml.config", "dvml.names", "dvml.limits", "dvml.examples", "dvml.configs"},
    {"dvml.cluster", "dvml.registry"},
    {"dvml.placement", "dvml.store", "dvml.tracking"},
    {"dvml.resolve"},
    {"dvml.preprocess"},
    {"dvml.train", "dvml.features"},
    {"dvml.search", "dvml.memory_plans"},
    {"dvml.jobs", "dvml.dashboard"},
    {"dvml"},  # the public API (dvml/__init__.py)
    {"dvml.demo"},
    {"dvml.cli"},
    {"dvml.__main__"},
    {"dvml.testing"},  # test harnesses (netns hosts): nothing else in dvml imports them
]


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Dotted module name → (file, is a package)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _known(name: str) -> str:
    """The dvml module that ``name`` lives in (a module, or the package holding a name)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, source_text: str | None = None) -> set[str]:
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    text = path.read_text() if source_text is None else source_text
    found: set[str] = set()
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "dvml")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "dvml":
                continue
            for alias in node.names:
                # "from dvml.store import datasets" imports the module dvml.store.datasets;
                # "from dvml.store import drop" imports the package dvml.store.
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in MODULES else source)
    return {_known(name) for name in found} - {module}


GRAPH = {module: _imports(module) for module in MODULES}


def _unit(module: str) -> str:
    """The package a module belongs to: ``dvml.store.catalog`` → ``dvml.store``."""
    parts = module.split(".")
    if len(parts) >= 2 and MODULES.get(".".join(parts[:2]), (None, False))[1]:
        return ".".join(parts[:2])
    return module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node, as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; dvml's graph is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, set(c)) + sorted(c) for c in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's smallest node, e.g. [a, b, c, a].

    :func:`_cycles` appends the whole component after it, so that the message names every
    module caught in the knot, not only one loop through it.
    """
    start = min(component)
    paths = collections.deque([[start]])
    seen = {start}
    while paths:
        path = paths.popleft()
        for nxt in sorted(graph[path[-1]] & component):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append([*path, nxt])
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _format(cycles: list[list[str]]) -> str:
    lines = []
    for found in cycles:
        end = found.index(found[0], 1) + 1
        lines.append(" -> ".join(found[:end]) + f"  (all of: {', '.join(found[end:])})")
    return "\n".join(lines)


def test_the_parser_sees_lazy_and_relative_imports() -> None:
    # A check of the checker: if it missed imports inside functions, under TYPE_CHECKING or
    # relative ones, the tests below could not fail.
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dvml.store.datasets import Dataset\n"
        "def f():\n    from . import attach\n    import dvml.train.fit\n"
        "    from dvml.store import catalog, drop\n"
    )
    assert _imports("dvml.cluster.gpu", text) == {
        "dvml.store.datasets", "dvml.cluster.attach", "dvml.train.fit", "dvml.store.catalog",
        "dvml.store",
    }  # fmt: skip
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a", "a", "b", "c"]]


def test_no_cycle_between_modules() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, f"import cycles between dvml modules:\n{_format(cycles)}"


def test_no_cycle_between_packages() -> None:
    units: dict[str, set[str]] = collections.defaultdict(set)
    for module, targets in GRAPH.items():
        units[_unit(module)].update(_unit(t) for t in targets if _unit(t) != _unit(module))
    cycles = _cycles(dict(units))
    assert not cycles, f"import cycles between dvml packages:\n{_format(cycles)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module: str) -> None:
    rank = {unit: k for k, layer in enumerate(LAYERS) for unit in layer}
    unit = _unit(module)
    assert unit in rank, f"{unit} is in no layer: add it to LAYERS and docs/architecture.md"
    upward = sorted(
        t for t in GRAPH[module] if _unit(t) != unit and rank.get(_unit(t), -1) >= rank[unit]
    )
    assert not upward, (
        f"{module} (layer {rank[unit]}) imports {upward}, which are not in a lower layer"
    )
