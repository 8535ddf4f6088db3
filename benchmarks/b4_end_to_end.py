"""B4: digits end to end (preprocess, 2-worker fit, evaluate) vs plain single-process tf.keras.

Two rows, one per way the trainers synchronise (``dvml.fit(..., sync=...)``), on one cluster
and one plain runner: B4a ``sync="iteration"`` (MADlib's model averaging once per iteration,
target <= 1.0: two trainers on two cores are not slower than one process) and B4b
``sync="step"`` (MultiWorkerMirroredStrategy's gradient all-reduce every step, target <= 3).

What is measured, per repeat and side: the wall time from a pandas DataFrame of digit images
(``id``, ``pixels`` 8x8x1, ``label``) to a trained model and its validation loss and accuracy.

- dvml side, on a two-worker LocalCluster started once (its start is reported apart):
  :func:`dvml.training_preprocessor` + :func:`dvml.validation_preprocessor`
  (``normalizing_const=16``), :func:`dvml.fit` of :func:`dvml.demo.digits_cnn_json` with one
  trainer per worker (``num_iterations=1``, the row's ``sync``), then
  :func:`dvml.evaluate` on the validation set. This includes starting the two trainer
  processes (TensorFlow import, collective set-up) and dvml's end-of-fit metrics on the
  training rows. The datasets are dropped after each repeat, outside the clock.
- baseline: the same frames, model, optimizer, global batch and epochs in one tf-keras
  process: stack the pixels, divide by 16, one-hot encode, ``fit(shuffle=True)``,
  ``evaluate``. It runs in a long-lived subprocess (``python -m benchmarks.b4_end_to_end
  plain``) that imported TensorFlow beforehand; the model is built afresh for every run.

Data: scikit-learn's 1797 digits, replicated with a whole-image shift of up to one pixel and
Gaussian noise per copy (150 copies: 269550 rows, 80 % training), global batch 256 (128 per
trainer), 24 epochs: the plain run takes 30-50 s on 2 cores. ``--quick``: 4 copies (7188 rows),
2 epochs, a few seconds of training.

Reported apart (details): the fixed start-up costs, i.e. the cluster
start, TensorFlow's import in the Dask workers (``dvml.evaluate`` runs there; done once, before
the first repeat), the trainer start per fit (fit's wall time until the first iteration began:
task submission, process start, TensorFlow import, MultiWorkerMirroredStrategy set-up, opening
the local partitions; not the end-of-iteration metrics pass), and the ratio without the trainer
start; and where each side's seconds went, per run (median): dvml's preprocessing of the
training and validation sets, fit's wall time split into trainer start, training, the
end-of-iteration metrics pass (the trainers' ``metrics_seconds``) and what follows the
iteration (weights back to the client, the registry, the trainers' exit), and evaluate; the
plain side's stacking and scaling, fit and evaluate. Also how many of the fit's trainers were
standby trainers (``fit: trainers from a standby``: the first fit's are warmed while the
training set packs) and the slowest trainer's exit after its last line (``fit: trainer exit``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import _training as t
from benchmarks.harness import Benchmark, register

SIZES = {False: (150, 24), True: (4, 2)}  # quick -> (copies of the 1797 digits, epochs)
BATCH, SEED, TRAIN_FRACTION = 256, 0, 0.8
TRAIN, VALID, MODEL = "bench_b4_digits", "bench_b4_digits_val", "bench_b4_cnn"
PROTOCOL = "B4 "


def digits_frames(copies: int, seed: int = SEED) -> tuple[Any, Any]:
    """Training and validation frames of ``copies`` shifted, noisy copies of the digits."""
    import numpy as np
    import pandas as pd

    from dvml.examples import digits_frame

    base = digits_frame(seed)
    images = np.stack(base["pixels"].to_list())
    rng = np.random.default_rng(seed)
    pieces = [images]
    for _ in range(copies - 1):
        dy, dx = (int(v) for v in rng.integers(-1, 2, size=2))
        shifted = np.roll(images, (dy, dx), axis=(1, 2))
        noise = rng.normal(0.0, 0.5, size=shifted.shape).astype(np.float32)
        pieces.append(np.clip(shifted + noise, 0.0, 16.0))
    x = np.concatenate(pieces)
    labels = np.tile(base["label"].to_numpy(), copies)
    order = rng.permutation(len(x))
    frame = pd.DataFrame(
        {"id": np.arange(len(x)), "pixels": list(x[order]), "label": labels[order]}
    )
    split = int(len(frame) * TRAIN_FRACTION)
    return frame.iloc[:split].reset_index(drop=True), frame.iloc[split:].reset_index(drop=True)


# -- the benchmark process -------------------------------------------------------------------


def start_plain_runner(copies: int, epochs: int) -> tuple[subprocess.Popen[str], Any]:
    """The long-lived plain tf-keras process (``plain``, below) and the file its stderr goes to.

    B10 uses it too. The caller closes both (:func:`cleanup`).
    """
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed by the caller)
    plain = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.b4_end_to_end", "plain", str(copies), str(epochs)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=t.ROOT,
        env=t.tf_child_env(),
    )  # fmt: skip
    return plain, log


def prepare(quick: bool) -> dict[str, Any]:
    import dvml

    copies, epochs = SIZES[quick]
    plain, log = start_plain_runner(copies, epochs)
    context: dict[str, Any] = {
        "plain": plain, "log": log, "cluster": None, "epochs": epochs,
        "directory": tempfile.mkdtemp(prefix="dvml-bench-b4-"),
        "startup": {}, "trainer_start": {}, "dvml_times": {}, "plain_times": {},
        "fit_seconds": {}, "dvml_accuracy": {}, "plain_accuracy": {},
        "dvml_parts": {}, "plain_parts": {},
    }  # fmt: skip
    try:
        start = time.perf_counter()
        cluster = context["cluster"] = t.start_cluster(2, 256 * t.MiB)
        context["startup"]["cluster start s"] = time.perf_counter() - start
        start = time.perf_counter()
        cluster.client.run(_import_tensorflow)
        context["startup"]["worker TF import s"] = time.perf_counter() - start
        context["train"], context["valid"] = digits_frames(copies)
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        model_json = _ask(context, {"model_json": True})["model_json"]
        context["arch_id"] = dvml.load_keras_model(
            model_json, name="digits-cnn", registry=context["registry"]
        )
    except BaseException:
        cleanup(context)
        raise
    return context


def _import_tensorflow() -> None:
    """Run in each Dask worker: the import dvml.evaluate would otherwise pay on first use."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras  # noqa: F401


