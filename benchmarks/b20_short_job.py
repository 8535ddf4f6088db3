"""B20: a short job from a fresh process to the evaluated model: dvml vs plain tf-keras vs Ray.

The job (issue 29): B4's digits x20 (28,760 training and 7,190 validation rows, shifted noisy
copies), the demo CNN (:func:`dvml.examples.digits_cnn_json`), Adam(0.003), global batch 256,
4 epochs, 2 workers of one CPU each, then evaluate on the validation rows. Each side is ONE
fresh process (:mod:`benchmarks._peers`), given the rows as pandas frames with one 8x8x1 image
per row:

- dvml (``python -m benchmarks.b20_short_job dvml DIR``): ``import dvml``, a 2-worker
  :class:`dvml.LocalCluster` (TLS, private etcd: the defaults), :func:`dvml.training_preprocessor`
  and :func:`dvml.validation_preprocessor` (``normalizing_const=16``), :func:`dvml.fit`
  (``sync="iteration"``, the default on CPUs; one iteration of 4 epochs), :func:`dvml.evaluate`;
- plain (``python -m benchmarks.b20_short_job plain DIR``): one tf-keras process: stack, scale,
  one-hot, ``fit(shuffle=True)``, ``evaluate``;
- Ray (``benchmarks/ray_peer.py fit DIR`` in Ray's own environment, ``./scripts/peer-ray``):
  ``ray.init``, ``from_pandas`` + ``map_batches`` + ``materialize``, ``TensorflowTrainer`` with
  ``model.fit`` per epoch on ``to_tf`` under ``MultiWorkerMirroredStrategy``, ``evaluate`` on
  the chief.

Rows, all read from the same runs (:func:`benchmarks._peers.take`), dvml / peer:

- B20a: wall time from the process's spawn to the evaluated model, vs plain (target <= 2.0);
- B20b: the same vs Ray (target <= 0.5; skipped without the Ray environment, as B20d is);
- B20c: training alone (the trainers' ``model.fit`` time of the iteration, the slowest
  trainer's; plain: its ``fit``), vs plain (target <= 1.0);
- B20d: ingest of the training frame (dvml: :func:`dvml.training_preprocessor`; Ray:
  ``from_pandas`` + ``map_batches`` + ``materialize``), vs Ray (target <= 1.0);
- B20e: peak memory of the whole process tree as if it ran alone (every resident page once,
  :func:`benchmarks._peers.tree_memory`), vs plain (target <= 2.0). From runs of their own:
  sampling the pages costs CPU, which the timed runs must not lose.

Details: every side's phases (seconds since its spawn), dvml's breakdown of the fixed costs
(cluster start, validation ingest, trainer start, after the iteration, evaluate), each side's
validation accuracy, its peak memory and that peak by kind of process.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks import _peers
from benchmarks.harness import Benchmark, Skipped, register

SIZES = {False: (20, 4), True: (4, 2)}  # quick -> (copies of the 1797 digits, epochs)
BATCH, WORKERS, SYNC = 256, 2, "iteration"
TRAIN, VALID, MODEL = "bench_b20_digits", "bench_b20_digits_val", "bench_b20_cnn"
MiB = 1 << 20


def prepare(quick: bool) -> dict[str, Any]:
    copies, epochs = SIZES[quick]
    context: dict[str, Any] = {"directory": tempfile.mkdtemp(prefix="dvml-bench-b20-")}
    try:  # the Ray rows are skipped alone when Ray is missing; the plain rows still run
        context["python"] = _peers.ray_python()
    except Skipped as exc:
        context["python_error"] = str(exc)
    context["rows"] = _peers.write_inputs(context["directory"], copies, epochs, BATCH, WORKERS)
    return context


def _run(context: dict[str, Any], side: str, memory: bool = False) -> dict[str, Any]:
    directory = context["directory"]
    if side == "ray":
        command = _peers.ray_command(context["python"], "fit", directory)
    else:
        command = _peers.dvml_command(__name__, side, directory)
    return _peers.run_side(command, directory, side, memory=memory)


FIGURES = {  # row -> (peer, the figure of a run)
    "B20a": ("plain", lambda r: r["to_model_s"]),
    "B20b": ("ray", lambda r: r["to_model_s"]),
    "B20c": ("plain", lambda r: r["training_s"]),
    "B20d": ("ray", lambda r: r["ingest_s"]),
    "B20e": ("plain", lambda r: r["peak_memory_bytes"] / MiB),
}
MEMORY_ROWS = {"B20e"}


def _figure(context: dict[str, Any], row: str, side: str) -> float:
    if FIGURES[row][0] == "ray" and "python" not in context:  # before dvml's side runs in vain
        raise Skipped(context["python_error"])
    name = "dvml" if side == "dvml" else FIGURES[row][0]
    memory = row in MEMORY_ROWS
    run = functools.partial(_run, context, name, memory=memory)
    result = _peers.take(context, row, f"{name} (memory)" if memory else name, run)
    return float(FIGURES[row][1](result))


def details(context: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"training rows": context["rows"], "dvml sync": SYNC}
    for side, runs in context.get("runs", {}).items():
        if "peak_memory_bytes" in runs[-1]:
            out[f"{side}: peak MiB (median)"] = round(
                statistics.median(r["peak_memory_bytes"] for r in runs) / MiB
            )
            out[f"{side}: peak MiB by process (last run)"] = {
                k: round(v / MiB) for k, v in sorted(runs[-1]["peak_memory_by_kind"].items())
            }
            continue
        out[f"{side}: to evaluated model s (median)"] = round(
            statistics.median(r["to_model_s"] for r in runs), 2
        )
        out[f"{side}: validation accuracy (last run)"] = round(runs[-1]["valid_accuracy"], 4)
        out[f"{side}: phases (s since spawn, last run)"] = runs[-1]["phases"]
    return out


# ---------------------------------------------------------------- the sides' processes


def _frames(directory: str) -> tuple[Any, Any]:
    import numpy as np
    import pandas as pd

    frames = []
    for name in ("data", "valid"):
        data = np.load(os.path.join(directory, f"{name}.npz"))
        frames.append(pd.DataFrame({"pixels": list(data["x"]), "label": data["y"]}))
    return frames[0], frames[1]


def _write(directory: str, side: str, result: dict[str, Any]) -> int:
    with open(os.path.join(directory, f"result-{side}.json"), "w") as f:
        json.dump(result, f)
    return 0


def dvml_job(directory: str) -> int:
    """dvml's side: cluster, ingest, fit, evaluate (then the cluster's close, after the clock)."""
    since = _peers.since_spawn()
    import dvml
    from dvml.examples import COMPILE_PARAMS

    phases = {"import dvml": since()}
    with open(os.path.join(directory, "job.json")) as f:
        job = json.load(f)
    train_frame, valid_frame = _frames(directory)
    phases["frames loaded"] = since()
    records: list[dict[str, Any]] = []
    with dvml.LocalCluster(n_workers=WORKERS, dashboard_address="127.0.0.1:0",
                           set_as_default=False) as cluster:  # fmt: skip
        client = cluster.client
        phases["cluster start"] = since()
        train = dvml.training_preprocessor(
            train_frame,
            y="label",
            x="pixels",
            normalizing_const=16.0,
            name=TRAIN,
            overwrite=True,
            client=client,
        )
        phases["ingest training"] = since()
        valid = dvml.validation_preprocessor(
            valid_frame,
            y="label",
            x="pixels",
            training=train,
            name=VALID,
            overwrite=True,
            client=client,
        )
        phases["ingest validation"] = since()
        registry = dvml.Registry(f"sqlite:///{directory}/registry.db")
        arch_id = dvml.load_keras_model(job["model_json"], name="digits-cnn", registry=registry)
        phases["registry"] = since()
        dvml.fit(
            train,
            MODEL,
            arch_id,
            COMPILE_PARAMS,
            f"batch_size={BATCH}, epochs={job['epochs']}",
            num_iterations=1,
            resume=False,
            overwrite=True,
            sync=SYNC,
            on_iteration=records.append,
            progress=False,
            registry=registry,
            client=client,
        )
        phases["fit"] = since()
        evaluated = dvml.evaluate(MODEL, valid, batch_size=BATCH, registry=registry,
                                  client=client)  # fmt: skip
        phases["model"] = since()  # evaluated
    phases["cluster closed"] = since()
    record = records[0]
    return _write(directory, "dvml", {
        "phases": phases,
        "training_s": float(record["fit_seconds"]),
        "ingest_s": phases["ingest training"] - phases["cluster start"],
        "valid_accuracy": float(evaluated["metric"]),
        "trainer_run_s": float(record["elapsed_s"]),
    })  # fmt: skip


def plain_job(directory: str) -> int:
    """The plain side: one tf-keras process on the same rows, model and batch."""
    since = _peers.since_spawn()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # As tf-keras asks of TensorFlow >= 2.16 (and dvml's processes do): tf.keras is tf_keras,
    # and Keras 3 is never loaded (~90 MiB less). Set here, not inherited: the harness sets it
    # only once it has imported TensorFlow itself.
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tf_keras as keras

    phases = {"import tf_keras": since()}
    with open(os.path.join(directory, "job.json")) as f:
        job = json.load(f)
    train_frame, valid_frame = _frames(directory)
    phases["frames loaded"] = since()
    arrays = []
    for frame in (train_frame, valid_frame):
        x = np.stack(frame["pixels"].to_list()).astype("float32") / 16.0
        y = keras.utils.to_categorical(frame["label"].to_numpy(), 10)
        arrays.append((x, y))
    phases["ingest"] = since()
    model = keras.models.model_from_json(job["model_json"])
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.003),
                  metrics=["accuracy"])  # fmt: skip
    start = time.perf_counter()
    model.fit(*arrays[0], batch_size=BATCH, epochs=int(job["epochs"]), shuffle=True, verbose=0)
    training = time.perf_counter() - start
    phases["fit"] = since()
    _, accuracy = model.evaluate(*arrays[1], batch_size=BATCH, verbose=0)
    phases["model"] = since()  # evaluated
    return _write(directory, "plain", {
        "phases": phases, "training_s": training,
        "ingest_s": phases["ingest"] - phases["frames loaded"],
        "valid_accuracy": float(accuracy),
    })  # fmt: skip


def _register(key: str, title: str, unit: str, target: float) -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=title,
            unit=unit,
            target=target,
            target_op="<=",
            dvml=functools.partial(_figure, row=key, side="dvml"),
            baseline=functools.partial(_figure, row=key, side="peer"),
            prepare=prepare,
            cleanup=_peers.cleanup,
            details=details,
        )
    )


B20A = _register("B20a", "short job, spawn to evaluated model vs plain tf-keras", "s", 2.0)
B20B = _register("B20b", "short job, spawn to evaluated model vs Ray Train + Ray Data", "s", 0.5)
B20C = _register("B20c", "short job, training alone vs plain tf-keras", "s", 1.0)
B20D = _register("B20d", "short job, ingest of the training frame vs Ray Data", "s", 1.0)
B20E = _register("B20e", "short job, peak memory of the process tree vs plain tf-keras", "MiB", 2.0)


if __name__ == "__main__":
    jobs = {"dvml": dvml_job, "plain": plain_job}
    if len(sys.argv) != 3 or sys.argv[1] not in jobs:
        sys.exit("usage: python -m benchmarks.b20_short_job dvml|plain DIR")
    sys.exit(jobs[sys.argv[1]](sys.argv[2]))
