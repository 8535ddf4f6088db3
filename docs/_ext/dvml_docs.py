"""Sphinx extension that writes the generated sources of dvml's site before the build reads them.

* ``api/``: one autosummary page for ``dvml.__all__`` (grouped by the module that defines each
  name) and one per public sub-namespace (``dvml.datasets``, ``dvml.features``,
  ``dvml.exceptions``). The names come from the code, so a new public name gets a page without
  editing the docs, and ``tests/test_docs.py`` checks that each one has.
* ``notebooks/``: the notebooks of ``notebooks/``. A copy that ``tests/test_notebooks.py``
  executed (``docs/_build/executed/NAME.ipynb``) is used when its code cells are those of the
  notebook in git; otherwise the stripped notebook, with a note saying how to get the outputs.
  Nothing is executed here: the notebooks need a cluster.

Both folders are git-ignored and rewritten on every build.
"""

from __future__ import annotations

import builtins
import importlib
import json
import pkgutil
import shutil
import sys
import types
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
API_DIR = DOCS / "api"
NOTEBOOK_DIR = DOCS / "notebooks"
EXECUTED_DIR = DOCS / "_build" / "executed"

# Section titles of the top-level reference, by the module that defines the names. A name from
# a module missing here still gets a page, under "Other".
SECTIONS: dict[str, str] = {
    "dvml.cluster": "Clusters",
    "dvml.placement": "Distribution rules",
    "dvml.preprocess.api": "Preprocessing",
    "dvml.store.datasets": "Datasets",
    "dvml.train.fit": "Training",
    "dvml.train.fit_multiple": "Training",
    "dvml.train.model": "Training",
    "dvml.train.predict": "Evaluation and prediction",
    "dvml.train.model_selection": "Model selection tables",
    "dvml.registry": "Model registry",
    "dvml.exceptions": "Errors",
}

# Public sub-namespaces users import, as ``dvml.<name>``, and the module behind each.
NAMESPACES: dict[str, str] = {
    "datasets": "dvml.preprocess.datasets_api",
    "features": "dvml.features",
    "exceptions": "dvml.exceptions",
    "plan": "dvml.memory_plans",
}


def alias_namespaces() -> None:
    """Make ``dvml.datasets`` importable by that name, as autodoc imports what it documents.

    ``dvml.datasets`` is an attribute of ``dvml`` (``dvml/__init__.py`` loads it on first use),
    not a module file; registering the module under that name in this build process lets the
    reference show the names users type.
    """
    for name, module in NAMESPACES.items():
        sys.modules.setdefault(f"dvml.{name}", importlib.import_module(module))


def _summary(names: list[str], toctree: str = "generated") -> list[str]:
    lines = [".. autosummary::", f"   :toctree: {toctree}", ""]
    lines += [f"   {n}" for n in names]
    return [*lines, ""]


def _heading(text: str, char: str) -> list[str]:
    return [text, char * len(text), ""]