def _ask(context: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    plain = context["plain"]
    plain.stdin.write(json.dumps(message) + "\n")
    plain.stdin.flush()
    while True:
        line = plain.stdout.readline()
        if not line:
            context["log"].seek(0)
            tail = context["log"].read()[-2000:]
            raise RuntimeError(f"The B4 plain runner exited ({plain.wait(10)}). Its log:\n{tail}")
        if line.startswith(PROTOCOL):
            reply = json.loads(line[len(PROTOCOL) :])
            if "error" in reply:
                raise RuntimeError(f"The B4 plain runner failed: {reply['error']}")
            return dict(reply)


def cleanup(context: dict[str, Any]) -> None:
    t.stop_process(context["plain"])
    context["log"].close()
    cluster = context["cluster"]
    if cluster is not None:
        for name in (TRAIN, VALID):
            t.drop_dataset(cluster, name)
        cluster.close()
    if context.get("registry") is not None:
        context["registry"].close()
    shutil.rmtree(context["directory"], ignore_errors=True)


def dvml_side(context: dict[str, Any], sync: str) -> float:
    import dvml
    from dvml.examples import COMPILE_PARAMS

    client, registry = context["cluster"].client, context["registry"]
    first: list[tuple[float, float]] = []

    def on_iteration(record: dict[str, Any]) -> None:
        if not first:  # when the first iteration ended, and how long it ran in the trainers
            ran = float(record["elapsed_s"]) + float(record.get("metrics_seconds", 0.0))
            first.append((time.perf_counter(), ran))
            context["fit_seconds"].setdefault(sync, []).append(float(record["fit_seconds"]))
            metrics = record.get("metrics_seconds")
            if metrics is not None:
                parts["fit: end-of-iteration metrics"] = float(metrics)

    parts: dict[str, float] = {}
    start = time.perf_counter()
    train = dvml.training_preprocessor(
        context["train"], y="label", x="pixels", normalizing_const=16.0, name=TRAIN,
        overwrite=True, client=client,
    )  # fmt: skip
    parts["preprocess training"] = time.perf_counter() - start
    valid = dvml.validation_preprocessor(
        context["valid"], y="label", x="pixels", training=train, name=VALID, overwrite=True,
        client=client,
    )  # fmt: skip
    fit_start = time.perf_counter()
    parts["preprocess validation"] = fit_start - start - parts["preprocess training"]
    dvml.fit(
        train, MODEL, context["arch_id"], COMPILE_PARAMS,
        f"batch_size={BATCH}, epochs={context['epochs']}", num_iterations=1, resume=False,
        overwrite=True, on_iteration=on_iteration, progress=False, registry=registry,
        client=client, sync=sync,
    )  # fmt: skip
    evaluate_start = time.perf_counter()
    parts["fit (wall)"] = evaluate_start - fit_start
    result = dvml.evaluate(MODEL, valid, batch_size=BATCH, registry=registry, client=client)
    elapsed = time.perf_counter() - start
    parts["evaluate"] = elapsed - (evaluate_start - start)
    for name in (TRAIN, VALID):  # outside the clock
        t.drop_dataset(context["cluster"], name)
    # Outside the clock too: whether the trainers were warm standbys, and how long they took
    # to exit after their last line (both part of "fit: after the iteration").
    startups = registry.get_model(MODEL)["summary"].get("trainer_startup") or {}
    exits = [s["exit_seconds"] for s in startups.values() if s and "exit_seconds" in s]
    if exits:
        parts["fit: trainer exit"] = max(exits)
    if startups:
        parts["fit: trainers from a standby"] = sum(
            bool(s and s.get("standby")) for s in startups.values()
        )
    if first:
        ended, ran = first[0]
        context["trainer_start"].setdefault(sync, []).append(ended - fit_start - ran)
        parts["fit: trainer start"] = ended - fit_start - ran
        parts["fit: training"] = context["fit_seconds"][sync][-1]
        parts["fit: after the iteration"] = parts["fit (wall)"] - (ended - fit_start)
    context["dvml_parts"].setdefault(sync, []).append(parts)
    context["dvml_times"].setdefault(sync, []).append(elapsed)
    context["dvml_accuracy"][sync] = result["metric"]
    return elapsed


def plain_side(context: dict[str, Any], sync: str) -> float:
    reply = _ask(context, {"run": True})
    context["plain_times"].setdefault(sync, []).append(reply["seconds"])
    context["plain_accuracy"][sync] = reply["accuracy"]
    context["plain_parts"].setdefault(sync, []).append(reply.get("parts", {}))
    return float(reply["seconds"])


def details(context: dict[str, Any], sync: str) -> dict[str, Any]:
    found: dict[str, Any] = {k: round(v, 2) for k, v in context["startup"].items()}
    found["sync"] = sync
    starts = context["trainer_start"].get(sync, [])
    if starts:
        found["trainer start s (median)"] = round(statistics.median(starts), 2)
        steady = [
            (d - s) / p
            for d, s, p in zip(
                context["dvml_times"][sync], starts, context["plain_times"][sync], strict=False,
            )
        ]  # fmt: skip
        found["ratio without trainer start"] = round(statistics.median(steady), 2)
    if context["fit_seconds"].get(sync):
        found["fit s, training only (median)"] = round(
            statistics.median(context["fit_seconds"][sync]), 2
        )
    for side in ("dvml", "plain"):
        if sync in context[f"{side}_accuracy"]:
            found[f"{side} val accuracy"] = round(context[f"{side}_accuracy"][sync], 3)
    for side in ("dvml", "plain"):  # where each side's seconds went (medians over repeats)
        runs = context[f"{side}_parts"].get(sync, [])
        for name in runs[0] if runs else ():
            values = [run[name] for run in runs if name in run]
            found[f"{side} {name} s"] = round(statistics.median(values), 2)
    return found


# -- the plain runner process ----------------------------------------------------------------


def plain_runner(copies: int, epochs: int) -> int:
    """Serve ``{"model_json"}`` and ``{"run"}`` requests, one JSON line each."""
    import numpy as np
    import tf_keras as keras

    from dvml.examples import digits_cnn_json

    model_json = digits_cnn_json()
    train, valid = digits_frames(copies)
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if "model_json" in message:
                reply: dict[str, Any] = {"model_json": model_json}
            elif "train_only" in message:  # B10: model.fit alone, on data prepared beforehand
                reply = _train_only(keras, model_json, train, epochs)
            else:
                start = time.perf_counter()
                classes = np.unique(train["label"].to_numpy())  # sorted, as dvml's class_values
                data = []
                for frame in (train, valid):
                    x = np.stack(frame["pixels"].to_list()).astype(np.float32) / 16.0
                    y = (frame["label"].to_numpy()[:, None] == classes).astype(np.float32)
                    data.append((x, y))
                parts = {"preprocess": time.perf_counter() - start}
                model = keras.models.model_from_json(model_json)
                model.compile(
                    loss="categorical_crossentropy",
                    optimizer=keras.optimizers.Adam(learning_rate=0.003),
                    metrics=["accuracy"],
                )
                (x, y), (vx, vy) = data
                fit_start = time.perf_counter()
                model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=True, verbose=0)
                evaluate_start = time.perf_counter()
                parts["fit"] = evaluate_start - fit_start
                _, accuracy = model.evaluate(vx, vy, batch_size=BATCH, verbose=0)
                seconds = time.perf_counter() - start
                parts["evaluate"] = seconds - (evaluate_start - start)
                reply = {"seconds": seconds, "accuracy": float(accuracy), "parts": parts}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(PROTOCOL + json.dumps(reply), flush=True)
    return 0


