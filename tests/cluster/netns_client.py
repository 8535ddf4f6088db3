"""A dvml client run INSIDE the head namespace of a namespace cluster (``ip netns exec``).

``python netns_client.py COMMAND SCHEDULER [ARGS_JSON]`` prints one line
``DVML-RESULT <json>`` that tests/cluster/test_netns.py asserts on. Kept as a script (not a
test module) because the client must live in another network namespace than pytest.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import dvml


def on_worker_identity() -> dict[str, Any]:
    """On a worker: its environment, its vineyardd and what that vineyardd advertises."""
    import socket as pysocket

    from dvml.cluster.connection import local_client

    client = local_client()
    iid = int(client.instance_id)
    meta = {int(k): v for k, v in client.meta.items()}
    mine = meta.get(iid, {})
    return {
        "socket": os.environ.get("VINEYARD_IPC_SOCKET"),
        "dvml_host": os.environ.get("DVML_HOST"),
        "instance_id": iid,
        "advertised": str(mine.get("hostname", "")),
        "instances": sorted(meta),
        "hostname": pysocket.gethostname(),
    }


def on_worker_local_tensors() -> dict[str, Any]:
    """On a worker: ids of the tensors its own vineyardd holds, and its memory in use."""
    from dvml.cluster.connection import local_client

    client = local_client()
    iid = int(client.instance_id)
    metas = client.ipc_client.list_metadatas("vineyard::Tensor*", limit=1_000_000)
    return {
        "instance_id": iid,
        "tensors": sorted(int(m.id) for m in metas if int(m.instance_id) == iid),
        "memory_usage": int(client.status.memory_usage),
    }


def workers(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    table = cluster.worker_table()
    identity = cluster.client.run(on_worker_identity)
    return {
        "table": json.loads(table.to_json(orient="records")),
        "gpu_configuration": json.loads(cluster.gpu_configuration().to_json(orient="records")),
        "identity": identity,
    }


def _digits() -> tuple[Any, Any]:
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    d = load_digits()
    frame = pd.DataFrame(
        {
            "id": np.arange(len(d.target)),
            "pixels": list(d.images.reshape(-1, 8, 8, 1).astype("float32")),
            "label": d.target,
        }
    )
    shuffled = frame.sample(frac=1.0, random_state=0).reset_index(drop=True)
    return shuffled.iloc[:1500], shuffled.iloc[1500:]


def placement(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Pack under three rules; report each dataset's placement and what each vineyardd holds."""
    import pandas as pd

    train, _ = _digits()
    hosts = sorted({w.host for w in cluster.workers})
    rules: dict[str, Any] = {
        "all": "all_workers",
        "one_host": [hosts[1]],
        "table": pd.DataFrame({"host": hosts}),
    }
    out: dict[str, Any] = {"hosts": hosts, "datasets": {}}
    for label, rule in rules.items():
        ds = dvml.training_preprocessor(
            train, y="label", x="pixels", normalizing_const=16.0, distribution_rules=rule,
            name=f"nn_{label}", overwrite=True,
        )  # fmt: skip
        table = ds.placement()
        out["datasets"][label] = json.loads(table.to_json(orient="records"))
    out["vineyard"] = cluster.client.run(on_worker_local_tensors)
    for label in rules:
        dvml.datasets.drop(f"nn_{label}")
    out["vineyard_after_drop"] = cluster.client.run(on_worker_local_tensors)
    return out


