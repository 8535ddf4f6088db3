"""Refresh the transfer-learning feature cache for the newest images; optionally train a head.

``python -m workflows.feature_refresh --config workflows/configs/feature-refresh.yaml``

Steps, one log line each: take the lock; attach to (or start) the cluster; clean up after a
killed run; find the newest images (``images.source``: an image folder or tar shards, the
newest match of a glob); compute their features with the backbone into the cache
``<name>-features`` (:func:`dvml.features.cache`: the backbone runs on the workers that hold
the images, and the same images + backbone + layer + pooling is a cache hit that runs
nothing); the same for ``images.validation_source`` into ``<name>-features-val``; then, when
the ``head`` section is given, train the model ``<name>-head`` on the features (warm-started
from itself when it exists) and evaluate it on the validation features.

Caches are published atomically under deterministic names and replaced only once complete, and
the head is saved in one transaction, so a killed run leaves the previous caches and head or
the new ones, and the next run completes the job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workflows._runtime import EXIT_OK, RunContext, digest, recover, run_workflow

__all__ = ["cache_names", "head_name", "main"]

DESCRIPTION = (
    "Refresh the transfer-learning feature cache for the newest images (the backbone runs "
    "where the images live) and optionally fine-tune a head on the features."
)


def cache_names(name: str) -> tuple[str, str]:
    """The training and validation feature caches of job ``name``."""
    return f"{name}-features", f"{name}-features-val"


def head_name(name: str) -> str:
    return f"{name}-head"


def _backbone(spec: Any) -> Any:
    """An architecture id given as text (``"12"``) is an id; the rest goes to dvml as it is."""
    if isinstance(spec, str) and spec.strip().isdigit():
        return int(spec)
    return spec


def _sources(ctx: RunContext) -> tuple[Any, Any | None]:
    from dvml.exceptions import DataError
    from dvml.jobs.data import resolve_source

    images = ctx.job["images"]
    found = [resolve_source(images["source"], ctx.base_dir, "images.source")]
    if images["validation_source"]:
        found.append(
            resolve_source(images["validation_source"], ctx.base_dir, "images.validation_source")
        )
    for source, key in zip(found, ("images.source", "images.validation_source"), strict=False):
        if source.kind not in ("images", "shards"):
            raise DataError(
                f"The feature cache needs images: an image folder or tar shards. Received: "
                f"{key}={source.spec!r}, which is {source.describe()}."
            )
    return found[0], (found[1] if len(found) > 1 else None)


def _key(ctx: RunContext, train: Any, valid: Any | None) -> str:
    job = ctx.job
    return digest(
        train.fingerprint, valid and valid.fingerprint, job["images"], job["backbone"], job["head"]
    )


def plan(ctx: RunContext) -> list[str]:
    """The steps a run would take now, read-only."""
    from dvml.jobs.job_cluster import cluster_plan

    job = ctx.job
    name = job["name"]
    train, valid = _sources(ctx)
    last = ctx.read_state().get("last_success") or {}
    fresh = last.get("key") == _key(ctx, train, valid)
    bb = job["backbone"]
    features, features_val = cache_names(name)
    lines = [
        ctx.lock_line(),
        f"cluster: {cluster_plan(job['cluster'], ctx.args.scheduler)}",
        f"images: {train.describe()}",
        "skip: the last successful run already handled these images (use --force)"
        if fresh and not ctx.args.force
        else "images are new (or --force): refresh",
        f"features of backbone {bb['model']!r} (layer {bb['layer'] or 'output'}, pooling "
        f"{bb['pooling']}) into {features}; unchanged images and backbone are a cache hit",
    ]
    if valid is not None:
        lines.append(f"validation images: {valid.describe()} -> {features_val}")
    head = job["head"]
    if head is not None:
        lines.append(
            f"train head {head_name(name)!r} from architecture {head['architecture']!r} "
            f"for {head['num_iterations']} iteration(s) on {features}"
        )
    lines.append(f"registry {job['registry'] or '(dvml config default)'}; state {ctx.state_path}")
    return lines


def run(ctx: RunContext) -> int:
    from dvml.jobs.job_cluster import open_cluster
    from dvml.registry import Registry

    job, log = ctx.job, ctx.log
    with open_cluster(job["cluster"], ctx.args.scheduler) as cluster:
        client = cluster.client
        log.info("connected to %s (%d workers)", cluster.scheduler_address, len(cluster.workers))
        previous = ctx.read_journal()
        recover(ctx, client)
        if previous is not None:
            _drop_hidden_sources(ctx, client)
        train, valid = _sources(ctx)
        log.info("newest images: %s", train.describe())
        key = _key(ctx, train, valid)
        last = ctx.read_state().get("last_success") or {}
        if last.get("key") == key and not ctx.args.force:
            log.info(
                "nothing new: run %s already refreshed these images at %s; --force recomputes",
                last.get("run_id"),
                last.get("finished"),
            )
            ctx.clear_journal()
            return EXIT_OK
        registry = Registry(job["registry"])
        try:
            outcome = _refresh(ctx, client, registry, train, valid)
        finally:
            registry.close()
        state = ctx.read_state()
        state["last_success"] = {
            "run_id": ctx.run_id,
            "key": key,
            "source": train.location,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **outcome,
        }
        ctx.write_state(state)
        ctx.clear_journal()
    log.info("done in %.1fs", ctx.elapsed())
    return EXIT_OK


def _drop_hidden_sources(ctx: RunContext, client: Any) -> None:
    """Drop the packed images a killed cache call left (it drops them itself when it ends)."""
    from dvml.preprocess.api import INTERNAL_PREFIX
    from dvml.store import datasets

    for cache in cache_names(ctx.job["name"]):
        hidden = f"{INTERNAL_PREFIX}features-source/{cache}"
        if datasets.exists(hidden, client):
            datasets.drop(hidden, client)
            ctx.log.info("dropped %s, left by the killed run", hidden)


def _cache(
    ctx: RunContext, client: Any, registry: Any, source: Any, name: str, training: str | None
) -> Any:
    from dvml.features import cache, calls

    images, bb = ctx.job["images"], ctx.job["backbone"]
    before = calls(client)["batches"]
    started = time.monotonic()
    kwargs: dict[str, Any] = {
        "image_size": tuple(images["image_size"]),
        "channels": images["channels"],
        "normalizing_const": images["normalizing_const"],
        "seed": images["seed"],
    }
    if images["buffer_size"] is not None:
        kwargs["buffer_size"] = images["buffer_size"]
    ds = cache(
        source.location,
        _backbone(bb["model"]),
        layer=bb["layer"],
        pooling=bb["pooling"],
        batch_size=bb["batch_size"],
        distribution_rules=images["distribution_rules"] if training is None else None,
        use_gpus=bb["use_gpus"],
        name=name,
        overwrite=bool(ctx.args.force),
        registry=registry,
        client=client,
        training=training,
        **kwargs,
    )
    batches = calls(client)["batches"] - before
    ctx.log.info(
        "features %s: %d rows of shape %s, %s in %.1fs",
        ds.name,
        ds.rows,
        ds.summary["x_shapes"][0],
        f"{batches} backbone batches" if batches else "cache hit",
        time.monotonic() - started,
    )
    return ds


def _refresh(
    ctx: RunContext, client: Any, registry: Any, train: Any, valid: Any | None
) -> dict[str, Any]:
    name = ctx.job["name"]
    features, features_val = cache_names(name)
    ctx.journal("features")
    ds = _cache(ctx, client, registry, train, features, None)
    outcome: dict[str, Any] = {"features": ds.name, "rows": ds.rows}
    if valid is not None:
        ctx.journal("validation features")
        _cache(ctx, client, registry, valid, features_val, features)
        outcome["validation_features"] = features_val
    if ctx.job["head"] is not None:
        outcome.update(_train_head(ctx, client, registry, valid is not None))
    return outcome


def _train_head(ctx: RunContext, client: Any, registry: Any, validate: bool) -> dict[str, Any]:
    from dvml.jobs.models import architecture_id, fit_arguments, model_exists
    from dvml.train.fit import fit
    from dvml.train.predict import evaluate

    name, head = ctx.job["name"], ctx.job["head"]
    model = head_name(name)
    features, features_val = cache_names(name)
    arch_id = architecture_id(head["architecture"], registry, ctx.base_dir, "head.architecture")
    warm = bool(head["warm_start"]) and model_exists(registry, model)
    ctx.journal("training", model=model)
    ctx.log.info(
        "training head %s (architecture %d) on %s from %s: %d iteration(s)",
        model,
        arch_id,
        features,
        "itself (warm start)" if warm else "scratch",
        head["num_iterations"],
    )
    started = time.monotonic()
    fit(
        features,
        model,
        arch_id,
        **fit_arguments(head),
        validation_set=features_val if validate else None,
        warm_start=warm,
        overwrite=True,  # the job retrains its model on every run
        name=name,
        description=ctx.job["description"],
        progress=False,
        registry=registry,
        client=client,
    )
    ctx.log.info("trained head %s in %.1fs", model, time.monotonic() - started)
    if not validate:
        return {"head": model}
    result = evaluate(model, features_val, registry=registry, client=client)
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items())
    ctx.log.info(
        "evaluated head %s on %s: loss=%.4f %s", model, features_val, result["loss"], metrics
    )
    return {"head": model, "head_loss": result["loss"], "head_metrics": result["metrics"]}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the feature-refresh workflow with ``argv``; return the exit code."""
    from dvml.jobs.schemas import FEATURE_REFRESH_SCHEMA

    return run_workflow("feature_refresh", DESCRIPTION, FEATURE_REFRESH_SCHEMA, plan, run, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