def api_pages() -> dict[str, str]:
    """The reST text of every generated reference page, by file name under ``api/``."""
    import dvml

    exports: dict[str, str] = dict(dvml._EXPORTS)  # the lazy-import table of dvml/__init__.py
    modules = [n for n in dvml.__all__ if n in NAMESPACES or n in dvml._MODULES]
    groups: dict[str, list[str]] = {}
    for name in dvml.__all__:
        if name in modules:
            continue
        title = "Version" if name == "__version__" else SECTIONS.get(exports.get(name, ""), "Other")
        groups.setdefault(title, []).append(name)
    order = list(dict.fromkeys([*SECTIONS.values(), "Other", "Version"]))
    top = [
        *_heading("API reference", "="),
        "Every public name of :mod:`dvml` (``dvml.__all__``) and of its public sub-namespaces,",
        "generated from the docstrings.",
        "",
        ".. automodule:: dvml",
        "   :no-members:",
        "",
        ".. toctree::",
        "   :maxdepth: 1",
        "   :caption: Sub-namespaces",
        "",
        *[f"   dvml.{n}" for n in sorted(set(modules) | set(NAMESPACES))],
        "",
        ".. currentmodule:: dvml",
        "",
    ]
    for title in order:
        if title in groups:
            top += _heading(title, "-") + _summary(sorted(groups[title], key=str.lower))
    pages = {"index.rst": "\n".join(top)}
    for name in sorted(set(modules) | set(NAMESPACES)):
        module = importlib.import_module(NAMESPACES.get(name, dvml._MODULES.get(name, "")))
        members = [m for m in getattr(module, "__all__", []) if not _shared(dvml, module, m)]
        shared = [m for m in getattr(module, "__all__", []) if _shared(dvml, module, m)]
        text = [
            *_heading(f"dvml.{name}", "="),
            f".. automodule:: dvml.{name}",
            "   :no-members:",
            "",
            f".. currentmodule:: dvml.{name}",
            "",
        ]
        if shared:
            refs = ", ".join(f":obj:`dvml.{m}`" for m in shared)
            text += [f"Also here, documented at the top level: {refs}.", ""]
        text += _summary(sorted(members, key=str.lower))
        pages[f"dvml.{name}.rst"] = "\n".join(text)
    return pages


def stub_names() -> list[str]:
    """The file name of every autosummary stub: one per documented public name."""
    import dvml

    names = [
        f"dvml.{n}.rst" for n in dvml.__all__ if n not in NAMESPACES and n not in dvml._MODULES
    ]
    for name in sorted(set(NAMESPACES) | set(dvml._MODULES)):
        module = importlib.import_module(NAMESPACES.get(name, dvml._MODULES.get(name, "")))
        names += [
            f"dvml.{name}.{m}.rst"
            for m in getattr(module, "__all__", [])
            if not _shared(dvml, module, m)
        ]
    return names


def _shared(dvml: Any, module: Any, name: str) -> bool:
    """Whether ``module.name`` is the top-level ``dvml.name`` (documented there), not a name
    of its own that happens to be spelt the same (``dvml.plan.fit`` is not ``dvml.fit``)."""
    return name in dvml.__all__ and getattr(module, name) is getattr(dvml, name)


def _code_sources(notebook: dict[str, Any]) -> list[str]:
    return [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in notebook["cells"]
        if c["cell_type"] == "code"
    ]


