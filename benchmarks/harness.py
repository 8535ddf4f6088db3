"""The benchmark registry, the alternating timing loop and the result table.

A benchmark is one module listed in :data:`MODULES` that calls :func:`register` with a
:class:`Benchmark`: two sides (dvml and a baseline) that each run once and return one figure,
and a target on the ratio ``dvml / baseline``. The sides alternate, and the side that goes first
alternates too, so that drift (a warming cache, another process) hits both alike. Everything
except :func:`run_benchmark`, :func:`run_all` and :func:`load` is a pure function of its arguments.

A benchmark whose baseline is an optional peer that is not installed (Ray's, ``./scripts/peer-ray``)
raises :class:`Skipped` from its ``prepare`` or a side: its rows are reported as skipped, with the
command that installs the peer, never as errors, and the other rows still run.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "MODULES",
    "REGISTRY",
    "Benchmark",
    "Measurement",
    "Skipped",
    "load",
    "register",
    "render_table",
    "run_all",
    "run_benchmark",
    "schedule",
    "select",
    "summarize",
]

# One module per benchmark; importing it registers it. B1-B7 are added here as they land.
MODULES: tuple[str, ...] = (
    "benchmarks.b1_resolve",
    "benchmarks.b2_put",
    "benchmarks.b3_input",
    "benchmarks.b4_end_to_end",
    "benchmarks.b5_pack",
    "benchmarks.b6_features",
    "benchmarks.b7_memory",
    "benchmarks.b8_cluster_start",
    "benchmarks.b9_decode",
    "benchmarks.b10_scaling",
    "benchmarks.b11_fit_multiple",
    "benchmarks.b12_pack_scaling",
    "benchmarks.b13_netns_fit",
    "benchmarks.b14_tls",
    "benchmarks.b15_time_to_accuracy",
    "benchmarks.b16_idle_workers",
    "benchmarks.b17_row_bytes",
    "benchmarks.b18_object_store",
    "benchmarks.b19_own_loop",
    "benchmarks.b20_short_job",
    "benchmarks.b21_stragglers",
    "benchmarks.b22_elastic",
    "benchmarks.b23_memory_plan",
    "benchmarks.b24_versions",
    "benchmarks.b25_dashboard",
)

SIDES = ("dvml", "baseline")


class Skipped(RuntimeError):
    """A row cannot run here because an optional peer is not installed; the message says which
    and the command that installs it. Raised by ``prepare`` (every row of its group is skipped)
    or by a side (that row only): the row is reported as skipped, not as an error."""


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One side-by-side measurement.

    Parameters
    ----------
    key : str
        Short id used by ``--only``, e.g. ``"B8"``.
    title : str
        What is compared, in a few words.
    unit : str
        Unit of the figures the sides return, e.g. ``"s"`` or ``"images/s"``.
    dvml, baseline : callable
        ``side(context) -> float``: run once and return the figure.
    target : float
        Bound on the ratio ``dvml / baseline``.
    target_op : {"<=", ">=", "within"}
        ``"<="`` when smaller figures are better (times), ``">="`` for rates, ``"within"``
        when the figures should agree (a plan against a measurement): ``1 / target <= ratio
        <= target``.
    prepare : callable, optional
        ``prepare(quick) -> context``: build inputs (not timed); ``quick`` asks for small sizes.
    cleanup : callable, optional
        ``cleanup(context)``: release what ``prepare`` built.
    details : callable, optional
        ``details(context) -> {label: value}``: figures worth reporting beside the ratio (e.g.
        a fixed start-up cost), read after the last repeat and before ``cleanup``; they go to
        the row's ``"details"`` and to a note under the table.
    """

    key: str
    title: str
    unit: str
    dvml: Callable[[Any], float]
    baseline: Callable[[Any], float]
    target: float
    target_op: str = "<="
    prepare: Callable[[bool], Any] | None = None
    cleanup: Callable[[Any], None] | None = None
    details: Callable[[Any], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.target_op not in ("<=", ">=", "within"):
            raise ValueError(
                f"target_op must be '<=', '>=' or 'within'. Received: target_op={self.target_op!r} "
                f"for {self.key}."
            )


@dataclasses.dataclass
class Measurement:
    """The figures of both sides, in the order they were taken, or the error that stopped it,
    or why it was skipped (:class:`Skipped`: an optional peer is missing)."""

    dvml: list[float] = dataclasses.field(default_factory=list)
    baseline: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None
    skipped: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


REGISTRY: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> Benchmark:
    """Add ``benchmark`` to :data:`REGISTRY` (a module calls this at import)."""
    if benchmark.key in REGISTRY and REGISTRY[benchmark.key] is not benchmark:
        raise ValueError(f"Benchmark {benchmark.key} is registered twice. Received: {benchmark}.")
    REGISTRY[benchmark.key] = benchmark
    return benchmark


def load(modules: Iterable[str] = MODULES) -> dict[str, Benchmark]:
    """Import every benchmark module and return the registry."""
    for name in modules:
        importlib.import_module(name)
    return REGISTRY


def select(registry: dict[str, Benchmark], only: Sequence[str] | None) -> list[Benchmark]:
    """The benchmarks named in ``only`` (case-insensitive), or all of them in key order.

    A benchmark with several baselines registers one row per baseline, keyed by a letter
    after its number (``B1a``, ``B1b``); ``only=["B1"]`` selects all of them.
    """
    ordered = sorted(registry, key=_key_order)
    if not only:
        return [registry[k] for k in ordered]
    chosen: list[str] = []
    unknown = []
    for wanted in only:
        found = [k for k in ordered if wanted.upper() in (k.upper(), _group(k).upper())]
        if not found:
            unknown.append(wanted)
        chosen.extend(k for k in found if k not in chosen)
    if unknown:
        raise ValueError(
            f"Unknown benchmark(s) {unknown}. Received: --only={','.join(only)}. "
            f"Known: {', '.join(ordered)}."
        )
    return [registry[k] for k in chosen]


_KEY = re.compile(r"^([A-Za-z]*)(\d*)(.*)$")


def _group(key: str) -> str:
    """``"B1a"`` -> ``"B1"``: the benchmark that a row of several baselines belongs to."""
    prefix, digits, _ = _KEY.match(key).groups()  # type: ignore[union-attr]
    return prefix + digits if digits else key


def _key_order(key: str) -> tuple[str, int, str]:
    prefix, digits, suffix = _KEY.match(key).groups()  # type: ignore[union-attr]
    return (prefix, int(digits) if digits else 0, suffix)


def schedule(repeats: int) -> list[tuple[str, str]]:
    """The order of the sides in each repeat: dvml first, then baseline first, and so on."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int. Received: repeats={repeats!r}.")
    return [SIDES if i % 2 == 0 else SIDES[::-1] for i in range(repeats)]


def run_benchmark(
    benchmark: Benchmark,
    repeats: int,
    quick: bool,
    log: Callable[[str], None] = print,
) -> Measurement:
    """Prepare, then run both sides ``repeats`` times in alternating order, then clean up.

    An exception stops this benchmark only: it is recorded in ``Measurement.error``.
    """
    return run_all([benchmark], repeats, quick, log)[0]


def run_all(
    benchmarks: Sequence[Benchmark],
    repeats: int,
    quick: bool,
    log: Callable[[str], None] = print,
) -> list[Measurement]:
    """Run ``benchmarks`` in order, each as :func:`run_benchmark` does.

    Consecutive benchmarks with the same ``prepare`` function (the rows of one benchmark with
    several baselines, e.g. B3a-B3c) share one context: prepared before the first of them and
    cleaned up (with the last one's ``cleanup``) after the last, so that a cluster or a
    TensorFlow process is started once per benchmark, not once per row.
    """
    measurements: list[Measurement] = []
    i = 0
    while i < len(benchmarks):
        group = [benchmarks[i]]
        shared = benchmarks[i].prepare
        while (
            shared is not None
            and i + len(group) < len(benchmarks)
            and benchmarks[i + len(group)].prepare is shared
        ):
            group.append(benchmarks[i + len(group)])
        measurements.extend(_run_group(group, repeats, quick, log))
        i += len(group)
    return measurements


def _run_group(
    group: Sequence[Benchmark], repeats: int, quick: bool, log: Callable[[str], None]
) -> list[Measurement]:
    measurements = [Measurement() for _ in group]
    context = None
    try:
        first = group[0]
        context = first.prepare(quick) if first.prepare is not None else None
    except Skipped as exc:  # an optional peer is missing: every row of the group is skipped
        for benchmark, measurement in zip(group, measurements, strict=True):
            measurement.skipped = str(exc)
            log(f"{benchmark.key} skipped: {exc}")
        return measurements
    except Exception as exc:  # every row of the group reports it; the others still run
        for benchmark, measurement in zip(group, measurements, strict=True):
            measurement.error = f"{type(exc).__name__}: {exc}"
            log(f"{benchmark.key} failed: {measurement.error}")
        return measurements
    try:
        for benchmark, measurement in zip(group, measurements, strict=True):
            _measure(benchmark, measurement, context, repeats, log)
    finally:
        cleanup = group[-1].cleanup
        if cleanup is not None and context is not None:
            try:
                cleanup(context)
            except Exception as exc:  # the figures stand; the next benchmarks still run
                message = f"{type(exc).__name__}: {exc}"
                log(f"{group[-1].key} cleanup failed: {message}")
                measurements[-1].details["cleanup failed"] = message
    return measurements


def _measure(
    benchmark: Benchmark,
    measurement: Measurement,
    context: Any,
    repeats: int,
    log: Callable[[str], None],
) -> None:
    try:
        for i, order in enumerate(schedule(repeats)):
            for side in order:
                figure = float(getattr(benchmark, side)(context))
                getattr(measurement, side).append(figure)
                label = f"{benchmark.key} repeat {i + 1}/{repeats} {side}"
                log(f"{label}: {figure:.4g} {benchmark.unit}")
        if benchmark.details is not None:
            measurement.details = dict(benchmark.details(context))
    except Skipped as exc:  # an optional peer is missing: this row only, not an error
        measurement.dvml.clear()
        measurement.baseline.clear()
        measurement.skipped = str(exc)
        log(f"{benchmark.key} skipped: {exc}")
    except Exception as exc:  # reported in the table; the other benchmarks still run
        measurement.error = f"{type(exc).__name__}: {exc}"
        log(f"{benchmark.key} failed: {measurement.error}")


def summarize(benchmark: Benchmark, measurement: Measurement) -> dict[str, Any]:
    """One result row: median figures, per-repeat ratios ``dvml / baseline`` and the verdict."""
    row: dict[str, Any] = {
        "benchmark": benchmark.key,
        "title": benchmark.title,
        "unit": benchmark.unit,
        "dvml": _median(measurement.dvml),
        "baseline": _median(measurement.baseline),
        "dvml_figures": list(measurement.dvml),
        "baseline_figures": list(measurement.baseline),
        "target": (
            f"{1 / benchmark.target:.3g} <= ratio <= {benchmark.target:g}"
            if benchmark.target_op == "within"
            else f"ratio {benchmark.target_op} {benchmark.target:g}"
        ),
        "error": measurement.error,
        "skipped": measurement.skipped,
        "details": dict(measurement.details),
    }
    pairs = list(zip(measurement.dvml, measurement.baseline, strict=False))
    ratios = [d / b if b else math.inf for d, b in pairs]
    row["ratios"] = ratios
    row["ratio_median"] = _median(ratios)
    row["ratio_min"] = min(ratios) if ratios else None
    row["ratio_max"] = max(ratios) if ratios else None
    median = row["ratio_median"]
    if measurement.error is not None or median is None:
        row["met"] = False
    elif benchmark.target_op == "<=":
        row["met"] = bool(median <= benchmark.target)
    elif benchmark.target_op == "within":
        row["met"] = bool(1 / benchmark.target <= median <= benchmark.target)
    else:
        row["met"] = bool(median >= benchmark.target)
    return row


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _figure(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.3g} {unit}"


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    """The result rows as a Markdown table."""
    header = ["benchmark", "dvml", "baseline", "ratio median (min-max)", "target", "met"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row["ratio_median"] is None:
            ratio = "-"
        else:
            ratio = f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
        if row.get("skipped"):
            met = "skipped"
        else:
            met = "yes" if row["met"] else ("error" if row.get("error") else "no")
        cells = [
            f"{row['benchmark']}: {row['title']}",
            _figure(row["dvml"], row["unit"]),
            _figure(row["baseline"], row["unit"]),
            ratio,
            row["target"],
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        f"{row['benchmark']}: " + ", ".join(f"{k} {_detail(v)}" for k, v in row["details"].items())
        for row in rows
        if row.get("details")
    ]
    skipped = [f"{r['benchmark']} skipped: {r['skipped']}" for r in rows if r.get("skipped")]
    if notes:
        lines += ["", *notes]
    if skipped:
        lines += ["", *skipped]
    return "\n".join(lines)


def _detail(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