def pipeline(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Preprocess, fit across the hosts, evaluate, predict, drop; all from this namespace."""
    train, test = _digits()
    out: dict[str, Any] = {}
    before = cluster.client.run(on_worker_local_tensors)
    dvml.training_preprocessor(
        train, y="label", x="pixels", normalizing_const=16.0, name="nn_digits", overwrite=True
    )
    dvml.validation_preprocessor(
        test, y="label", x="pixels", training="nn_digits", name="nn_digits_val", overwrite=True
    )
    out["memory_loaded"] = cluster.client.run(on_worker_local_tensors)
    arch = dvml.load_keras_model(args["model_json"], name="cnn")
    model = dvml.fit(
        "nn_digits", "nn_cnn", arch,
        compile_params="loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.003)', "
        "metrics=['accuracy']",
        fit_params="batch_size=32, epochs=2", num_iterations=args.get("iterations", 2),
        validation_set="nn_digits_val", progress=False,
    )  # fmt: skip
    summary = model.summary
    out["fit"] = {
        "trainers": summary["trainers"],
        "trainer_partitions": summary["trainer_partitions"],
        "weights_identical": summary["weights_identical_on_all_trainers"],
        "validation_metric": summary.get("validation_metrics_final"),
        "training_metric": summary.get("training_metrics_final"),
    }
    out["evaluate"] = dvml.evaluate("nn_cnn", "nn_digits_val")
    pred = dvml.predict("nn_cnn", test.iloc[:200], "id", "pixels", pred_type="response").compute()
    labels = test.iloc[:200].set_index("id")["label"]
    hits = sum(int(r.class_value) == int(labels[r.id]) for r in pred.itertuples())
    out["predict"] = {"rows": len(pred), "accuracy": hits / len(pred)}
    # Evaluate and predict ran on the workers: this client never loaded TensorFlow.
    out["client_loaded_tensorflow"] = "tensorflow" in sys.modules
    out["features"] = feature_cache(cluster)
    dvml.datasets.drop("nn_digits")
    dvml.datasets.drop("nn_digits_val")
    out["memory_before"] = before
    out["memory_after_drop"] = cluster.client.run(on_worker_local_tensors)
    return out


def _run_loop_fn(context: Any) -> dict[str, Any]:
    """A custom loop (model.fit on the strategy's local rows) that saves its model."""
    import tf_keras as keras

    # Seeded, and a learning rate that learns the digits in 3 short epochs: the test checks
    # the saved model is the trained one (accuracy > 0.5), which an unlucky start at Adam's
    # default rate missed once (0.37).
    keras.utils.set_random_seed(7)
    with context.strategy.scope():
        model = keras.models.model_from_json(context.config["model_json"])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="categorical_crossentropy",
                      metrics=["accuracy"])  # fmt: skip
    for _ in range(3):
        history = model.fit(context.dataset_creator("train"), epochs=1,
                            steps_per_epoch=context.steps_per_epoch, verbose=0)  # fmt: skip
        context.report({"loss": history.history["loss"][-1], "rank": context.rank},
                       checkpoint=model)  # fmt: skip
    context.save_model(model, "nr_cnn")
    return {"host": context.host, "world": context.world_size}


def run_loop(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """dvml.run across the hosts: one trainer per host, its own rows; the saved model evaluated."""
    train, test = _digits()
    dvml.training_preprocessor(
        train, y="label", x="pixels", normalizing_const=16.0, name="nr_digits", overwrite=True
    )
    dvml.validation_preprocessor(
        test, y="label", x="pixels", training="nr_digits", name="nr_digits_val", overwrite=True
    )
    result = dvml.run(_run_loop_fn, {"train": "nr_digits"}, batch_size=64, progress=False,
                      config={"model_json": args["model_json"]})  # fmt: skip
    out = {
        "value": result.value,
        "loss": result.history["loss"].tolist(),
        "workers": result.workers,
        "reports": [{"worker": r["worker"], "step": r["step"]} for r in result.reports],
        "evaluate": dvml.evaluate("nr_cnn", "nr_digits_val"),
    }
    dvml.datasets.drop("nr_digits")
    dvml.datasets.drop("nr_digits_val")
    return out


def feature_cache(cluster: Any) -> dict[str, Any]:
    """A backbone runs where the digits live; asking again is a hit (no batch runs)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as k

    k.utils.set_random_seed(1)
    backbone = k.Sequential(
        [k.Input((8, 8, 1)), k.layers.Conv2D(4, 3, activation="relu", name="conv1")]
    )
    batches = dvml.features.calls(cluster.client)["batches"]
    cache = dvml.features.cache("nn_digits", backbone, pooling="avg", name="nn_features")
    built = dvml.features.calls(cluster.client)["batches"]
    again = dvml.features.cache("nn_digits", backbone, pooling="avg", name="nn_features")
    hit = dvml.features.calls(cluster.client)["batches"]
    placement = json.loads(cache.placement().to_json(orient="records"))
    dvml.datasets.drop("nn_features")
    return {
        "rows": cache.rows,
        "same_object": again.id == cache.id,
        "batches_built": built - batches,
        "batches_hit": hit - built,
        "hosts": sorted({b["host"] for b in placement}),
    }


def prepare(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Pack the digits and register the model (for the fault tests' fits)."""
    train, _ = _digits()
    ds = dvml.training_preprocessor(
        train, y="label", x="pixels", normalizing_const=16.0, name=args["name"], overwrite=True
    )
    arch = dvml.load_keras_model(args["model_json"], name="cnn")
    return {"arch": arch, "hosts": sorted({b["host"] for b in ds.layout["buffers"]})}


def long_fit(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A fit that prints one line per iteration; reports how it ended and when."""
    import time

    try:
        model = dvml.fit(
            args["name"], "nf_cnn", args["arch"],
            compile_params="loss='categorical_crossentropy', optimizer='adam', "
            "metrics=['accuracy']",
            fit_params="batch_size=32, epochs=1", num_iterations=args["iterations"],
            timeout=args.get("timeout", 600),
        )  # fmt: skip
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "ended": time.time()}
    summary = model.summary
    return {
        "error": None,
        "resumed_from_iteration": summary["resumed_from_iteration"],
        "ended": time.time(),
    }


def long_fit_multiple(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A fit_multiple (two models hopping) that prints one line per iteration; reports how
    it ended and when."""
    import time

    import pandas as pd

    rows = [
        {"mst_key": k, "model_id": args["arch"], "fit_params": "batch_size=32, epochs=1",
         "compile_params": "loss='categorical_crossentropy', "
                           f"optimizer='Adam(learning_rate={0.001 * k})'"}
        for k in (1, 2)
    ]  # fmt: skip
    try:
        dvml.fit_multiple(
            args["name"], "nf_mop", pd.DataFrame(rows), num_iterations=args["iterations"],
            timeout=args.get("timeout", 600),
        )  # fmt: skip
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "ended": time.time()}
    return {"error": None, "ended": time.time()}


def _slow_block(block: Any) -> Any:
    import time

    time.sleep(0.5)  # a source slow enough that a host can die while it is packed
    return block


def slow_pack(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Pack a slow Dask-array source on every worker; report how it ended and when."""
    import time

    import dask.array as da
    import numpy as np

    rows, chunk = 80 * 500, 500
    x = da.random.random((rows, 16), chunks=(chunk, 16)).astype(np.float32)
    x = x.map_blocks(_slow_block, dtype=np.float32)
    y = da.from_array(np.arange(rows) % 3, chunks=chunk)
    print("packing started", flush=True)
    try:
        dvml.training_preprocessor(
            {"x": x, "y": y}, y="y", x="x", name=args["name"], overwrite=True
        )
    except Exception as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "ended": time.time(),
            "datasets": sorted(dvml.datasets.list()["name"]),
        }
    return {"error": None, "ended": time.time(), "datasets": sorted(dvml.datasets.list()["name"])}


def gated_fit(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Pack the digits and fit on them; after the first iteration, print a line and wait (the
    trainers alive, the lease held) until the file ``args["gate"]`` exists."""
    import pathlib
    import time

    prepared = prepare(cluster, args)

    def wait_at_first(record: Any) -> None:
        # It runs on this client's event loop: its heartbeats pause while it waits (the
        # seconds another client takes to try a drop, far under train.client-timeout), the
        # scheduler it talks to runs elsewhere (the head namespace) and keeps answering.
        if record["iteration"] == 1:
            print("FIRST-ITERATION", flush=True)
            gate = pathlib.Path(args["gate"])
            deadline = time.monotonic() + 300
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.1)

    try:
        model = dvml.fit(
            args["name"], "lease_cnn", prepared["arch"],
            compile_params="loss='categorical_crossentropy', optimizer='adam', "
            "metrics=['accuracy']",
            fit_params="batch_size=64, epochs=1", num_iterations=2, on_iteration=wait_at_first,
        )  # fmt: skip
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None, "model": model.name, "hosts": prepared["hosts"]}


def drop(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Try to drop dataset ``args["name"]``; report how it ended."""
    try:
        dvml.datasets.drop(args["name"], force=args.get("force", False))
    except Exception as exc:
        error: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    else:
        error = {"error": None}
    return {**error, "exists": dvml.datasets.exists(args["name"])}


def elastic_prepare(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Pack ``args["rows"]`` digits with all_workers in buffers of ``args["buffer_size"]`` and
    register the model (the elastic tests' fits); the rows each host holds."""
    train, _ = _digits()
    ds = dvml.training_preprocessor(
        train.iloc[: args["rows"]], y="label", x="pixels", normalizing_const=16.0,
        buffer_size=args["buffer_size"], distribution_rules="all_workers", name=args["name"],
        overwrite=True,
    )  # fmt: skip
    arch = dvml.load_keras_model(args["model_json"], name="dense")
    nbytes = sum(int(f["nbytes"]) for b in ds.layout["buffers"] for f in b["fields"].values())
    return {"arch": arch, "rows": ds.rows, "rows_by_host": _rows_by_host(args["name"]),
            "bytes_per_row": nbytes / ds.rows,
            "trainers": _trainers(cluster, ds)}  # fmt: skip


def _trainers(cluster: Any, ds: Any) -> list[str]:
    """The workers a fit of ``ds`` trains on now: one per vineyard instance holding rows."""
    from dvml.store.datasets import buffer_workers

    return sorted({w.name for w in buffer_workers(cluster.client, ds)})


def _rows_by_host(name: str) -> dict[str, int]:
    rows: dict[str, int] = {}
    for b in dvml.datasets.describe(name).layout["buffers"]:
        rows[b["host"]] = rows.get(b["host"], 0) + int(b["rows"])
    return rows


def elastic_fit(cluster: Any, args: dict[str, Any]) -> dict[str, Any]:
    """An elastic ``sync="iteration"`` fit that prints ``ITERATION <i>`` after each iteration;
    its summary's elastic fields, its per-iteration records and the rows each host holds after.
    """
    records: list[dict[str, Any]] = []

    def seen(record: dict[str, Any]) -> None:
        keep = ("iteration", "stragglers", "fit_seconds", "averaging_seconds", "elapsed_s")
        records.append({k: record.get(k) for k in keep})
        print(f"ITERATION {record['iteration']}", flush=True)

    import dask

    # balance=False: only joins and departures change the row map (a join test on a loaded
    # machine must not see a speed move as well)
    try:
        with dask.config.set({"dvml.train.elastic-balance": args.get("balance", True)}):
            model = dvml.fit(
                args["name"], args["model"], args["arch"],
                compile_params="loss='categorical_crossentropy', "
                "optimizer='Adam(learning_rate=0.003)'",
                fit_params=f"batch_size=32, epochs={args['epochs']}",
                num_iterations=args["iterations"], sync="iteration", elastic=True,
                on_iteration=seen, timeout=args.get("timeout", 600),
            )  # fmt: skip
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "records": records}
    keep = ("trainers", "departed", "departed_at_iterations", "departures", "rows_left_out",
            "rows_left_out_from_iteration", "repinned_rows", "joined", "joined_at_iterations",
            "rebalanced_at_iterations", "moved_rows", "moved_bytes", "row_map_changes",
            "rows_per_epoch", "trainer_partitions", "trainer_step_seconds", "straggler_worker",
            "straggler_ratio", "straggler_iterations")  # fmt: skip
    from dvml.cluster.workers import discover_workers

    summary = model.summary
    workers = discover_workers(cluster.client)  # now: a host added during the fit, too
    return {
        "error": None,
        "summary": {k: summary.get(k) for k in keep},
        "records": records,
        "rows_by_host": _rows_by_host(args["name"]),
        "host_of": {w.name: w.host for w in workers},
        "address_host": {w.address: w.host for w in workers},
    }


COMMANDS = {
    "gated_fit": gated_fit,
    "drop": drop,
    "slow_pack": slow_pack,
    "workers": workers,
    "placement": placement,
    "pipeline": pipeline,
    "prepare": prepare,
    "long_fit": long_fit,
    "long_fit_multiple": long_fit_multiple,
    "run_loop": run_loop,
    "elastic_prepare": elastic_prepare,
    "elastic_fit": elastic_fit,
}


def main() -> None:
    command, scheduler = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    if "state_dir" in args:  # the registry and the checkpoints of this client
        import dask.config

        dask.config.set({"dvml.cluster.state-dir": args["state_dir"]})
    cluster = dvml.connect(scheduler)
    try:
        result = COMMANDS[command](cluster, args)
    finally:
        cluster.close()
    print("DVML-RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
