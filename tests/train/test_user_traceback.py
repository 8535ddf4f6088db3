"""A train_fn's error as dvml.run shows it (pure: the trainer's formatting, in this process).

The function is compiled from a string under a made-up file name, as a notebook cell or an
exec'd script is: the client's linecache has its lines, a trainer's has not until they are
shipped with the function.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any

import pytest

from dvml.train.runtime.shipped import register_sources, source_texts
from dvml.train.runtime.user_program import user_traceback

FILENAME = "<dynamic-code-test-user-traceback>"
SOURCE = """\
def helper(n):
    return {"a": 1}[n]  # the user's failing line


def train_fn(context):
    total = 0
    total += helper("missing")
    return total
"""


def _user_function() -> Callable[[Any], Any]:
    namespace: dict[str, Any] = {}
    exec(compile(SOURCE, FILENAME, "exec"), namespace)
    return namespace["train_fn"]  # type: ignore[no-any-return]


@pytest.fixture
def client_side_source() -> Any:
    lines = SOURCE.splitlines(keepends=True)
    linecache.cache[FILENAME] = (len(SOURCE), None, lines, FILENAME)
    yield
    linecache.cache.pop(FILENAME, None)


def _in_dvml(source: str) -> dict[str, Any]:
    """Functions compiled as if they were dvml's own code (their frames are dvml's)."""
    from dvml.train.runtime import user_program

    namespace: dict[str, Any] = {}
    exec(compile(source, user_program.__file__, "exec"), namespace)
    return namespace


# The trainer's call of train_fn: a dvml frame above the user's, where the error is caught.
TRAINER_CALL = """\
def call(fn, arg, fmt):
    try:
        fn(arg)
    except Exception as exc:
        return fmt(exc)
"""


def test_a_train_fn_error_shows_the_users_lines_and_no_trainer_frames(
    client_side_source: None,
) -> None:
    import cloudpickle

    train_fn = _user_function()
    shipped = source_texts(train_fn)  # on the client
    assert shipped["files"] == {FILENAME: SOURCE}
    assert sorted(shipped["functions"]) == [["helper", 1, FILENAME], ["train_fn", 5, FILENAME]]
    # In a trainer: cloudpickle named the file <dynamic-code>, and nobody knows the cell...
    train_fn = cloudpickle.loads(cloudpickle.dumps(train_fn))
    assert train_fn.__code__.co_filename == "<dynamic-code>"
    linecache.cache.pop(FILENAME)
    register_sources(train_fn, shipped)  # ...until the job brings it
    linecache.checkcache()  # what traceback does first: the shipped lines must survive it
    text = _in_dvml(TRAINER_CALL)["call"](train_fn, None, user_traceback)
    assert 'total += helper("missing")' in text
    assert 'return {"a": 1}[n]  # the user\'s failing line' in text
    assert "fn(arg)" not in text and "user_program.py" not in text
    assert text.startswith("Traceback (most recent call last):")
    assert text.endswith("KeyError: 'missing'")
    assert "not shown" not in text


def test_dvml_frames_below_the_users_are_trimmed_with_a_note() -> None:
    """train_fn called into dvml, which failed two calls deeper: the call into dvml stays,
    the frame below it is one line."""
    dvml_code = _in_dvml(
        TRAINER_CALL + "def entry():\n    deeper()\n\n\ndef deeper():\n"
        "    raise ValueError('deep inside')\n"
    )

    def train_fn(context: Any) -> None:
        dvml_code["entry"]()

    text = dvml_code["call"](train_fn, None, user_traceback)
    assert 'dvml_code["entry"]()' in text  # the user's line
    assert "in entry" in text and "in deeper" not in text
    assert "(1 frame(s) inside dvml not shown)" in text
    assert text.endswith("ValueError: deep inside")
