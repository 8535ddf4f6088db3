"""B10: training-only scaling: samples/s of 1, 2 (and 4) trainers per sync mode vs plain tf-keras.

What is measured: the samples per second that :func:`dvml.fit` trains, counting only the
trainers' ``model.fit`` time of one iteration (the slowest trainer's, averaging included; the
trainer start, the partitions' opening and the end-of-fit metrics are left out), against
``model.fit`` of the same model on the same rows in one plain tf-keras process (data already
in memory, the model built afresh each run). The plain runner is B4's (``python -m
benchmarks.b4_end_to_end plain``), started once.

Rows, one per (sync mode, trainers): B10a-B10b ``sync="iteration"`` on 1 and 2 trainers, then
B10c-B10d ``sync="step"`` on 1 and 2 trainers. On a host with at least 4 cores the cluster has
4 workers and 4-trainer rows are added (the iteration ones first, then the step ones). Each
trainer count has its own copy of the data, packed on the first ``n`` workers
(``distribution_rules`` = their names), so every row trains on the same rows.

Reported apart, on the step rows: the per-step cost of the gradient all-reduce, i.e. the step
mode's time per step minus the iteration mode's LOCAL time per step (its averaging removed)
at the same trainer count; on the iteration rows: the seconds one weight average takes.

Data: B4's digits (shifted, noisy copies of scikit-learn's digits, 80 % of them), global
batch 256, 20 copies (28,760 training rows) and 4 epochs; ``--quick``: 2 copies, 1 epoch.
Targets (rates, dvml / plain): ``>= 1.0`` for model averaging (trainers that do not talk every
step should not be slower than one process), ``>= 0.33`` for the step mode (B4's "at most 3x").
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import tempfile
from typing import Any

from benchmarks import _training as t
from benchmarks import b4_end_to_end as b4
from benchmarks.harness import Benchmark, register

SIZES = {False: (20, 4), True: (2, 1)}  # quick -> (copies of the 1797 digits, epochs)
BATCH = b4.BATCH
MAX_TRAINERS = 4 if (os.cpu_count() or 1) >= 4 else 2
COUNTS = (1, 2, 4) if MAX_TRAINERS >= 4 else (1, 2)
MODES = ("iteration", "step")
TARGETS = {"iteration": 1.0, "step": 0.33}


def _dataset(n: int) -> str:
    return f"bench_b10_digits_{n}"


def prepare(quick: bool) -> dict[str, Any]:
    import dvml

    copies, epochs = SIZES[quick]
    plain, log = b4.start_plain_runner(copies, epochs)
    context: dict[str, Any] = {
        "plain": plain, "log": log, "cluster": None, "epochs": epochs, "registry": None,
        "directory": tempfile.mkdtemp(prefix="dvml-bench-b10-"), "runs": {}, "plain_runs": [],
    }  # fmt: skip
    try:
        cluster = context["cluster"] = t.start_cluster(MAX_TRAINERS, 256 * t.MiB)
        train, _ = b4.digits_frames(copies)
        names = cluster.worker_table()["name"].tolist()
        for n in COUNTS:
            dvml.training_preprocessor(
                train, y="label", x="pixels", normalizing_const=16.0, name=_dataset(n),
                distribution_rules=names[:n], overwrite=True, client=cluster.client,
            )  # fmt: skip
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        model_json = b4._ask(context, {"model_json": True})["model_json"]
        context["arch_id"] = dvml.load_keras_model(
            model_json, name="digits-cnn", registry=context["registry"]
        )
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    t.stop_process(context["plain"])
    context["log"].close()
    cluster = context["cluster"]
    if cluster is not None:
        for n in COUNTS:
            t.drop_dataset(cluster, _dataset(n))
        cluster.close()
    if context.get("registry") is not None:
        context["registry"].close()
    shutil.rmtree(context["directory"], ignore_errors=True)


def dvml_side(context: dict[str, Any], sync: str, n: int) -> float:
    import dvml
    from dvml.demo import COMPILE_PARAMS

    records: list[dict[str, Any]] = []
    model = dvml.fit(
        _dataset(n), f"bench_b10_{sync}_{n}", context["arch_id"], COMPILE_PARAMS,
        f"batch_size={BATCH}, epochs={context['epochs']}", num_iterations=1, resume=False,
        overwrite=True, sync=sync, on_iteration=records.append, progress=False,
        registry=context["registry"], client=context["cluster"].client,
    )  # fmt: skip
    record = records[0]
    rows = [p["rows"] for p in model.summary["trainer_partitions"].values()]
    per_worker = BATCH // n
    steps = min(rows) // per_worker * context["epochs"]
    samples = n * steps * per_worker
    run = {
        "seconds": float(record["fit_seconds"]),
        "averaging": float(record.get("averaging_seconds") or 0.0),
        "steps": steps,
    }
    context["runs"].setdefault((sync, n), []).append(run)
    return samples / run["seconds"]


def plain_side(context: dict[str, Any]) -> float:
    reply = b4._ask(context, {"train_only": True})
    context["plain_runs"].append(reply)
    return float(reply["samples"]) / float(reply["seconds"])


def _ms_per_step(runs: list[dict[str, Any]], local_only: bool) -> float:
    return 1000 * statistics.median(
        (r["seconds"] - (r["averaging"] if local_only else 0.0)) / r["steps"] for r in runs
    )


def details(context: dict[str, Any], sync: str, n: int) -> dict[str, Any]:
    runs = context["runs"].get((sync, n), [])
    found: dict[str, Any] = {"sync": sync, "trainers": n}
    if not runs:
        return found
    found["ms per step"] = round(_ms_per_step(runs, local_only=False), 2)
    if sync == "iteration":
        found["s per weight average"] = round(statistics.median(r["averaging"] for r in runs), 4)
    local = context["runs"].get(("iteration", n), [])
    if sync == "step" and local:
        local_ms = _ms_per_step(local, local_only=True)
        found["local ms per step (iteration mode, averaging removed)"] = round(local_ms, 2)
        found["all-reduce ms per step"] = round(found["ms per step"] - local_ms, 2)
    if context["plain_runs"]:
        plain = statistics.median(r["seconds"] for r in context["plain_runs"])
        found["plain fit s (median)"] = round(plain, 2)
    return found


def _register(key: str, sync: str, n: int) -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=f"training samples/s, {n} trainer(s), sync={sync!r} vs plain tf-keras",
            unit="samples/s",
            dvml=functools.partial(dvml_side, sync=sync, n=n),
            baseline=plain_side,
            target=TARGETS[sync],
            target_op=">=",
            prepare=prepare,
            cleanup=cleanup,
            details=functools.partial(details, sync=sync, n=n),
        )
    )


ROWS = [
    _register(f"B10{chr(ord('a') + i)}", sync, n)
    for i, (sync, n) in enumerate((s, n) for s in MODES for n in COUNTS)
]
