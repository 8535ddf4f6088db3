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

- B22a: wall time of an elastic fit started on 2 workers, a third added once iteration
  ``JOIN_AFTER`` is reported (it trains from the next boundary, :mod:`dvml.train.row_map_change`)
  / the same fit started on 3 workers (target <= 1.2). Each side packs onto a cluster of its
  own, started outside the clock (2 workers, or 3); ``add_worker`` runs in a thread, as a
  worker joining from outside would. Details: the iteration it joined at, and the training
  bytes moved onto it / its share of the training set's bytes (issue target <= 1.1);
- B22b: wall time of the disturbed fit / the undisturbed one (target <= 1.5); details: both
  validation accuracies and their gap in points (issue target: within 1 point), the re-pin's
  rows and seconds, and the iteration the survivors resumed from;
- B22c: the rows trained per epoch in the disturbed run (the fewest over its iterations, from
  the trainers' own counts: ``rows_per_epoch``) / the dataset's rows (target: exactly 1.0).

Data: B4's digits in ``COPIES`` shifted, noisy copies (80 % training: 86,256 rows, 2 epochs
per iteration; ``--quick``: 2 copies, 1 epoch, 4 iterations, killed after 2). B22a packs the
training set in 12 buffers on both sides (whole buffers move) and runs 10 iterations of 2
epochs (``--quick``: 6 of 10).
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import threading
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
JOIN_AFTER = 1  # the third worker is added once iteration 1 is reported: it joins in 2
# B22a: whole buffers move onto the new worker, no more than its share: 12 buffers are 6 per
# worker on 2 and 4 on 3, so its share is exactly 4 of them. Quick runs train longer
# iterations, so that the worker (a few seconds to start) is up before the last boundary.
JOIN_BUFFERS = 12
JOIN_SIZE = {False: (10, 2), True: (6, 10)}  # (iterations, epochs per iteration)


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


def _pack(context: dict[str, Any], workers: int = 3, buffers: int | None = None) -> int:
    """Both sets packed over the cluster's ``workers`` workers again (a killed one is back by
    then), the training set in ``buffers`` buffers (default: one per worker)."""
    import dvml

    client = context["cluster"].client
    client.wait_for_workers(workers, timeout=120)
    train, valid = context["frames"]
    ds = dvml.training_preprocessor(
        train, y="label", x="pixels", normalizing_const=16.0, name=TRAIN, overwrite=True,
        buffer_size=-(-len(train) // buffers) if buffers else None, client=client,
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


def _join_fit(context: dict[str, Any], joined: bool) -> float:
    """One side of B22a on a cluster of its own: 2 workers and a third added during the fit,
    or 3 from the start."""
    import dvml

    context["cluster"] = cluster = t.start_cluster(2 if joined else 3, 512 * t.MiB)
    try:
        rows = _pack(context, workers=2 if joined else 3, buffers=JOIN_BUFFERS)
        adding: list[threading.Thread] = []

        def on_iteration(record: dict[str, Any]) -> None:
            if joined and record["iteration"] == JOIN_AFTER and not adding:
                adding.append(threading.Thread(target=cluster.add_worker, daemon=True))
                adding[0].start()

        start = time.perf_counter()
        model = dvml.fit(
            TRAIN, MODEL, context["arch_id"], COMPILE, context["fit_params"],
            num_iterations=context["iterations"], sync="iteration", elastic=True,
            on_iteration=on_iteration, resume=False, overwrite=True, progress=False,
            registry=context["registry"], client=cluster.client,
        )  # fmt: skip
        wall = time.perf_counter() - start
        for thread in adding:
            thread.join(120)
        summary = model.summary
        if joined and len(summary.get("joined") or []) != 1:
            raise RuntimeError(f"B22a: the added worker did not join the fit: {summary}")
        share = dvml.datasets.describe(TRAIN, client=cluster.client).nbytes / 3
        evaluation = dvml.evaluate(MODEL, VALID, registry=context["registry"],
                                   client=cluster.client)  # fmt: skip
        kept = (
            "joined_at_iterations",
            "rebalanced_at_iterations",
            "moved_rows",
            "moved_bytes",
            "rows_per_epoch",
        )
        changes = summary.get("row_map_changes") or []
        # the join's own moves (a speed move may follow it: counted in moved_bytes, not here)
        joined_bytes = sum(int(c["training"].get("bytes_moved", 0)) for c in changes
                           if c["kind"] == "join")  # fmt: skip
        run = {"wall": wall, "accuracy": float(evaluation["metric"]), "rows": rows,
               "moved_over_share": joined_bytes / share,
               "summary": {**{k: summary.get(k) for k in kept},
                           "changes": [c["kind"] for c in changes]}}  # fmt: skip
        context["runs"].setdefault("joined" if joined else "on 3", []).append(run)
        return wall
    finally:
        t.close_context({**context, "registry": None}, (TRAIN, VALID))
        context["cluster"] = None


def prepare_join(quick: bool) -> dict[str, Any]:
    """B22a's context: the data, a registry and the architecture; clusters come per run."""
    import dvml
    from dvml.examples import digits_cnn_json

    iterations, epochs = JOIN_SIZE[quick]
    context: dict[str, Any] = {
        "cluster": None, "directory": tempfile.mkdtemp(prefix="dvml-bench-b22a-"),
        "iterations": iterations, "runs": {}, "fit_params": f"batch_size=256, epochs={epochs}",
    }  # fmt: skip
    try:
        context["frames"] = digits_frames(COPIES[quick])
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        context["arch_id"] = dvml.load_keras_model(
            digits_cnn_json(), name="digits-cnn", registry=context["registry"]
        )
    except BaseException:
        cleanup(context)
        raise
    return context


def join_details(context: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"iterations": context["iterations"], "added after iteration": JOIN_AFTER}
    for side, runs in context["runs"].items():
        out[f"{side}: wall s (median)"] = round(statistics.median(r["wall"] for r in runs), 2)
        out[f"{side}: validation accuracy (median)"] = round(
            statistics.median(r["accuracy"] for r in runs), 4
        )
    if context["runs"].get("joined"):
        last = context["runs"]["joined"][-1]
        out["bytes the join moved / the new worker's share (target <= 1.1)"] = round(
            last["moved_over_share"], 3
        )
        out["joined: last run"] = last["summary"]
    return out


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
        "B22a",
        "elastic fit on 2 workers, a third added after iteration 1, vs the fit on 3",
        "s",
        lambda c: _join_fit(c, joined=True),
        lambda c: _join_fit(c, joined=False),
        target=1.2,
        prepare=prepare_join,
        cleanup=cleanup,
        details=join_details,
    )
)
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
