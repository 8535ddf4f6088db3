"""What a trainer's exit means, in words: the signal that killed it and its last real lines.

A trainer's output is mostly TensorFlow's start-up chatter (glog lines such as
``I0000 00:00:... cpu_feature_guard.cc ... This TensorFlow binary is optimized ...``). When a
trainer is killed, that banner is all it printed, so the error must say which signal ended it
and leave the banner out.
"""

from __future__ import annotations

import re
import signal
from typing import Any

__all__ = ["KILLED_BY", "describe_exit", "meaningful_lines"]

KILLED_BY = "it was killed by SIG"  # in every message about a trainer ended by a signal

# glog/absl info and warning lines (TensorFlow's C++ side), and the banners around them.
_NOISE = (
    re.compile(r"^[IW]\d{4} [\d:.]+\s"),  # I0000 00:00:1700000000.123456  1234 file.cc:12] ...
    re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+: [IW] "),  # 2026-11-23 13:37:25.1: I tensorflow/...
    re.compile(r"WARNING: All log messages before absl::InitializeLog"),
    re.compile(r"oneDNN custom operations are on|TF_ENABLE_ONEDNN_OPTS"),
    re.compile(r"This TensorFlow binary is optimized|To enable the following instructions"),
    re.compile(r"rebuild TensorFlow with the appropriate compiler flags"),
    re.compile(r"Could not find cuda drivers|cuda_(dnn|fft|blas)\.cc|Unable to register cu"),
    # a CPU-only machine: CUDA's absence is logged as an error line at every start
    re.compile(r"failed call to cuInit|cuda_platform\.cc|cudart_stub\.cc"),
)


def meaningful_lines(lines: list[str], keep: int = 8) -> list[str]:
    """The last ``keep`` non-empty lines of a trainer's output that are not start-up noise."""
    kept = [line for line in lines if line.strip() and not any(p.search(line) for p in _NOISE)]
    return kept[-keep:]


def _signal_name(number: int) -> str:
    """``SIGKILL``; ``SIGRTMIN+1`` for a real-time signal (no name of its own); ``SIG?``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return "SIG?"


def describe_exit(returncode: int | None, error: dict[str, Any], tail: list[str]) -> str:
    """One sentence (and the trainer's last real lines) on why a trainer ended without a result.

    Parameters
    ----------
    returncode : int or None
        The process's exit status (negative: killed by that signal, as ``subprocess`` reports).
    error : dict
        The trainer's ``error`` protocol message (``type``, ``message``), empty if it sent none.
    tail : list of str
        The trainer's last output lines that were not protocol lines.
    """
    last = meaningful_lines(tail)
    said = "\n".join(last) if last else "(it printed nothing but TensorFlow's start-up banner)"
    if returncode is not None and returncode < 0:
        name = _signal_name(-returncode)
        return (
            f"{KILLED_BY}{name.removeprefix('SIG')} (signal {-returncode}), from outside dvml "
            "(the kernel's out-of-memory killer, an administrator or another program). "
            f"Its last lines:\n{said}"
        )
    if error.get("message"):
        return f"exit code {returncode}, {error.get('type', 'error')}: {error['message']}"
    if returncode == 0:
        return f"it exited (code 0) without reporting a result. Its last lines:\n{said}"
    return f"exit code {returncode}. Its last lines:\n{said}"
