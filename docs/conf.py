"""Sphinx configuration of dvml's documentation site (built by ``./scripts/docs``).

Nothing here copies a docstring: the API reference is generated from ``dvml.__all__`` and the
public sub-namespaces (``docs/_ext/dvml_docs.py`` writes the autosummary pages at build time),
the CLI reference from ``dvml.cli.reference_parser``, and the notebooks are rendered from the
copies the notebook tests executed (``docs/_build/executed/``) when there are any, never
executed here: running them needs a cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # the dvml of this checkout, not an installed one

import dvml  # noqa: E402

project = "dvml"
author = "the dvml developers"
copyright = "the dvml developers"
release = dvml.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",  # Markdown pages (myst-parser) and notebooks
    "sphinxarg.ext",
    "sphinx_copybutton",
    "dvml_docs",
]

exclude_patterns = ["_build", "_ext", "_templates", "**.ipynb_checkpoints"]
templates_path = ["_templates"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# -- API reference --------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False  # the class template lists members with autodoc
numpydoc_class_members_toctree = False
# Docstring format errors fail the build (-W): numpydoc warns on unknown sections, bad
# headers and the like. GL08: a public name without a docstring.
numpydoc_validation_checks = {"GL08"}
numpydoc_validation_exclude = {r"\.__init__$", r"\.__enter__$", r"\.__exit__$"}

# -- Markdown and notebooks ------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # README-style links to #section-anchors resolve
nb_execution_mode = "off"  # outputs come from the notebook tests; see dvml_docs
nb_merge_streams = True
suppress_warnings = [
    # The notebooks' first cells are Markdown titles at level 1 then 3 in places.
    "myst.header",
    # myst asks every domain to resolve a Markdown link; sphinx-argparse's cannot answer.
    "myst.domains",
    # workflows/README.md shows a crontab as ```cron, which Pygments has no lexer for: the block
    # is shown without colours, nothing is lost.
    "misc.highlighting_failure",
]

# -- HTML ------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"dvml {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path: list[str] = []
html_show_sourcelink = False

nitpicky = True
