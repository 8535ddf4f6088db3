"""Waiting for a condition with a deadline, the one way every test waits.

The same :func:`poll_for` that dvml itself waits with (it returns False rather than raising, so
that a test can ``assert poll_for(...), "why"``); ``dvml.cluster.processes`` imports only the
standard library, so importing it here keeps this package cheap.
"""

from __future__ import annotations

from dvml.cluster.processes import poll_for

__all__ = ["poll_for"]
