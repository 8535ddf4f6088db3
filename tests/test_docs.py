"""The documentation site: it builds with no warning, every public name has a reference page,
every internal link resolves, and pages render in a real headless browser.

Run alone with ``pytest tests/test_docs.py`` (or ``-m docs``). The site is built once per run
into a temporary directory (about 30 s on 2 busy cores), unless ``DVML_DOCS_HTML`` names a
site that this run already built with warnings as errors (``scripts/check`` does, then sets it).
No cluster is started: notebooks are rendered, never executed.
"""

from __future__ import annotations

import html.parser
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

import dvml
from tests.helpers.browser import visible_text

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

pytestmark = pytest.mark.docs


def _extension():  # docs/_ext/dvml_docs.py, the build's own list of pages
    spec = importlib.util.spec_from_file_location("dvml_docs", DOCS / "_ext" / "dvml_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site: ``DVML_DOCS_HTML`` when given, else a fresh build, warnings as errors."""
    given = os.environ.get("DVML_DOCS_HTML")
    if given:
        return Path(given).resolve()
    out = tmp_path_factory.mktemp("docs")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q",
           "-j", "auto", "-d", str(out / "doctrees"), str(DOCS), str(out / "html")]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout}\n{done.stderr}"
    return out / "html"


def test_site_has_the_pages_of_the_issue(site: Path) -> None:
    pages = ["index", "getting-started", "concepts/index", "concepts/cluster",
             "concepts/datasets", "concepts/distribution-rules", "concepts/trainers",
             "concepts/runtime", "concepts/registry", "guides/data-sources", "guides/fit",
             "guides/fit-multiple", "guides/model-search", "guides/transfer-learning",
             "guides/cli-and-workflows", "guides/several-hosts", "guides/safety",
             "guides/troubleshooting", "madlib", "benchmarks", "api/index", "cli",
             "configuration", "architecture", "changelog", "examples"]  # fmt: skip
    missing = [p for p in pages if not (site / f"{p}.html").is_file()]
    assert not missing, f"pages not built: {missing}"
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks and all((site / "notebooks" / f"{n}.html").is_file() for n in notebooks)


def test_every_public_name_has_a_reference_page(site: Path) -> None:
    ext = _extension()
    missing = []
    for name in dvml.__all__:
        if name in ext.NAMESPACES or name in dvml._MODULES:
            page, anchor = site / "api" / f"dvml.{name}.html", f"module-dvml.{name}"
        else:
            page, anchor = site / "api" / "generated" / f"dvml.{name}.html", f"dvml.{name}"
        if not page.is_file() or f'id="{anchor}"' not in page.read_text():
            missing.append(name)
    for stub in ext.stub_names():
        page = site / "api" / "generated" / stub.replace(".rst", ".html")
        if not page.is_file() or f'id="{stub[: -len(".rst")]}"' not in page.read_text():
            missing.append(stub)
    assert not missing, f"public names without a reference page: {missing}"
    assert len(ext.stub_names()) > len(dvml.__all__)  # the sub-namespaces' names are in


def test_cli_reference_has_every_command(site: Path) -> None:
    from dvml.cli import reference_parser

    text = (site / "cli.html").read_text()
    groups = reference_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    commands = [f"dvml-{g}-{c}" for g, p in groups.items() for c in _subcommands(p)]
    assert groups and commands
    # sphinx-argparse gives each group and command a section, id "dvml-<group>-<command>"
    missing = [c for c in [*(f"dvml-{g}" for g in groups), *commands]
               if f'<section id="{c}"' not in text]  # fmt: skip
    assert not missing, f"commands missing from the CLI reference: {missing}"


def _subcommands(parser) -> list[str]:  # type: ignore[no-untyped-def]
    actions = getattr(parser, "_subparsers", None)
    return list(actions._group_actions[0].choices) if actions is not None else []


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("href", "src") and value:
                self.links.append(value)
            if key in ("id", "name") and value:
                self.ids.add(value)


def _parse(path: Path, cache: dict[Path, _Links]) -> _Links:
    if path not in cache:
        parser = _Links()
        parser.feed(path.read_text(errors="replace"))
        cache[path] = parser
    return cache[path]


