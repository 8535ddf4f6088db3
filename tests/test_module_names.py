"""Every dvml module has a name that a grep finds once (issue 15, item 5).

Three ``local.py`` with three meanings, or ``registry/store.py`` beside the ``store`` package,
send a reader to the wrong file. Pure: reads file names only.
"""

from __future__ import annotations

import collections
import pathlib

import dvml

ROOT = pathlib.Path(dvml.__file__).parent


def _modules() -> list[pathlib.Path]:
    return [p for p in ROOT.rglob("*.py") if p.stem not in ("__init__", "__main__")]


def test_no_module_basename_repeats() -> None:
    # A leading underscore only marks a module private: "_attach" and "attach" are one name.
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules():
        by_name[path.stem.lstrip("_")].append(str(path.relative_to(ROOT)))
    repeated = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert repeated == {}, f"module names used more than once: {repeated}"


def test_no_module_is_named_like_a_package() -> None:
    packages = {p.parent.name for p in ROOT.rglob("__init__.py")} - {ROOT.name}
    clashes = sorted(str(p.relative_to(ROOT)) for p in _modules() if p.stem.lstrip("_") in packages)
    assert clashes == [], f"modules named like a dvml package: {clashes}"
