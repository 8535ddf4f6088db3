"""Validation accuracy per iteration for each sync mode on the same data (not a ratio benchmark).

``python -m benchmarks.convergence [--modes iteration,step,8] [--iterations 5] [--epochs 1]
[--copies 1] [--batch 32]`` starts a two-worker LocalCluster, packs B4's digits (``--copies``
shifted, noisy copies; 1 = scikit-learn's 1797 digits, 80 % for training), and runs
:func:`dvml.fit` of the demo CNN once per mode with ``metrics_compute_frequency=1``. It prints
one line per mode: validation accuracy after each iteration, the trainers' ``model.fit``
seconds per iteration, the wall time and whether the trainers ended on identical weights; and
the same as JSON at the end. The README's "accuracy per iteration" figures come from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def _mode(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def run(
    modes: Sequence[str | int], iterations: int, epochs: int, copies: int, batch: int
) -> dict[str, Any]:
    import dvml
    from benchmarks.b4_end_to_end import digits_frames
    from dvml.demo import COMPILE_PARAMS, digits_cnn_json

    train, valid = digits_frames(copies)
    directory = tempfile.mkdtemp(prefix="dvml-bench-convergence-")
    results: dict[str, Any] = {}
    try:
        with dvml.LocalCluster(
            n_workers=2, vineyard_memory="256MiB", dashboard_address="127.0.0.1:0"
        ):
            registry = dvml.Registry(f"sqlite:///{directory}/registry.db")
            try:
                ds = dvml.training_preprocessor(
                    train, y="label", x="pixels", normalizing_const=16.0,
                    name="bench_convergence", overwrite=True,
                )  # fmt: skip
                val = dvml.validation_preprocessor(
                    valid, y="label", x="pixels", training=ds, name="bench_convergence_val",
                    overwrite=True,
                )  # fmt: skip
                arch = dvml.load_keras_model(digits_cnn_json(), registry=registry)
                for mode in modes:
                    records: list[dict[str, Any]] = []
                    start = time.perf_counter()
                    model = dvml.fit(
                        ds, f"convergence_{mode}", arch, COMPILE_PARAMS,
                        f"batch_size={batch}, epochs={epochs}", num_iterations=iterations,
                        validation_set=val, metrics_compute_frequency=1, sync=mode, overwrite=True,
                        resume=False, progress=False, on_iteration=records.append,
                        registry=registry,
                    )  # fmt: skip
                    s = model.summary
                    results[str(mode)] = {
                        "validation_accuracy": [round(v, 4) for v in s["validation_metrics"]],
                        "fit_s_per_iteration": [round(r["fit_seconds"], 2) for r in records],
                        "wall_s": round(time.perf_counter() - start, 1),
                        "weights_identical": s["weights_identical_on_all_trainers"],
                    }
                    print(f"sync={mode!r}: {json.dumps(results[str(mode)])}", flush=True)
            finally:
                for name in ("bench_convergence", "bench_convergence_val"):
                    if dvml.datasets.exists(name):
                        dvml.datasets.drop(name)
                registry.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.convergence", description=__doc__)
    parser.add_argument("--modes", default="iteration,step", help="comma-separated sync modes.")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1, help="epochs per iteration.")
    parser.add_argument("--copies", type=int, default=1, help="copies of the digits.")
    parser.add_argument("--batch", type=int, default=32, help="global batch size.")
    args = parser.parse_args(argv)
    modes = [_mode(m.strip()) for m in args.modes.split(",") if m.strip()]
    results = run(modes, args.iterations, args.epochs, args.copies, args.batch)
    print(json.dumps(results, indent=2))
    return 0 if all(r["weights_identical"] for r in results.values()) else 1


if __name__ == "__main__":  # Dask's Nanny spawns processes that import this module
    sys.exit(main())