def _train_only(keras: Any, model_json: str, train: Any, epochs: int) -> dict[str, Any]:
    """Seconds of ``model.fit`` alone (data already in memory) and the samples it trained on."""
    import numpy as np

    x = np.stack(train["pixels"].to_list()).astype(np.float32) / 16.0
    classes = np.unique(train["label"].to_numpy())
    y = (train["label"].to_numpy()[:, None] == classes).astype(np.float32)
    model = keras.models.model_from_json(model_json)
    model.compile(
        loss="categorical_crossentropy",
        optimizer=keras.optimizers.Adam(learning_rate=0.003),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=True, verbose=0)
    return {"seconds": time.perf_counter() - start, "samples": len(x) * epochs}


def _register(key: str, sync: str, target: float) -> Benchmark:
    return register(
        Benchmark(
            key=key,
            title=f"digits preprocess + 2-worker fit (sync={sync!r}) + evaluate vs plain tf.keras",
            unit="s",
            dvml=functools.partial(dvml_side, sync=sync),
            baseline=functools.partial(plain_side, sync=sync),
            target=target,
            target_op="<=",
            prepare=prepare,
            cleanup=cleanup,
            details=functools.partial(details, sync=sync),
        )
    )


B4A = _register("B4a", "iteration", 1.0)
B4B = _register("B4b", "step", 3.0)

if __name__ == "__main__":
    if sys.argv[1:2] == ["plain"]:
        sys.exit(plain_runner(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(f"usage: python -m benchmarks.b4_end_to_end plain COPIES EPOCHS. Got {sys.argv[1:]}")
