"""B21: one of two trainers at half speed for the whole job, against the same job undisturbed.

The slow trainer (issue 37): worker-1's trainers of the job are stopped 50 ms of every 100
(SIGSTOP/SIGCONT, :func:`tests.helpers.trainers.half_speed`, which finds the job's trainers
again every second, so that trainers a job starts anew are slowed too). One LocalCluster of 2
workers (1 thread each), B4's digits in ``COPIES`` copies packed over both in ``BUFFERS``
buffers, the demo CNN (:func:`dvml.examples.digits_cnn_json`), Adam(0.003), global batch 256:

- B21a: ``dvml.fit(sync="iteration")``, ``ITERATIONS`` iterations of ``EPOCHS`` epochs
  (:data:`MITIGATION`: the arguments that let a fit move work off a slow trainer), slowed /
  undisturbed (target <= 1.45; the ideal, a share of rows per speed, is 1.33; without
  mitigation about 2);
- B21b: the same with ``sync="step"`` (target <= 1.6): the slow trainer is named from its
  wait in the step's all-reduce (dvml.train.runtime.collective_wait), whole buffers move off
  it and the global batch is split by rows, rows weighted so that a step's gradient stays
  the mean over the global batch;
- B21c: ``dvml.fit_multiple`` of 8 configurations (4 learning rates x 2 batch sizes, one epoch
  per hop), 2 iterations (target <= 1.45);
- B21d: the iterations of B21a's slowed fit until worker-1 was named in its progress records,
  against one iteration (target <= 1).

Details: each side's wall, and the slowed runs' straggler fields (``straggler_worker``,
``straggler_ratio``, ``trainer_step_seconds``) and what they moved.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import pandas as pd

from benchmarks import _training as t
from benchmarks.b4_end_to_end import digits_frames
from benchmarks.harness import Benchmark, register

COPIES = {False: 60, True: 2}
ITERATIONS = {False: 5, True: 2}
EPOCHS = {False: 4, True: 1}
TRAIN, MODEL = "bench_b21_digits", "bench_b21_cnn"
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate={lr})', " \
    "metrics=['accuracy']"  # fmt: skip
SLOW = "worker-1"
BUFFERS = 16  # of the training set, over both workers
# What a fit is given to move work off a slow trainer (issue 37 item 2).
MITIGATION: dict[str, Any] = {"elastic": True}
STRAGGLER_FIELDS = ("straggler_worker", "straggler_ratio", "straggler_iterations",
                    "trainer_step_seconds", "rebalanced_at_iterations", "moved_rows",
                    "row_map_changes")  # fmt: skip


def prepare(quick: bool) -> dict[str, Any]:
    import dvml
    from dvml.examples import digits_cnn_json

    context: dict[str, Any] = {
        "cluster": None, "directory": tempfile.mkdtemp(prefix="dvml-bench-b21-"),
        "iterations": ITERATIONS[quick], "epochs": EPOCHS[quick], "runs": {}, "named": [],
    }  # fmt: skip
    try:
        cluster = context["cluster"] = t.start_cluster(2, 512 * t.MiB)
        context["train"], _ = digits_frames(COPIES[quick])
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        context["arch_id"] = dvml.load_keras_model(
            digits_cnn_json(), name="digits-cnn", registry=context["registry"]
        )
        context["client"] = cluster.client
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    t.close_context(context, (TRAIN,))


def _pack(context: dict[str, Any]) -> None:
    """The training set over both workers again: a fit that moved rows left it elsewhere."""
    import dvml

    # 16 buffers: rows move between trainers as whole buffers, so each worker holds several
    dvml.training_preprocessor(
        context["train"], y="label", x="pixels", normalizing_const=16.0, name=TRAIN,
        buffer_size=-(-len(context["train"]) // BUFFERS), overwrite=True,
        client=context["client"],
    )  # fmt: skip


def _slowed(context: dict[str, Any], slow: bool, **fields: Any) -> Any:
    import contextlib

    from tests.helpers.trainers import half_speed

    return half_speed(context["cluster"], SLOW, **fields) if slow else contextlib.nullcontext()


def _fit(context: dict[str, Any], sync: str, slow: bool) -> float:
    import dvml

    _pack(context)
    records: list[dict[str, Any]] = []
    with _slowed(context, slow, model=MODEL):
        start = time.perf_counter()
        model = dvml.fit(
            TRAIN, MODEL, context["arch_id"], COMPILE.format(lr=0.003),
            f"batch_size=256, epochs={context['epochs']}", num_iterations=context["iterations"],
            sync=sync, on_iteration=records.append, resume=False, overwrite=True,
            progress=False, registry=context["registry"], client=context["client"],
            **MITIGATION,
        )  # fmt: skip
        wall = time.perf_counter() - start
    if slow and sync == "iteration":
        named = [r["iteration"] for r in records if any(s["worker"] == SLOW for s in
                                                        r.get("stragglers") or [])]  # fmt: skip
        context["named"].append(named[0] if named else float("inf"))
    _keep(context, f"{sync}, {'slowed' if slow else 'undisturbed'}", wall, model.summary)
    return wall


def _configs(arch_id: int) -> pd.DataFrame:
    """8 configurations: 4 learning rates x 2 batch sizes."""
    pairs = [(lr, batch) for lr in (0.001, 0.003, 0.01, 0.03) for batch in (64, 128)]
    return pd.DataFrame(
        [
            {
                "mst_key": k,
                "model_id": arch_id,
                "compile_params": COMPILE.format(lr=lr),
                "fit_params": f"batch_size={batch}, epochs=1",
            }
            for k, (lr, batch) in enumerate(pairs, start=1)
        ]
    )


def _fit_multiple(context: dict[str, Any], slow: bool) -> float:
    import dvml

    _pack(context)
    with _slowed(context, slow, model_output="bench_b21_mop"):
        start = time.perf_counter()
        selection = dvml.fit_multiple(
            TRAIN, "bench_b21_mop", _configs(context["arch_id"]), 2, resume=False,
            overwrite=True, progress=False, registry=context["registry"],
            client=context["client"],
        )  # fmt: skip
        wall = time.perf_counter() - start
    _keep(context, f"fit_multiple, {'slowed' if slow else 'undisturbed'}", wall,
          selection.summary)  # fmt: skip
    return wall


def _keep(context: dict[str, Any], side: str, wall: float, summary: dict[str, Any]) -> None:
    found = {k: summary[k] for k in STRAGGLER_FIELDS if k in summary}
    context["runs"].setdefault(side, []).append({"wall": wall, "summary": found})


def _iterations_to_name(context: dict[str, Any]) -> float:
    if not context["named"]:
        _fit(context, "iteration", slow=True)
    return float(context["named"][-1])


def details(context: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"iterations": context["iterations"], "epochs": context["epochs"],
                           "mitigation": MITIGATION}  # fmt: skip
    for side, runs in context["runs"].items():
        out[f"{side}: wall s (median)"] = round(statistics.median(r["wall"] for r in runs), 2)
        if "slowed" in side:
            out[f"{side}: last run"] = runs[-1]["summary"]
    if context["named"]:
        out["iteration worker-1 was first named, per slowed run"] = context["named"]
    return out


for key, title, sync, target in (
    ("B21a", "fit sync='iteration' with one of 2 trainers at half speed vs undisturbed",
     "iteration", 1.45),
    ("B21b", "fit sync='step' with one of 2 trainers at half speed vs undisturbed", "step", 1.6),
):  # fmt: skip
    register(
        Benchmark(
            key,
            title,
            "s",
            lambda c, sync=sync: _fit(c, sync, slow=True),
            lambda c, sync=sync: _fit(c, sync, slow=False),
            target=target,
            prepare=prepare,
            cleanup=cleanup,
            details=details,
        )
    )
register(
    Benchmark(
        "B21c",
        "fit_multiple of 8 configurations with one of 2 workers at half speed vs undisturbed",
        "s",
        lambda c: _fit_multiple(c, slow=True),
        lambda c: _fit_multiple(c, slow=False),
        target=1.45,
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)
register(
    Benchmark(
        "B21d",
        "iterations until the slow trainer of B21a is named vs one iteration",
        "iterations",
        _iterations_to_name,
        lambda c: 1.0,
        target=1.0,
        prepare=prepare,
        cleanup=cleanup,
        details=details,
    )
)
