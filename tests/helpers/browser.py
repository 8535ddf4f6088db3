"""A page as a real headless browser renders it (Debian's chromium, which ./scripts/check
installs): its visible text after its scripts ran, and optionally a screenshot."""

from __future__ import annotations

import html.parser
import json
import pathlib
import shutil
import subprocess
import urllib.request
from typing import Any

__all__ = ["ARTIFACTS", "get_json", "rendered_text", "visible_text"]

ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts"
"""Where tests keep what a person may want to look at after a run (screenshots)."""


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def visible_text(document: str) -> str:
    """The text a reader sees in an HTML document (no script or style), whitespace collapsed."""
    text = _Text()
    text.feed(document)
    return " ".join(" ".join(text.parts).split())


def rendered_text(url: str, tmp: pathlib.Path, screenshot: pathlib.Path | None = None) -> str:
    """The visible text of ``url`` in headless chromium, 3 s (virtual time) after it loaded,
    whitespace collapsed; ``screenshot`` also saves a 1280x1400 PNG of it there."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: ./scripts/check installs it"
    extra = [f"--screenshot={screenshot}"] if screenshot is not None else []
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1400",
           "--disable-background-networking", "--disable-component-update", "--no-first-run",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=3000",
           "--dump-dom", *extra, url]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)
    return visible_text(done.stdout)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)
