"""MADlib's automl_method / automl_params (dvml.search.automl_params): defaults, parsing, and
MADlib's refusals before anything runs. Pure."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from dvml.exceptions import ArgumentError, ArgumentTypeError
from dvml.search import automl_params as ap

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("hyperband", None, ap.HyperbandParams(6, 3, 0)),  # MADlib's default 'R=6, eta=3, ...'
        ("hyperband", "", ap.HyperbandParams(6, 3, 0)),
        ("hyperband", "R=81, eta=3, skip_last=1", ap.HyperbandParams(81, 3, 1)),
        ("HyperBand", " R = 9 ,eta=3", ap.HyperbandParams(9, 3, 0)),
        ("hyperband", {"R": 27}, ap.HyperbandParams(27, 3, 0)),
        ("hyperopt", None, ap.HyperoptParams(20, 5, "tpe")),
        ("hyperopt", "num_configs=5, num_iterations=2, algorithm=rand",
         ap.HyperoptParams(5, 2, "rand")),
        ("hyperopt", "NUM_CONFIGS=3, Algorithm=TPE", ap.HyperoptParams(3, 5, "tpe")),
        ("asha", None, ap.AshaParams()),
        ("asha", "max_t=27, eta=3, grace_period=1, max_configs=50, time_budget_s=60.5, "
         "sampler=tpe", ap.AshaParams(27, 3, 1, 50, 60.5, "tpe")),
    ],
)  # fmt: skip
def test_parses(method: str, params: object, expected: object) -> None:
    parsed = ap.parse_automl_params(method, params)  # type: ignore[arg-type]
    assert parsed == expected
    # the canonical text parses back to the same values (stored in .summary's automl_params)
    assert ap.parse_automl_params(method, parsed.text()) == parsed


@pytest.mark.parametrize(
    ("method", "params", "error", "message"),
    [
        ("grid", None, ArgumentError, "Unknown automl method.*'grid'"),
        (None, None, ArgumentError, "Unknown automl method"),
        ("hyperopt", "num_configs=0", ArgumentError, "num_configs and num_iterations must be > 0"),
        ("hyperopt", "num_configs=-2", ArgumentError, "must be > 0.*num_configs=-2"),
        ("hyperopt", "num_iterations=0", ArgumentError, "must be > 0.*num_iterations=0"),
        ("hyperopt", "algorithm=atpe", ArgumentError, "valid algorithms are 'rand' and 'tpe'"),
        ("hyperopt", "num_configs=five", ArgumentError, "num_configs must be an integer"),
        ("hyperopt", "R=3", ArgumentError, r"Invalid automl_params for hyperopt: \['r'\]"),
        ("hyperband", "eta=1", ArgumentError, "eta must be greater than 1"),
        ("hyperband", "R=2", ArgumentError, "R should not be less than eta"),
        ("hyperband", "R=9, skip_last=3", ArgumentError, "skip_last must be non-negative"),
        ("hyperband", "r=9", ArgumentError, r"Only R, eta, skip_last may be given"),
        ("hyperband", "R=9.5", ArgumentError, "R must be an integer"),
        ("hyperband", "R", ArgumentError, "must be key=value pairs"),
        ("hyperband", "R=9, R=27", ArgumentError, "gives R twice"),
        ("hyperband", 9, ArgumentTypeError, "must be a string of key=value pairs or a dict"),
        ("asha", "eta=1", ArgumentError, "eta must be greater than 1"),
        ("asha", "grace_period=10, max_t=9", ArgumentError, "1 <= grace_period <= max_t"),
        ("asha", "max_configs=0", ArgumentError, "max_configs must be at least 1"),
        ("asha", "time_budget_s=-1", ArgumentError, "time_budget_s must be a positive number"),
        ("asha", "time_budget_s=nan", ArgumentError, "time_budget_s must be a positive number"),
        ("asha", "sampler=grid", ArgumentError, r"sampler must be one of \['random', 'tpe'\]"),
    ],
)
def test_refuses(method: object, params: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        ap.parse_automl_params(method, params)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError | TypeError)
    assert "Received" in str(caught.value)


def test_tpe_without_optuna_is_refused_with_the_install_command() -> None:
    # A Python whose path has no site-packages: Optuna (and everything else installed) is
    # absent; dvml.search.automl_params needs only the standard library and dvml.
    code = (
        "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]\n"
        "from dvml.search.automl_params import parse_automl_params\n"
        "print(parse_automl_params('hyperopt', 'algorithm=rand').algorithm)\n"
        "for method, params in (('hyperopt', 'algorithm=tpe'), ('asha', 'sampler=tpe')):\n"
        "    try:\n"
        "        parse_automl_params(method, params)\n"
        "    except ValueError as exc:\n"
        "        print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.splitlines()
    assert out[0] == "rand"
    assert len(out) == 3
    for line in out[1:]:
        assert line.startswith("ArgumentError") and "Optuna is not installed" in line
        assert "pip install 'dvml[automl]'" in line
