"""B25: what dvml's page on the Dask dashboard costs a job while it is open.

B4a's job (digits preprocess, 2-worker ``sync="iteration"`` fit, evaluate: see
:mod:`benchmarks.b4_end_to_end`, whose cluster, data and sides this reuses) with the page
open against the same job with it closed. "Open" is what a browser tab does: the page's
script asks the scheduler for ``/dvml/api/state.json`` every second (here a thread of the
benchmark process, so that the client's cores are shared as with a local browser). Target:
<= 1.01 (the page costs at most 1 % of the job). The workers' vineyard metric and the events
the page reads are sent whether the page is open or not: they are in both sides.
"""

from __future__ import annotations

import threading
import urllib.request
from typing import Any

from benchmarks import b4_end_to_end as b4
from benchmarks.harness import Benchmark, register

POLL_S = 1.0  # the page's own refresh period


def page_open(context: dict[str, Any]) -> float:
    page = context["cluster"].dvml_dashboard_link + "/api/state.json"
    stop = threading.Event()
    answers = context.setdefault("page_answers", [])

    def poll() -> None:
        while not stop.wait(POLL_S):
            with urllib.request.urlopen(page, timeout=10) as answer:
                answers.append(len(answer.read()))

    poller = threading.Thread(target=poll, name="b25-page", daemon=True)
    poller.start()
    try:
        return b4.dvml_side(context, "iteration")
    finally:
        stop.set()
        poller.join(timeout=15)


def page_closed(context: dict[str, Any]) -> float:
    return b4.dvml_side(context, "iteration")


def details(context: dict[str, Any]) -> dict[str, Any]:
    answers = context.get("page_answers", [])
    found: dict[str, Any] = {"page requests": len(answers)}
    if answers:
        found["state.json bytes (last)"] = answers[-1]
    return found


register(
    Benchmark(
        "B25", "B4a's job with dvml's dashboard page open vs closed", "s",
        page_open, page_closed, 1.01, prepare=b4.prepare, cleanup=b4.cleanup, details=details,
    )
)  # fmt: skip
