"""The Ray peer of B19 and B20: run with the Ray environment's Python (``scripts/peer-ray``).

``python benchmarks/ray_peer.py MODE DIR``: reads ``DIR/data.npz`` (``x`` float32 digit images
0..16, ``y`` int labels), ``DIR/job.json`` (``model_json``, ``epochs``, ``batch``,
``workers``), trains on ``workers`` Ray Train workers of one CPU each with Ray Data feeding
them, and writes ``DIR/result-ray.json`` (seconds since this process started at each phase,
the training time and samples/s measured on the chief).

MODE ``loop`` (B19): a ``GradientTape`` step under ``MultiWorkerMirroredStrategy`` in
``train_loop_per_worker`` (the same loop as dvml's side, ``strategy.run`` per batch).
MODE ``fit`` (B20): the same loop, then the validation rows (``DIR/valid.npz``) evaluated on
the chief. Not Keras's ``model.fit``: on this machine ``model.fit`` under the strategy on
``to_tf`` datasets (per epoch, or repeated with ``steps_per_epoch``) did not finish within
5 minutes on 1,437 rows, where the loop takes seconds.

It imports nothing of dvml: the Ray environment does not have it. Ray's ingest is
``from_pandas`` (a frame with one image per row, as dvml's side gets it) + ``map_batches``
(stack and scale) + ``materialize``, Ray Data's documented path for in-memory data.
"""

from __future__ import annotations

import json
import os
import sys
import time

STARTED = float(os.environ.get("DVML_BENCH_SPAWNED") or time.time())  # the parent's spawn
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf_keras, as dvml's trainers (COMPAT.md)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")


def _since() -> float:
    return round(time.time() - STARTED, 4)


def _scale(batch: dict) -> dict:
    import numpy as np

    x = np.stack(batch["pixels"]).astype("float32") / 16.0
    return {"x": x, "y": batch["label"].astype("int64")}


def _train_loop(config: dict) -> None:
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    from ray import train

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ctx = train.get_context()
    batch, workers = int(config["batch"]), int(config["workers"])
    with strategy.scope():
        model = keras.models.model_from_json(config["model_json"])
        optimizer = keras.optimizers.Adam(learning_rate=0.003)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=keras.losses.Reduction.NONE)
    shard = train.get_dataset_shard("train")
    global_batch = batch * workers
    began = time.time()
    epoch_seconds: list[float] = []
    losses: list[float] = []

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_row = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(int(config["epochs"])):
        start, total, n = time.time(), 0.0, 0
        for x, y in shard.to_tf("x", "y", batch_size=batch, drop_last=True):
            per_replica = strategy.run(step, args=(x, y))
            total += float(strategy.reduce("SUM", per_replica, axis=None))
            n += 1
        epoch_seconds.append(time.time() - start)
        losses.append(total / max(n, 1))
    trained = time.time() - began
    if ctx.get_world_rank() == 0:
        rows = int(config["rows"]) // global_batch * global_batch
        result = {
            "training_s": trained,
            "epoch_s": epoch_seconds,
            "losses": losses,
            "rows_per_epoch": rows,
            "weights_sum": float(sum(float(np.sum(w)) for w in model.get_weights())),
        }
        if config["mode"] == "fit":
            valid = np.load(os.path.join(config["dir"], "valid.npz"))
            # the chief alone, a plain forward pass: model.evaluate and predict go through the
            # strategy and would wait for the other worker
            x = valid["x"].astype("float32") / 16.0
            probabilities = np.concatenate([
                model(x[i : i + batch], training=False).numpy() for i in range(0, len(x), batch)
            ])  # fmt: skip
            accuracy = float(np.mean(np.argmax(probabilities, axis=1) == valid["y"]))
            result.update(valid_accuracy=accuracy)
        with open(os.path.join(config["dir"], "trainer-ray.json"), "w") as f:
            json.dump(result, f)


def main(mode: str, directory: str) -> int:
    import numpy as np
    import pandas as pd
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    with open(os.path.join(directory, "job.json")) as f:
        job = json.load(f)
    workers = int(job["workers"])
    phases: dict[str, float] = {"imports": _since()}
    # one logical CPU per train worker plus one for Ray Data's tasks (the machine has 2 cores)
    ray.init(num_cpus=workers + 1, include_dashboard=False, log_to_driver=False)
    phases["ray.init"] = _since()
    data = np.load(os.path.join(directory, "data.npz"))
    frame = pd.DataFrame({"pixels": list(data["x"]), "label": data["y"]})
    dataset = ray.data.from_pandas(frame).map_batches(_scale, batch_format="numpy").materialize()
    phases["ingest"] = _since()
    trainer = TensorflowTrainer(
        _train_loop,
        train_loop_config={**job, "mode": mode, "dir": directory, "rows": len(frame)},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        datasets={"train": dataset},
        run_config=RunConfig(storage_path=os.path.join(directory, "ray-results"), name="peer"),
    )
    trainer.fit()
    phases["model"] = _since()  # trained ("loop") or trained and evaluated ("fit")
    with open(os.path.join(directory, "trainer-ray.json")) as f:
        result = json.load(f)
    ray.shutdown()
    phases["ray.shutdown"] = _since()
    result["phases"] = phases
    result["ingest_s"] = phases["ingest"] - phases["ray.init"]
    with open(os.path.join(directory, "result-ray.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
