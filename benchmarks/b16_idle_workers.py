"""B16: idle workers in model search, MADlib's diagonal Hyperband vs ASHA; and how long an ASHA
promotion decision takes with 1,000 configurations. Pure scheduler simulations, no cluster.

The cluster model (:mod:`dvml.search.simulation`): a worker trains one model at a time, an
iteration takes the worker's seconds per iteration (1.0, or 2.0 for the slow worker), moving a
model costs nothing. R=81, eta=3 for both. MADlib's Hyperband runs its 5 diagonals as 5
``fit_multiple`` calls (a barrier each) over its 128 configurations, 10 of which reach R in its
last diagonal. ASHA (max_t=81, grace_period=1, rungs 1/3/9/27/81) runs until as many models,
10, have reached 81 iterations; it starts new configurations on idle workers whenever nothing
is promotable, so its busy fraction is the point and its model-iterations are reported beside.

Rows (the figures are simulated seconds or fractions, the same in every repeat):

- ``B16a``/``B16b`` (16/32 workers, one 2x slower): ASHA's busy fraction against a fully busy
  cluster (1.0). Target: ratio >= 0.95 (ASHA at least 95 % busy). MADlib Hyperband's busy
  fraction and wall time, with and without the slow worker, are in the details.
- ``B16c``/``B16d`` (16/32 workers): ASHA's wall time with the slow worker against without.
  Target: ratio <= 1.15.
- ``B16e``: one promotion decision of ASHA with 1,000 configurations (a result in, the next
  job out: ``Result`` then ``Ask``), median of ``DECISIONS`` timed decisions, in ms, against the
  10 ms budget. Target: ratio <= 1.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.harness import Benchmark, register

DECISIONS = 100  # per repeat: 3 repeats stay within the ~490 promotions 1,000 results allow
BUDGET_MS = 10.0


def _workers(count: int, slow: bool) -> list[float]:
    return [2.0 if slow and i == 0 else 1.0 for i in range(count)]


def prepare(quick: bool) -> dict[str, Any]:
    """Every simulation once (they are exact: repeats give the same figures)."""
    from dvml.search.simulation import simulate_asha, simulate_hyperband

    figures: dict[str, Any] = {}
    for count in (16, 32):
        for slow in (False, True):
            speeds = _workers(count, slow)
            figures[("hyperband", count, slow)] = simulate_hyperband(speeds, R=81, eta=3)
            figures[("asha", count, slow)] = simulate_asha(speeds, finished=10, max_t=81)[0]
    return figures


def _busy(count: int) -> Benchmark:
    def dvml_side(figures: dict[str, Any]) -> float:
        return float(figures[("asha", count, True)].busy_fraction)

    def details(figures: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for method in ("asha", "hyperband"):
            for slow in (False, True):
                f = figures[(method, count, slow)]
                label = f"{method}{' slow' if slow else ''}"
                out[f"{label} busy"] = round(f.busy_fraction, 3)
                out[f"{label} wall"] = round(f.wall_time, 1)
            out[f"{method} model-iterations"] = figures[(method, count, False)].model_iterations
            out[f"{method} configurations"] = figures[(method, count, False)].configurations
        return out

    return Benchmark(
        key="B16a" if count == 16 else "B16b",
        title=f"ASHA busy fraction, {count} workers, one 2x slower / fully busy",
        unit="busy",
        dvml=dvml_side,
        baseline=lambda figures: 1.0,
        target=0.95,
        target_op=">=",
        prepare=prepare,
        details=details,
    )


def _slow(count: int) -> Benchmark:
    def details(figures: dict[str, Any]) -> dict[str, Any]:
        return {
            "hyperband slow / fast wall": round(
                figures[("hyperband", count, True)].wall_time
                / figures[("hyperband", count, False)].wall_time,
                2,
            )
        }

    return Benchmark(
        key="B16c" if count == 16 else "B16d",
        title=f"ASHA wall time, {count} workers, one 2x slower / none slower",
        unit="sim s",
        dvml=lambda figures: float(figures[("asha", count, True)].wall_time),
        baseline=lambda figures: float(figures[("asha", count, False)].wall_time),
        target=1.15,
        target_op="<=",
        prepare=prepare,
        details=details,
    )


def _decision_context(quick: bool) -> dict[str, Any]:
    """An ASHA whose 1,000 configurations have all reported at rung 0 (untimed)."""
    from dvml.search import journal as j
    from dvml.search.asha import Asha
    from dvml.search.automl_params import AshaParams
    from dvml.search.simulation import synthetic_loss, synthetic_space

    configs = 1000
    asha = Asha(synthetic_space(), AshaParams(max_t=81, eta=3, max_configs=configs), seed=0)
    starts = [asha.apply(j.Ask(f"w{i % 32}")) for i in range(configs)]
    values = {d.trial_id: d.values for d in starts}
    for d in starts:
        asha.apply(j.Result(d.trial_id, 1, synthetic_loss(d.values, 1), d.worker, 0.0, 1.0))
    # 32 workers take jobs: promotions now, as rung 0 is full
    running = [asha.apply(j.Ask(f"w{i}")) for i in range(32)]
    return {"asha": asha, "values": values, "running": running, "j": j, "loss": synthetic_loss,
            "times": []}  # fmt: skip


def _decision_ms(context: dict[str, Any]) -> float:
    """Median ms of DECISIONS decisions: a running model reports, its worker asks for a job."""
    asha, j, loss = context["asha"], context["j"], context["loss"]
    times = []
    for _ in range(DECISIONS):
        if not context["running"]:
            break
        job = context["running"].pop(0)
        total = asha.levels[asha.trials[job.trial_id].target]
        result = j.Result(job.trial_id, total, loss(context["values"][job.trial_id], total),
                          job.worker, 0.0, 1.0, "ckpt")  # fmt: skip
        start = time.perf_counter()
        asha.apply(result)
        decision = asha.apply(j.Ask(job.worker))
        times.append((time.perf_counter() - start) * 1000.0)
        if isinstance(decision, j.Start | j.Promote):
            context["running"].append(decision)
    context["times"].extend(times)
    return statistics.median(times)


def _decision_details(context: dict[str, Any]) -> dict[str, Any]:
    return {
        "configurations": len(context["asha"].trials),
        "results per rung": context["asha"].rung_sizes(),
        "decisions timed": len(context["times"]),
        "slowest decision ms": round(max(context["times"]), 3),
    }


BENCHMARKS = [
    register(_busy(16)),
    register(_busy(32)),
    register(_slow(16)),
    register(_slow(32)),
    register(
        Benchmark(
            key="B16e",
            title="ASHA promotion decision, 1,000 configurations / 10 ms budget",
            unit="ms",
            dvml=_decision_ms,
            baseline=lambda context: BUDGET_MS,
            target=1.0,
            target_op="<=",
            prepare=_decision_context,
            details=_decision_details,
        )
    ),
]
