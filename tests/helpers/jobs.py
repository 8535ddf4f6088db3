"""Job files (YAML) and the commands that run them: ``python -m dvml`` and the workflows."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping

__all__ = [
    "ADAM",
    "REPO",
    "digits_job",
    "dvml_command",
    "one_error_line",
    "with_state_dir",
    "write_job",
]

REPO = pathlib.Path(__file__).resolve().parents[2]
ADAM = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"


def digits_job(
    name: str,
    registry: str,
    *,
    state_dir: pathlib.Path | str | None = None,
    scheduler: str | None = None,
    compile_params: str = ADAM,
    fit_params: str | None = None,
    validation_split: float | None = None,
    promotion_metric: str | None = None,
) -> str:
    """The text of a job file that trains the built-in digits CNN on scikit-learn's digits.

    Sections and keys are written in a fixed order, one per line, so that a test can edit the
    text with ``str.replace`` (a misspelt key, a wrong type, a removed line).
    """
    lines = [f"name: {name}"]
    if state_dir is not None:
        lines.append(f"state_dir: {state_dir}")
    lines.append(f"registry: {registry}")
    if scheduler is not None:
        lines += ["cluster:", f"  scheduler: {scheduler}"]
    lines += ["data:", "  source: sklearn:digits", "  normalizing_const: 16.0"]
    if validation_split is not None:
        lines += ["validation:", f"  split: {validation_split}"]
    lines += [
        "model:",
        "  architecture: builtin:digits-cnn",
        f'  compile_params: "{compile_params}"',
    ]
    if fit_params is not None:
        lines.append(f'  fit_params: "{fit_params}"')
    if promotion_metric is not None:
        lines += ["promotion:", f"  metric: {promotion_metric}"]
    return "\n".join(lines) + "\n"


def write_job(path: pathlib.Path, text: str) -> pathlib.Path:
    """Write ``text`` to ``path`` and return the path."""
    path.write_text(text)
    return path


def dvml_command(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m dvml ARGS`` as a user runs it; output captured, never raises on failure."""
    return subprocess.run(
        [sys.executable, "-m", "dvml", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(env) if env is not None else None,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``dvml: error: ...`` line of a command that failed with exit status 1."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dvml: error: ")
    return str(lines[0])


def with_state_dir(state_dir: pathlib.Path) -> dict[str, str]:
    """This process's environment with dvml's cluster state directory set to ``state_dir``."""
    return {**os.environ, "DASK_DVML__CLUSTER__STATE_DIR": str(state_dir)}