def test_every_internal_link_resolves(site: Path) -> None:
    cache: dict[Path, _Links] = {}
    broken, checked = [], 0
    for page in sorted(p for p in site.rglob("*.html") if "_static" not in p.parts):
        for link in _parse(page, cache).links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue  # external: not this test's business (no network here)
            target = (page.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path \
                else page  # fmt: skip
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.is_file() or site.resolve() not in target.parents:
                broken.append(f"{page.relative_to(site)}: {link}")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and urllib.parse.unquote(parts.fragment) not in _parse(target, cache).ids
            ):
                broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert checked > 1000, f"only {checked} internal links found: is the site complete?"
    assert not broken, f"{len(broken)} broken internal links:\n" + "\n".join(broken[:40])


def test_executed_notebook_copies_are_used_only_when_current(tmp_path: Path) -> None:
    ext = _extension()
    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir()
    executed.mkdir()
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# Title"},
             {"cell_type": "code", "metadata": {}, "source": "1 + 1", "outputs": [],
              "execution_count": None}]  # fmt: skip
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 4}
    for name in ("current.ipynb", "stale.ipynb", "never_run.ipynb"):
        (notebooks / name).write_text(json.dumps(notebook))
    ran = json.loads(json.dumps(notebook))
    ran["cells"][1]["outputs"] = [{"output_type": "execute_result", "metadata": {},
                                   "data": {"text/plain": "2"}, "execution_count": 1}]  # fmt: skip
    (executed / "current.ipynb").write_text(json.dumps(ran))
    ran["cells"][1]["source"] = "1 + 2"  # the notebook changed after the tests ran
    (executed / "stale.ipynb").write_text(json.dumps(ran))

    pages = ext.notebook_pages(notebooks, executed)

    current, used = pages["current.ipynb"]
    assert used and current["cells"][1]["outputs"][0]["data"] == {"text/plain": "2"}
    for name in ("stale.ipynb", "never_run.ipynb"):
        page, used = pages[name]
        assert not used
        assert "without its outputs" in page["cells"][1]["source"]
        assert all(not c.get("outputs") for c in page["cells"] if c["cell_type"] == "code")


# -- a real browser --------------------------------------------------------------------------

ERROR_TEXT = ("404", "Traceback", "Error response", "Not Found", "ERR_", "can\u2019t be reached",
              "WARNING:", "ERROR:")  # fmt: skip


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1 (a free port), as a user's browser would get it."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, (
        "chromium is not installed: ./scripts/check installs it (apt-get install chromium)"
    )
    return found


def _browse(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
           *extra, url]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("index.html", "Dask + Vineyard for deep learning"),
        ("api/generated/dvml.fit.html", "num_iterations"),
    ],
)
def test_page_renders_in_headless_chromium(
    served: str, page: str, expected: str, tmp_path: Path
) -> None:
    from PIL import Image, ImageStat

    url = f"{served}/{page}"
    shot = tmp_path / "page.png"
    done = _browse(url, tmp_path, f"--screenshot={shot}")
    assert shot.is_file(), f"chromium wrote no screenshot of {url}:\n{done.stderr[-2000:]}"
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        grey = image.convert("L")
        spread = ImageStat.Stat(grey).stddev[0]
        dark = sum(grey.histogram()[:128]) / (image.size[0] * image.size[1])
    # A blank page is one colour (spread 0); a rendered one has text in dark pixels.
    assert spread > 10, f"{page}: the screenshot is almost one colour (stddev {spread:.1f})"
    assert dark > 0.005, f"{page}: almost no dark pixels ({dark:.2%}): no text was drawn"

    dom = _browse(url, tmp_path, "--dump-dom").stdout
    visible = visible_text(dom)
    assert expected in visible, f"{page}: {expected!r} is not on the page: {visible[:500]}"
    found = [e for e in ERROR_TEXT if e in visible]
    assert not found, f"{page} shows error text {found}: {visible[:1000]}"


def test_readme_is_the_front_page() -> None:
    """Under 200 lines, and every relative link in it leads to a file (the site's pages)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200, "README.md is the front page: keep it under 200 lines"
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [urllib.parse.urlsplit(link).path for link in links if "://" not in link]
    missing = [path for path in local if path and not (ROOT / path).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
    pages = {path for path in local if path.startswith("docs/") and path.endswith(".md")}
    guides = {p.relative_to(ROOT).as_posix() for p in (DOCS / "guides").glob("*.md")}
    assert guides <= pages, f"guides the README does not link to: {sorted(guides - pages)}"