def _note_cell(text: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _with_cell_ids(notebook: dict[str, Any]) -> dict[str, Any]:
    """Give cells without an ``id`` one (nbformat 4.5 wants them; the notebooks predate it)."""
    for number, cell in enumerate(notebook["cells"]):
        cell.setdefault("id", f"cell-{number}")
    notebook["nbformat_minor"] = max(int(notebook.get("nbformat_minor", 0)), 5)
    return notebook


def notebook_pages(
    notebooks: Path = ROOT / "notebooks", executed_dir: Path = EXECUTED_DIR
) -> dict[str, tuple[dict[str, Any], bool]]:
    """Each notebook to render, by file name, and whether it carries executed outputs.

    An executed copy whose code cells differ from the notebook's (the notebook changed since
    the tests ran) is not used: its outputs would not be those of the code shown.
    """
    pages: dict[str, tuple[dict[str, Any], bool]] = {}
    for path in sorted(notebooks.glob("*.ipynb")):
        stripped = json.loads(path.read_text())
        executed_path = executed_dir / path.name
        if executed_path.is_file():
            executed = json.loads(executed_path.read_text())
            if _code_sources(executed) == _code_sources(stripped):
                pages[path.name] = (_with_cell_ids(executed), True)
                continue
        note = (
            ":::{note}\nThis page shows the notebook without its outputs: run "
            "`pytest tests/test_notebooks.py` (it needs a local cluster) and build the site "
            "again to see them.\n:::\n"
        )
        stripped["cells"].insert(1 if stripped["cells"] else 0, _note_cell(note))
        pages[path.name] = (_with_cell_ids(stripped), False)
    return pages


def _rewrite(
    folder: Path, files: dict[str, str], keep: frozenset[str] | set[str] = frozenset()
) -> None:
    """Make ``folder`` hold ``files`` (and the names in ``keep``), touching only files whose
    text changed, so that a second build re-reads only what changed."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.name not in files and path.name not in keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for name, text in files.items():
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)


def write_sources(app: Any, config: Any) -> None:
    """``config-inited``: write ``api/`` and ``notebooks/`` before Sphinx looks for sources."""
    alias_namespaces()
    pages = api_pages()
    _rewrite(API_DIR, pages, keep={"generated"})
    # autosummary writes generated/ next (only stubs whose text changed); a stub of a name that
    # is no longer public would be a page outside every toctree, so it goes.
    _rewrite(API_DIR / "generated", {}, keep=set(stub_names()))
    notebooks = notebook_pages()
    _rewrite(NOTEBOOK_DIR, {n: json.dumps(nb, indent=1) for n, (nb, _) in notebooks.items()})
    executed = sorted(n for n, (_, done) in notebooks.items() if done)
    print(f"dvml_docs: notebooks with outputs: {executed or 'none'}")


_MISSING = object()


def _import(name: str) -> Any:
    try:
        return pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError):
        return getattr(builtins, name, _MISSING) if "." not in name else _MISSING


def _contexts(node: Any) -> list[str]:
    """Where an unqualified target may live: the page's module and class, and the module that
    defines the documented object (``dvml.Dataset``'s docstring is written in
    ``dvml.store.datasets``, where ``describe`` means ``dvml.datasets.describe``)."""
    module, cls = node.get("py:module") or "", node.get("py:class") or ""
    found = [f"{module}.{cls}" if module and cls else cls, module]
    documented = _import(str(node.get("refdoc", "")).rsplit("/", 1)[-1])
    if documented is not _MISSING and not isinstance(documented, types.ModuleType):
        found.append(getattr(documented, "__module__", None) or "")
    return [c for c in found if c]


_PUBLIC: dict[int, str] = {}


def _public_names(env: Any) -> dict[int, str]:
    """``id(object)`` -> the name the reference documents it under (the shortest).

    Computed once, on the first missing reference: references are resolved after every page
    was read, so the Python domain then holds every documented object."""
    if _PUBLIC:
        return _PUBLIC
    names = _PUBLIC
    for name in sorted(env.get_domain("py").objects, key=len, reverse=True):
        obj = _import(name)
        if callable(obj) or isinstance(obj, types.ModuleType):
            names[id(obj)] = name
    return names


def resolve_internal(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """``missing-reference``: a docstring's reference to a name the reference does not document.

    Docstrings name internal modules and functions (``dvml.registry.custom``) and the standard
    library. Such a reference links to the public page of the same object when there is one
    (``dvml.registry.register_custom_function`` is ``dvml.register_custom_function``), and
    is shown as code when the object exists but is not public. A reference to nothing that
    Python can import is left alone, so Sphinx reports it (and ``-W`` fails the build).
    """
    if node.get("refdomain") != "py":
        return None
    target = str(node["reftarget"]).lstrip("~.")
    for context in ["", *_contexts(node)]:
        obj = _import(f"{context}.{target}" if context else target)
        if obj is not _MISSING:
            break
    else:
        return None
    public = (
        _public_names(env).get(id(obj))
        if callable(obj) or isinstance(obj, types.ModuleType)
        else None
    )
    if public:
        domain = env.get_domain("py")
        kind = node.get("reftype", "obj")
        found = domain.resolve_xref(env, node["refdoc"], app.builder, kind, public, node, contnode)
        if found is None:
            found = domain.resolve_xref(
                env, node["refdoc"], app.builder, "obj", public, node, contnode
            )
        if found is not None:
            return found
    return contnode


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", write_sources)
    app.connect("missing-reference", resolve_internal)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
