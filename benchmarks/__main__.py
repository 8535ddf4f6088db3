"""``python -m benchmarks``: run the registered benchmarks and write results.json/results.md."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
from collections.abc import Sequence

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run dvml's benchmarks side by side with their baselines and report the "
        "ratio dvml / baseline against each target.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run).")
    parser.add_argument(
        "--only", default=None, metavar="B8,...", help="comma-separated benchmark keys to run."
    )
    parser.add_argument(
        "--repeats", type=int, default=3, metavar="N",
        help="runs of each side, alternating (default 3).",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=pathlib.Path, default=DEFAULT_OUT, metavar="DIR",
        help=f"where results.json and results.md are written (default {DEFAULT_OUT}).",
    )  # fmt: skip
    return parser


def _environment(args: argparse.Namespace) -> dict[str, object]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("dvml", "dask", "distributed", "vineyard", "numpy", "tensorflow-cpu"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "repeats": args.repeats,
        "versions": versions,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks import harness

    parser = build_parser()
    args = parser.parse_args(argv)
    only = [k.strip() for k in args.only.split(",") if k.strip()] if args.only else None
    try:
        harness.schedule(args.repeats)
        benchmarks = harness.select(harness.load(), only)
    except ValueError as exc:
        parser.error(str(exc))

    measurements = harness.run_all(benchmarks, args.repeats, args.quick)
    rows = [harness.summarize(b, m) for b, m in zip(benchmarks, measurements, strict=True)]

    table = harness.render_table(rows)
    environment = _environment(args)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "results.json", "w") as f:
        json.dump({"environment": environment, "results": rows}, f, indent=2)
        f.write("\n")
    with open(args.out / "results.md", "w") as f:
        f.write(f"# Benchmark results\n\n{table}\n\n")
        f.write(f"Python {environment['python']}, {environment['cpus']} CPUs, "
                f"{args.repeats} repeat(s){', quick' if args.quick else ''}, "
                f"{environment['date']}.\n")  # fmt: skip
    print(table)
    print(f"\nWritten to {args.out / 'results.json'} and {args.out / 'results.md'}.")
    return 1 if any(row["error"] for row in rows) else 0


if __name__ == "__main__":  # Dask's Nanny spawns processes that import this module
    sys.exit(main())
