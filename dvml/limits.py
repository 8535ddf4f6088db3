"""The ranges dvml accepts for counts, ports, timeouts and files given by users.

A number from a command line or a job file reaches code that builds one string per GPU,
binds a C ``int`` port or waits that many seconds: ``--gpus 1000000000`` would fill the
memory, ``--scheduler-port 70000`` overflow, ``--timeout 1e300`` wait forever and ``--timeout
nan`` compare false with everything. Every such value is checked here first, against a range
far beyond any real use, so that a mistake (or an attack) is one clear error before anything
starts. Pure: no I/O but :func:`read_bounded`.
"""

from __future__ import annotations

import math
import os
from typing import Any

from dvml.exceptions import ArgumentError, ArgumentTypeError, ConfigError

__all__ = [
    "MAX_BUFFER_ROWS",
    "MAX_FILE_BYTES",
    "MAX_GPUS_PER_WORKER",
    "MAX_ITERATIONS",
    "MAX_SEED",
    "MAX_TIMEOUT_S",
    "MAX_WAIT_S",
    "MAX_WORKERS",
    "check_count",
    "check_port",
    "check_seconds",
    "count_problem",
    "read_bounded",
    "seconds_problem",
]

MAX_WORKERS = 1024
"""Workers (and simulated hosts) of one cluster."""

MAX_GPUS_PER_WORKER = 64
"""GPUs declared for one worker."""

MAX_TIMEOUT_S = 3600.0
"""A timeout: connecting, a daemon's start, a stop. An hour is far beyond any of them."""

MAX_WAIT_S = 86400.0
"""The longest wait dvml accepts for a whole cluster to start (``dvml cluster up --wait``)."""

MAX_ITERATIONS = 1_000_000
"""Iterations of a fit, and the frequency of its metrics."""

MAX_BUFFER_ROWS = 2**31 - 1
"""Rows of one packed buffer (one vineyard tensor's first dimension)."""

MAX_SEED = 2**63 - 1
"""The largest seed (NumPy's SeedSequence takes any non-negative int; dvml keeps int64)."""

MAX_FILE_BYTES = 16 * 2**20
"""The largest job file or architecture JSON read (a Keras JSON of a large model is ~1 MiB)."""


def count_problem(value: Any, minimum: int, maximum: int) -> str | None:
    """What is wrong with ``value`` as a count in ``[minimum, maximum]``, or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if not minimum <= value <= maximum:
        return f"must be between {minimum} and {maximum}"
    return None


def check_count(value: Any, name: str, minimum: int = 1, maximum: int = MAX_WORKERS) -> int:
    """``value`` as an int in ``[minimum, maximum]``, else ArgumentError/ArgumentTypeError."""
    problem = count_problem(value, minimum, maximum)
    if problem is None:
        return int(value)
    error = ArgumentTypeError if "integer" in problem else ArgumentError
    raise error(f"{name} {problem}. Received: {name}={value!r}. Pass a value in range.")


def seconds_problem(value: Any, maximum: float = MAX_TIMEOUT_S) -> str | None:
    """What is wrong with ``value`` as a number of seconds in ``(0, maximum]``, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number of seconds"
    # An int is exact at any size (math.isfinite would overflow converting 10**400).
    if (isinstance(value, float) and not math.isfinite(value)) or not 0 < value <= maximum:
        return f"must be a finite number of seconds above 0 and at most {maximum:g}"
    return None


def check_seconds(value: Any, name: str, maximum: float = MAX_TIMEOUT_S) -> float:
    """``value`` as seconds in ``(0, maximum]`` (finite), else ArgumentError/ArgumentTypeError."""
    problem = seconds_problem(value, maximum)
    if problem is None:
        return float(value)
    error = ArgumentTypeError if problem.endswith("seconds") else ArgumentError
    raise error(f"{name} {problem}. Received: {name}={value!r}. Pass a value in range.")


def check_port(value: Any, name: str) -> int:
    """A TCP port: 0 (a free one, chosen by the system) to 65535."""
    return check_count(value, name, 0, 65535)


def read_bounded(path: str | os.PathLike[str], what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The text of a small file (a job file, an architecture), read at most ``limit`` bytes.

    ``/dev/zero``, a FIFO or a huge file is refused after ``limit + 1`` bytes instead of read
    until memory runs out.

    Raises
    ------
    ConfigError
        The file is larger than ``limit`` bytes or is not UTF-8 text.
    OSError
        It cannot be opened or read (the caller words that for its file).
    """
    name = os.fspath(path)
    with open(name, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(
            f"The {what} {name} is larger than {limit} bytes (or endless, like /dev/zero). "
            f"Received: {name}. Give a {what} of at most {limit // 2**20} MiB."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"The {what} {name} is not UTF-8 text: {exc.reason} at byte {exc.start}. "
            f"Received: {name}. Give a YAML or JSON text file."
        ) from None
