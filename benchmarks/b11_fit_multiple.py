"""B11: model selection, ``dvml.fit_multiple`` (MOP) vs ``dvml.fit`` per configuration.

Four configurations of the digits CNN (:func:`dvml.examples.digits_cnn_json`): 2 learning
rates x 2 batch sizes, 3 iterations of 1 epoch, on a two-worker LocalCluster that holds the
packed training and validation sets (packed once in ``prepare``, outside the clock: both
sides train on the same pinned data).

- dvml side: ONE :func:`dvml.fit_multiple` call. Each worker runs one hop trainer for the
  whole job; each iteration every model trains on each worker's partition in turn, its
  weights and optimizer state moving between the workers.
- baseline: :func:`dvml.fit` for each configuration, one after the other, with the fastest
  sync mode on CPU (``sync="iteration"``: MADlib's model averaging once per iteration; two
  trainers per fit, each started per fit).

Both sides use the same ``fit_params`` strings; in ``dvml.fit`` the ``batch_size`` is the
global batch (split over the two trainers), in ``fit_multiple`` the batch of the one trainer
that holds the model. Both compute validation metrics at the end only.

Target: ``fit_multiple / sequential fits <= 0.67`` (at least 1.5x faster), with equal final
validation accuracy per configuration (within 2 points; reported in the details). Reported
apart: the seconds spent moving models between workers (Dask transfer plus saving and
loading the state in the trainers, summed over every hop) and the bytes moved.

Data: scikit-learn's 1797 digits in 12 shifted, noisy copies (80 % training: 17 256 rows);
``--quick``: 2 copies and 1 iteration (3 at full size).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from benchmarks import _training as t
from benchmarks.b4_end_to_end import digits_frames
from benchmarks.harness import Benchmark, register

COPIES = {False: 12, True: 2}
ITERATIONS = {False: 3, True: 1}  # quick -> 1: the hops and their moving are still timed
LEARNING_RATES = (0.001, 0.003)
BATCHES = (32, 64)
TRAIN, VALID = "bench_b11_digits", "bench_b11_digits_val"


def configurations(arch_id: int) -> Any:
    """The four configurations, as dvml.model_configs would return them."""
    import pandas as pd

    rows = []
    for lr in LEARNING_RATES:
        for batch in BATCHES:
            rows.append(
                {
                    "mst_key": len(rows) + 1,
                    "model_id": arch_id,
                    "compile_params": (
                        "loss='categorical_crossentropy',"
                        f"optimizer='Adam(learning_rate={lr})',metrics=['accuracy']"
                    ),
                    "fit_params": f"batch_size={batch},epochs=1",
                }
            )
    return pd.DataFrame(rows)


def prepare(quick: bool) -> dict[str, Any]:
    import dvml
    from dvml.examples import digits_cnn_json

    context: dict[str, Any] = {
        "cluster": None, "directory": tempfile.mkdtemp(prefix="dvml-bench-b11-"),
        "accuracy": {}, "moving": [], "moved_bytes": [], "wall": {"dvml": [], "baseline": []},
        "iterations": ITERATIONS[quick],
    }  # fmt: skip
    try:
        cluster = context["cluster"] = t.start_cluster(2, 256 * t.MiB)
        client = cluster.client
        train, valid = digits_frames(COPIES[quick])
        dvml.training_preprocessor(
            train, y="label", x="pixels", normalizing_const=16.0, name=TRAIN, overwrite=True,
            client=client,
        )  # fmt: skip
        dvml.validation_preprocessor(
            valid, y="label", x="pixels", training=TRAIN, name=VALID, overwrite=True,
            client=client,
        )  # fmt: skip
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        context["arch_id"] = dvml.load_keras_model(
            digits_cnn_json(), name="digits-cnn", registry=context["registry"]
        )
        context["configs"] = configurations(context["arch_id"])
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    t.close_context(context, (TRAIN, VALID))


def dvml_side(context: dict[str, Any]) -> float:
    import dvml

    start = time.perf_counter()
    selection = dvml.fit_multiple(
        TRAIN, "b11", context["configs"], context["iterations"], validation_set=VALID, resume=False,
        overwrite=True,
        progress=False, registry=context["registry"], client=context["cluster"].client,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    summary = selection.summary
    context["moving"].append(float(summary["moving_seconds"]))
    context["moved_bytes"].append(int(summary["moved_bytes"]))
    info = selection.info.set_index("mst_key")
    context["accuracy"]["dvml"] = info["validation_metrics_final"].to_dict()
    context["wall"]["dvml"].append(elapsed)
    return elapsed


def baseline_side(context: dict[str, Any]) -> float:
    import dvml

    accuracy = {}
    start = time.perf_counter()
    for row in context["configs"].to_dict(orient="records"):
        model = dvml.fit(
            TRAIN, f"b11_seq_{row['mst_key']}", int(row["model_id"]), row["compile_params"],
            row["fit_params"], num_iterations=context["iterations"], validation_set=VALID,
            sync="iteration", resume=False, overwrite=True, progress=False,
            registry=context["registry"],
            client=context["cluster"].client,
        )  # fmt: skip
        accuracy[int(row["mst_key"])] = model.summary["validation_metrics_final"]
    elapsed = time.perf_counter() - start
    context["accuracy"]["baseline"] = accuracy
    context["wall"]["baseline"].append(elapsed)
    return elapsed


def details(context: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if context["moving"]:
        found["model moving s (median, all hops)"] = round(statistics.median(context["moving"]), 2)
        found["moved MiB per run"] = round(context["moved_bytes"][-1] / t.MiB, 1)
        if context["wall"]["dvml"]:
            share = statistics.median(context["moving"]) / statistics.median(
                context["wall"]["dvml"]
            )
            found["moving share of fit_multiple wall"] = round(share, 3)
    ours, theirs = context["accuracy"].get("dvml"), context["accuracy"].get("baseline")
    if ours and theirs:
        for key in sorted(ours):
            found[f"val accuracy mst {key} (MOP / fit)"] = (
                f"{ours[key]:.3f} / {theirs[int(key)]:.3f}"
            )
        gap = max(abs(ours[k] - theirs[int(k)]) for k in ours)
        found["max accuracy gap (points)"] = round(100 * gap, 2)
    return found


B11 = register(
    Benchmark(
        key="B11",
        title="4 digits CNN configs x 3 iterations on 2 workers: fit_multiple (MOP) vs dvml.fit "
        "per config (sync='iteration')",
        unit="s",
        dvml=dvml_side,
        baseline=baseline_side,
        target=0.67,
        target_op="<=",
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)
