"""dvml's main job on an embedded default: digits → vineyard → 2 trainers → evaluate → predict.

Everything ships with the packages: a LocalCluster started for the occasion and
scikit-learn's digits (8x8 images). ``dvml demo`` runs it and prints what it did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dvml
from dvml import config
from dvml.examples import COMPILE_PARAMS, digits_cnn_json, digits_frame
from dvml.train.sync import choose_sync

__all__ = ["digits_cnn_json", "digits_frame", "run_demo"]


def run_demo(
    n_workers: int = 2,
    num_iterations: int = 3,
    epochs: int = 2,
    registry: str | None = None,
    plot: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the whole flow on a fresh LocalCluster; return what it measured."""
    started = time.monotonic()
    frame = digits_frame()
    split = int(len(frame) * 0.8)
    train, test = frame.iloc[:split], frame.iloc[split:]
    say(
        f"dvml {dvml.__version__} demo: scikit-learn digits, {len(train)} training and "
        f"{len(test)} validation images of 8x8 pixels, 10 classes."
    )
    with dvml.LocalCluster(n_workers=n_workers) as cluster:
        say(
            f"Started a LocalCluster: etcd, {n_workers} vineyardd and {n_workers} Dask workers "
            f"(scheduler {cluster.scheduler_address}, dashboard {cluster.dashboard_link})."
        )
        say(
            cluster.worker_table()[["name", "host", "vineyard_instance_id", "address"]].to_string(
                index=False
            )
        )
        ds, val = _pack(train, test, say)
        model = _train(cluster, ds, val, num_iterations, epochs, registry, say)
        result = _evaluate_and_predict(val, test, registry, say)
        if plot:
            import matplotlib

            matplotlib.use("Agg")
            model.plot().figure.savefig(plot, dpi=100, bbox_inches="tight")
            say(f"Training curves written to {plot}.")
        summary = model.summary
        for name in ("demo_digits", "demo_digits_val"):
            dvml.datasets.drop(name)
    elapsed = time.monotonic() - started
    say(
        f"\nDone in {elapsed:.0f}s: model 'demo_digits_cnn' is in the registry "
        f"(dvml.describe_model('demo_digits_cnn')); the cluster was stopped and cleaned up."
    )
    return {
        "validation_accuracy": result["metric"],
        "validation_loss": result["loss"],
        "weights_identical": summary["weights_identical_on_all_trainers"],
        "trainers": summary["trainers"],
        "sync": summary["sync"],
        "elapsed_s": elapsed,
    }


def _pack(train: Any, test: Any, say: Callable[[str], None]) -> tuple[Any, Any]:
    """The training set on every worker, the validation set beside it; say where they are."""
    ds = dvml.training_preprocessor(
        train,
        y="label",
        x="pixels",
        normalizing_const=16.0,
        name="demo_digits",
        distribution_rules="all_workers",
        overwrite=True,
    )
    val = dvml.validation_preprocessor(
        test, y="label", x="pixels", training=ds, name="demo_digits_val", overwrite=True
    )
    say("\nPacked into vineyard (rows per worker, each buffer in its worker's vineyardd):")
    say(
        ds.distribution()[["worker_name", "host", "buffers", "rows", "nbytes"]].to_string(
            index=False
        )
    )
    return ds, val


def _train(
    cluster: Any,
    ds: Any,
    val: Any,
    num_iterations: int,
    epochs: int,
    registry: str | None,
    say: Callable[[str], None],
) -> Any:
    """Register the CNN and fit it with one trainer per worker, in the fastest correct mode."""
    arch_id = dvml.load_keras_model(digits_cnn_json(), name="digits-cnn", registry=registry)
    # The fastest correct mode for this machine: fit's automatic default (or the config's).
    use_gpus = bool(cluster.workers) and all(w.gpus for w in cluster.workers)
    sync, why = choose_sync(config.get("train.sync"), use_gpus, [w.gpus for w in cluster.workers])
    say(
        f"\nRegistered the CNN as architecture {arch_id}; training with one trainer per "
        f"worker, sync={sync!r} because {why}..."
    )
    return dvml.fit(
        ds,
        "demo_digits_cnn",
        arch_id,
        COMPILE_PARAMS,
        f"batch_size=32, epochs={epochs}",
        num_iterations=num_iterations,
        validation_set=val,
        metrics_compute_frequency=1,
        use_gpus=use_gpus,
        sync=sync,
        overwrite=True,  # the demo trains its model again on every run
        registry=registry,
    )


def _evaluate_and_predict(
    val: Any, test: Any, registry: str | None, say: Callable[[str], None]
) -> dict[str, Any]:
    """Evaluate the model on the workers and predict 5 raw images; the evaluation."""
    result: dict[str, Any] = dvml.evaluate("demo_digits_cnn", val, registry=registry)
    say(
        f"\nEvaluated on the workers: loss={result['loss']:.4f} "
        f"accuracy={result['metric']:.4f} on {result['rows']} validation images."
    )
    predictions = dvml.predict(
        "demo_digits_cnn", test.head(5), "id", "pixels", registry=registry
    ).compute()
    say("Predictions for 5 raw images (normalized on the workers):")
    merged = predictions.merge(test[["id", "label"]], on="id")
    say(merged[["id", "class_value", "prob", "label"]].to_string(index=False))
    return result
