"""B22: an elastic fit that loses a worker against the same fit undisturbed (issue 37).

One LocalCluster of 3 workers (1 thread each). Before each run (outside the clock) the
training and validation sets are packed again over all 3 workers: a disturbed run leaves the
dataset re-pinned onto 2 of them, and its killed worker comes back empty (its Nanny restarts
it). Both sides are ONE ``dvml.fit(..., elastic=True, sync="iteration")`` of the demo CNN
(:func:`dvml.examples.digits_cnn_json`), Adam(0.003), global batch 256, ``EPOCHS`` epochs per
iteration, ``ITERATIONS`` iterations, then :func:`dvml.evaluate` on the validation rows:

- dvml (disturbed): worker-2's Dask worker process is SIGKILLed once iteration ``KILL_AT`` is
  reported (``on_iteration``); its vineyardd still runs, so its buffers are copied onto the
  survivors, which go on from their last common checkpoint (:mod:`dvml.train.elastic`);
- baseline: the same fit, undisturbed.

Rows:

- B22b: wall time of the disturbed fit / the undisturbed one (target <= 1.5); details: both
  validation accuracies and their gap in points (issue target: within 1 point), the re-pin's
  rows and seconds, and the iteration the survivors resumed from;
- B22c: the rows trained per epoch in the disturbed run (the fewest over its iterations, from
  the trainers' own counts: ``rows_per_epoch``) / the dataset's rows (target: exactly 1.0).

B22a (a worker added during the fit) waits for the elastic fit to take joiners in.

Data: B4's digits in ``COPIES`` shifted, noisy copies (80 % training: 86,256 rows, 2 epochs
per iteration; ``--quick``: 2 copies, 1 epoch, 4 iterations, killed after 2).
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from typing import Any

from benchmarks import _training as t
from benchmarks.b4_end_to_end import digits_frames
from benchmarks.harness import Benchmark, register

COPIES = {False: 60, True: 2}
ITERATIONS = {False: 10, True: 4}  # and the iteration after which a worker is killed
KILL_AT = {False: 5, True: 2}
TRAIN, VALID, MODEL = "bench_b22_digits", "bench_b22_digits_val", "bench_b22_cnn"
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', " \
    "metrics=['accuracy']"  # fmt: skip
EPOCHS = {False: 2, True: 1}  # per iteration
VICTIM = "worker-2"


def prepare(quick: bool) -> dict[str, Any]:
    import dvml
    from dvml.examples import digits_cnn_json

    context: dict[str, Any] = {
        "cluster": None, "directory": tempfile.mkdtemp(prefix="dvml-bench-b22-"),
        "iterations": ITERATIONS[quick], "kill_at": KILL_AT[quick], "runs": {},
        "fit_params": f"batch_size=256, epochs={EPOCHS[quick]}",
    }  # fmt: skip
    try:
        context["cluster"] = t.start_cluster(3, 512 * t.MiB)
        context["frames"] = digits_frames(COPIES[quick])
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        context["arch_id"] = dvml.load_keras_model(
            digits_cnn_json(), name="digits-cnn", registry=context["registry"]
        )
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    t.close_context(context, (TRAIN, VALID))


def _pack(context: dict[str, Any]) -> int:
    """Both sets packed over the 3 workers again (the killed one is back by then)."""
    import dvml

    client = context["cluster"].client
    client.wait_for_workers(3, timeout=120)
    train, valid = context["frames"]
    ds = dvml.training_preprocessor(
        train, y="label", x="pixels", normalizing_const=16.0, name=TRAIN, overwrite=True,
        client=client,
    )  # fmt: skip
    dvml.validation_preprocessor(
        valid, y="label", x="pixels", training=TRAIN, name=VALID, overwrite=True, client=client
    )
    return int(ds.rows)


def _fit(context: dict[str, Any], disturbed: bool) -> float:
    import dvml

    cluster, kill_at = context["cluster"], context["kill_at"]
    rows = _pack(context)
    victim = cluster.processes()[f"dask worker {VICTIM}"]

    def on_iteration(record: dict[str, Any]) -> None:
        if disturbed and record["iteration"] == kill_at:
            os.kill(victim, signal.SIGKILL)  # its vineyardd, and its buffers, stay

    start = time.perf_counter()
    model = dvml.fit(
        TRAIN, MODEL, context["arch_id"], COMPILE, context["fit_params"],
        num_iterations=context["iterations"], sync="iteration", elastic=True,
        on_iteration=on_iteration, resume=False, overwrite=True, progress=False,
        registry=context["registry"], client=cluster.client,
    )  # fmt: skip
    wall = time.perf_counter() - start
    evaluation = dvml.evaluate(MODEL, VALID, registry=context["registry"], client=cluster.client)
    summary = model.summary
    if disturbed and summary.get("departed") != [VICTIM]:
        raise RuntimeError(f"B22: the fit did not lose {VICTIM}: departed {summary['departed']}")
    run = {"wall": wall, "accuracy": float(evaluation["metric"]), "rows": rows,
           "summary": {k: summary.get(k) for k in ("departed_at_iterations", "repinned_rows",
                                                   "repin_seconds", "rows_left_out",
                                                   "rows_per_epoch")}}  # fmt: skip
    context["runs"].setdefault("disturbed" if disturbed else "undisturbed", []).append(run)
    return wall


def _rows_seen(context: dict[str, Any]) -> float:
    """The fewest rows any iteration of the last disturbed run trained per epoch."""
    runs = context["runs"].get("disturbed") or []
    if not runs:
        _fit(context, disturbed=True)
        runs = context["runs"]["disturbed"]
    return float(min(rows for _, rows in runs[-1]["summary"]["rows_per_epoch"]))


def _dataset_rows(context: dict[str, Any]) -> float:
    runs = context["runs"].get("disturbed") or context["runs"].get("undisturbed") or []
    return float(runs[-1]["rows"]) if runs else float(_pack(context))


def details(context: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "iterations": context["iterations"], "killed after iteration": context["kill_at"],
    }  # fmt: skip
    accuracy = {}
    for side, runs in context["runs"].items():
        out[f"{side}: wall s (median)"] = round(statistics.median(r["wall"] for r in runs), 2)
        accuracy[side] = statistics.median(r["accuracy"] for r in runs)
        out[f"{side}: validation accuracy (median)"] = round(accuracy[side], 4)
    if len(accuracy) == 2:
        gap = 100 * (accuracy["undisturbed"] - accuracy["disturbed"])
        out["accuracy gap, points (target <= 1)"] = round(gap, 2)
    if context["runs"].get("disturbed"):
        out["disturbed: last run"] = context["runs"]["disturbed"][-1]["summary"]
    return out


register(
    Benchmark(
        "B22b",
        "elastic fit losing 1 of 3 workers midway vs the same fit undisturbed",
        "s",
        lambda c: _fit(c, disturbed=True),
        lambda c: _fit(c, disturbed=False),
        target=1.5,
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)
register(
    Benchmark(
        "B22c",
        "rows trained per epoch after losing a worker vs the dataset's rows",
        "rows",
        _rows_seen,
        _dataset_rows,
        target=1.0,
        target_op="within",
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)
