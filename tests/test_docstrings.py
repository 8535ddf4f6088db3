"""Every public name has a numpydoc docstring whose sections match the code (issue 41, item 4).

The walk covers what the API reference documents (``docs/_ext/dvml_docs.py``): ``dvml.__all__``,
the public names of ``dvml.datasets``, ``dvml.features``, ``dvml.plan`` and
``dvml.exceptions``, and the public methods and properties of every public class
(``dvml.Registry``, ``dvml.LocalCluster``, ``dvml.Dataset``, ...). Deprecated aliases
(``dvml.deprecation.renamed``) are left out: they point at the new name.

Each docstring is checked by numpydoc's own validator (``numpydoc.validate.validate``) for
:data:`CHECKS`. A ratchet, like ``tests/test_size_limits.py``: the names that failed when the
check came in are listed in :data:`CEILINGS` with the checks they failed. The list may only
shrink: a new failure fails, and a listed entry that now passes fails until it is removed.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest
from numpydoc.validate import validate

import dvml
import dvml.exceptions

CHECKS: dict[str, str] = {
    "GL06": "an unknown section",
    "GL07": "sections in the wrong order",
    "GL08": "no docstring",
    "SS01": "no one-line summary",
    "PR01": "a parameter of the signature not documented",
    "PR02": "a documented parameter the signature does not have",
    "PR03": "parameters documented in another order than the signature's",
    "PR04": "a parameter without a type",
    "RT01": "no Returns section where the function returns a value",
    "YD01": "no Yields section in a generator",
}

# Issue 41: the names that failed when the check came in, with the checks they failed. This
# list may only shrink.
CEILINGS: dict[str, set[str]] = {}


def _members(path: str, cls: type) -> list[str]:
    """The public methods and properties of ``cls`` (and of its dvml bases)."""
    found = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("dvml"):
            continue  # object, Exception, dict: documented by Python
        for name, value in vars(klass).items():
            if name.startswith("_") or hasattr(value, "__deprecated_alias_of__"):
                continue
            value = getattr(value, "__func__", value)  # staticmethod, classmethod
            if inspect.isfunction(value) or isinstance(value, property):
                found.append(f"{path}.{name}")
    return found


def public_names() -> list[str]:
    """The dotted name, as users type it, of every documented public function and class."""
    found: list[str] = []

    def add(path: str, obj: Any) -> None:
        if inspect.isclass(obj):
            found.extend([path, *_members(path, obj)])
        elif callable(obj):
            found.append(path)  # constants (dvml.features.KIND) have no docstring of their own

    namespaces = {"exceptions": dvml.exceptions}
    for name in dvml.__all__:
        obj = getattr(dvml, name)
        if isinstance(obj, types.ModuleType):
            namespaces[name] = obj
        elif name != "__version__":
            add(f"dvml.{name}", obj)
    for space, module in namespaces.items():
        for name in module.__all__:
            obj = getattr(module, name)
            if getattr(dvml, name, None) is not obj:  # documented at the top level
                add(f"dvml.{space}.{name}", obj)
    return sorted(set(found))


def failures_of(name: str) -> set[str]:
    """The checks of :data:`CHECKS` that ``name``'s docstring fails."""
    return {code for code, _ in validate(name)["errors"] if code in CHECKS}


@pytest.fixture(scope="module")
def failures() -> dict[str, set[str]]:
    found = {name: failures_of(name) for name in public_names()}
    return {name: codes for name, codes in found.items() if codes}


def _explain(codes: set[str]) -> str:
    return ", ".join(f"{c} ({CHECKS[c]})" for c in sorted(codes))


def test_no_new_docstring_failure(failures: dict[str, set[str]]) -> None:
    new = {
        name: _explain(codes - CEILINGS.get(name, set()))
        for name, codes in failures.items()
        if codes - CEILINGS.get(name, set())
    }
    assert new == {}, (
        "public docstrings that fail numpydoc's validation (python -m numpydoc.hooks or "
        f"numpydoc.validate.validate(NAME) shows the details): {new}"
    )


def test_ceilings_only_shrink(failures: dict[str, set[str]]) -> None:
    fixed = {
        name: sorted(codes - failures.get(name, set()))
        for name, codes in CEILINGS.items()
        if codes - failures.get(name, set())
    }
    assert fixed == {}, f"these now pass: remove them from CEILINGS in {__file__}: {fixed}"


def test_the_walk_covers_the_reference() -> None:
    names = set(public_names())
    for expected in ("dvml.fit", "dvml.datasets.drop", "dvml.features.load", "dvml.plan.pack",
                     "dvml.Registry.drop_model", "dvml.LocalCluster", "dvml.Dataset.rows",
                     "dvml.exceptions.RegistryNotFoundError"):  # fmt: skip
        assert expected in names, expected
    assert "dvml.Registry.delete_model" not in names  # a deprecated alias
    assert set(CEILINGS) <= names, sorted(set(CEILINGS) - names)


def undocumented_example(a: int, b: int = 0) -> int:
    """Add two numbers.

    Parameters
    ----------
    a : int
        A number.
    c : int
        Not a parameter.

    Notes and more
    --------------
    Not a numpydoc section.
    """
    return a + b


def test_the_check_finds_what_it_says() -> None:
    with pytest.warns(UserWarning, match="Unknown section"):  # numpydoc's parser says so too
        found = failures_of(f"{__name__}.undocumented_example")
    assert found == {"PR01", "PR02", "RT01", "GL06", "GL07"}
