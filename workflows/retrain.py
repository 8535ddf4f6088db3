"""Retrain a model on the newest data and promote it only when it is better.

``python -m workflows.retrain --config workflows/configs/retrain-digits.yaml``

Steps, one log line each: take the lock; attach to (or start) the cluster; clean up after a
killed run; find the newest data; preprocess it into ``<name>-train`` and ``<name>-val``
(reused when the last run built them from the same data); train the candidate
``<name>@candidate``, warm-started from the production model ``<name>`` when one exists; evaluate
both on ``<name>-val``; copy the candidate to ``<name>`` when it is better (promotion).

With ``data.append: true`` the source is a directory or glob that grows: the first run packs
every file, later runs append only the files not seen before as a new dataset version (after
checking their schema, class values and drift: :mod:`dvml.jobs.appends`), and a run with no
new file does nothing.

The production pointer is the model NAME: ``<name>`` is what serves, ``<name>@candidate`` the
last candidate (kept for inspection). Promoting is one registry transaction (a copy with
``replace=True``), and the production model's summary records the promotion under
``"promotion"``. Every name is deterministic and every write replaces, so a run killed at any
point leaves at most one production model, one candidate and two datasets, and the next run
completes the job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workflows._runtime import (
    EXIT_OK,
    RunContext,
    digest,
    fit_memory_plan,
    recover,
    run_workflow,
)

__all__ = ["candidate_name", "main"]

DESCRIPTION = (
    "Retrain a model on the newest data (warm-started from production), evaluate it on the "
    "validation set and promote it to production only when it is better."
)


def candidate_name(name: str) -> str:
    """The candidate model of job ``name``; ``name`` itself is the production model."""
    return f"{name}@candidate"


def _keys(ctx: RunContext, fingerprint: str) -> tuple[str, str]:
    """(data key, training key): what makes two runs' datasets, and trainings, the same."""
    job = ctx.job
    data_key = digest(fingerprint, job["data"], job["validation"])
    return data_key, digest(data_key, job["model"], job["promotion"])


def plan(ctx: RunContext) -> list[str]:
    """The steps a run would take now, read-only (files are only listed and stat'ed)."""
    from dvml.jobs.data import dataset_names, resolve_source, validation_fraction
    from dvml.jobs.job_cluster import cluster_plan
    from dvml.jobs.models import metric_mode
    from dvml.jobs.schemas import DEFAULT_FIT_PARAMS

    job = ctx.job
    name = job["name"]
    if job["data"]["append"]:
        from dvml.jobs.appends import append_plan

        source, data_line, skip_line = append_plan(
            job, ctx.base_dir, ctx.read_state(), ctx.args.force
        )
    else:
        source = resolve_source(job["data"]["source"], ctx.base_dir)
        _, train_key = _keys(ctx, source.fingerprint)
        last = ctx.read_state().get("last_success") or {}
        data_line = f"data: {source.describe()}"
        skip_line = (
            "skip: the last successful run already trained on this data (use --force)"
            if last.get("train_key") == train_key and not ctx.args.force
            else "data is new (or --force): train"
        )
    validation_fraction(job, source)  # a job that cannot work is refused by the plan
    journal = ctx.read_journal()
    valid = job["validation"]
    validation = (
        f"validation.source {valid['source']}"
        if valid["source"]
        else f"split {valid['split'] or 0.2} of the training data"
    )
    model = job["model"]
    promo = job["promotion"]
    mode = metric_mode(promo["metric"], promo["mode"])
    train_name, val_name = dataset_names(name)
    if model["from_selection"]:
        what = (
            f"the best configuration of fit_multiple run {model['from_selection']!r} "
            "(highest final validation metric: its architecture, compile_params, fit_params)"
        )
    else:
        fit_params = model["fit_params"] or DEFAULT_FIT_PARAMS
        what = f"architecture {model['architecture']!r}, fit_params {fit_params!r}"
    return [
        ctx.lock_line(),
        f"cluster: {cluster_plan(job['cluster'], ctx.args.scheduler)}",
        "recover: "
        + (
            f"previous run {journal.get('run_id')} stopped in phase {journal.get('phase')!r}: "
            "stop its trainers, delete its staging objects"
            if journal
            else "no unfinished run; stop orphaned trainers if any"
        ),
        data_line,
        skip_line,
        f"preprocess into {train_name} and {val_name} (replaced atomically); {validation}",
        f"{what}; train {candidate_name(name)} for {model['num_iterations']} iteration(s), "
        + (
            f"warm-started from production {name!r} if it exists (and has that architecture)"
            if model["warm_start"]
            else "from scratch"
        ),
        f"evaluate {candidate_name(name)} and {name} on {val_name}; promote when "
        f"{promo['metric']} is {'lower' if mode == 'min' else 'higher'} by more than "
        f"{promo['min_delta']:g}",
        f"registry {job['registry'] or '(dvml config default)'}; state {ctx.state_path}",
    ]


def run(ctx: RunContext) -> int:
    """Run the steps; return the exit code (failures raise and are logged by the caller)."""
    from dvml.jobs.data import resolve_source
    from dvml.jobs.job_cluster import open_cluster
    from dvml.registry import Registry

    job, log = ctx.job, ctx.log
    with open_cluster(job["cluster"], ctx.args.scheduler) as cluster:
        client = cluster.client
        log.info("connected to %s (%d workers)", cluster.scheduler_address, len(cluster.workers))
        recover(ctx, client)
        if job["data"]["append"]:
            return _run_appending(ctx, client)
        source = resolve_source(job["data"]["source"], ctx.base_dir)
        log.info("newest data: %s", source.describe())
        data_key, train_key = _keys(ctx, source.fingerprint)
        state = ctx.read_state()
        last = state.get("last_success") or {}
        if last.get("train_key") == train_key and not ctx.args.force:
            log.info(
                "nothing new: run %s already trained on this data at %s (outcome: %s); "
                "--force retrains",
                last.get("run_id"),
                last.get("finished"),
                last.get("outcome"),
            )
            ctx.clear_journal()
            return EXIT_OK
        registry = Registry(job["registry"])
        try:
            _prepare(ctx, client, source, data_key, state)
            outcome = _train_and_promote(ctx, client, registry)
        finally:
            registry.close()
        _record_success(ctx, {"train_key": train_key, "source": source.location, **outcome})
    log.info("done in %.1fs: %s", ctx.elapsed(), outcome["outcome"])
    return EXIT_OK


def _run_appending(ctx: RunContext, client: Any) -> int:
    """``data.append: true``: pack the first files, then append only new ones, and train
    (:mod:`dvml.jobs.appends`); nothing new: nothing is done."""
    from dvml.jobs.appends import update_datasets
    from dvml.registry import Registry

    data = update_datasets(ctx.job, client, ctx, force=bool(ctx.args.force))
    if data is None:
        ctx.clear_journal()
        return EXIT_OK
    registry = Registry(ctx.job["registry"])
    try:
        outcome = _train_and_promote(ctx, client, registry, data)
    finally:
        registry.close()
    _record_success(ctx, {"source": ctx.job["data"]["source"], **outcome}, appended=True)
    ctx.log.info("done in %.1fs: %s", ctx.elapsed(), outcome["outcome"])
    return EXIT_OK


def _record_success(ctx: RunContext, fields: dict[str, Any], appended: bool = False) -> None:
    """Record this run as the last successful one (with ``fields``) and end its journal;
    ``appended``: its model was trained on the rows the appends record holds."""
    state = ctx.read_state()
    if appended:
        state["appended"]["trained"] = True
    state["last_success"] = {
        "run_id": ctx.run_id,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
    }
    ctx.write_state(state)
    ctx.clear_journal()


def _prepared_again(ctx: RunContext, client: Any, state: dict[str, Any], data_key: str) -> bool:
    """Whether both datasets exist exactly as a previous run built them from this data."""
    from dvml.exceptions import DatasetNotFoundError
    from dvml.store.datasets import describe

    prepared = state.get("prepared") or {}
    if prepared.get("data_key") != data_key:
        return False
    try:
        return all(
            describe(ds["name"], client).summary["dataset_id"] == ds["dataset_id"]
            for ds in (prepared["train"], prepared["validation"])
        )
    except DatasetNotFoundError:
        return False


def _prepare(
    ctx: RunContext, client: Any, source: Any, data_key: str, state: dict[str, Any]
) -> None:
    from dvml.jobs.data import dataset_names, prepare_datasets

    train_name, val_name = dataset_names(ctx.job["name"])
    if _prepared_again(ctx, client, state, data_key):
        ctx.log.info(
            "preprocessed: reusing %s and %s, built from the same data by run %s",
            train_name,
            val_name,
            state["prepared"]["run_id"],
        )
        ctx.journal("preprocessed")
        return
    ctx.journal("preprocessing")
    started = time.monotonic()
    train, validation = prepare_datasets(ctx.job, client, ctx.base_dir, source)
    state["prepared"] = {
        "data_key": data_key,
        "run_id": ctx.run_id,
        "train": {"name": train.name, "dataset_id": train.summary["dataset_id"]},
        "validation": {"name": validation.name, "dataset_id": validation.summary["dataset_id"]},
    }
    ctx.write_state(state)
    ctx.journal("preprocessed")
    workers = len({b["worker_name"] for b in train.layout["buffers"]})
    ctx.log.info(
        "preprocessed %s (%d rows on %d workers) and %s (%d rows) in %.1fs",
        train.name,
        train.rows,
        workers,
        validation.name,
        validation.rows,
        time.monotonic() - started,
    )


def _train_and_promote(
    ctx: RunContext, client: Any, registry: Any, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train the candidate, evaluate it and production, promote when better. ``data``: what
    an append run packed (files, versions, drift), recorded in the outcome and promotion."""
    from dvml.jobs.data import dataset_names
    from dvml.jobs.models import (
        copy_model,
        fit_arguments,
        is_better,
        metric_mode,
        metric_value,
        model_exists,
        resolve_model_section,
    )
    from dvml.registry.model_lineage import promoted
    from dvml.train.fit import fit
    from dvml.train.predict import evaluate

    job, log = ctx.job, ctx.log
    name, model, promo = job["name"], job["model"], job["promotion"]
    candidate = candidate_name(name)
    train_name, val_name = dataset_names(name)
    model, arch_id, selected = resolve_model_section(model, registry, ctx.base_dir)
    if selected is not None:
        log.info(
            "retraining the best configuration of fit_multiple run %r: mst_key %d (%s, "
            "validation metric %.4f), architecture %d, compile_params %r, fit_params %r",
            model["from_selection"],
            selected["mst_key"],
            selected["model_name"],
            selected["validation_metrics_final"],
            arch_id,
            selected["compile_params"],
            selected["fit_params"],
        )
    warm = bool(model["warm_start"]) and model_exists(registry, name)
    if warm and registry.get_model(name)["arch_id"] != arch_id:
        # production was trained with another architecture (an earlier selection's best)
        log.info("production %s has another architecture: training from scratch", name)
        warm = False
    if warm:
        copy_model(registry, name, candidate)  # fit warm-starts from the model it writes
    log.info(
        "training %s (architecture %d) from %s: %d iteration(s)",
        candidate,
        arch_id,
        f"production {name!r}" if warm else "scratch",
        model["num_iterations"],
    )
    ctx.journal("training", candidate=candidate)
    started = time.monotonic()
    validated: dict[str, Any] = {}  # the last iteration's metrics on the validation set

    def on_iteration(record: dict[str, Any]) -> None:
        if record.get("validation_loss") is not None:
            validated.update(loss=record["validation_loss"], metrics=record["validation_metrics"])
        log.info(
            "  iteration %s/%s loss=%s val_loss=%s",
            record.get("iteration"),
            model["num_iterations"],
            _num(record.get("training_loss", record.get("fit_loss"))),
            _num(record.get("validation_loss")),
        )

    fit(
        train_name,
        candidate,
        arch_id,
        **fit_arguments(model),
        validation_set=val_name,
        warm_start=warm,
        overwrite=True,  # the job retrains its candidate on every run
        name=name,
        description=job["description"],
        on_iteration=on_iteration,
        progress=False,
        registry=registry,
        client=client,
    )
    log.info("trained %s in %.1fs", candidate, time.monotonic() - started)

    ctx.journal("evaluating", candidate=candidate)
    metric, mode = promo["metric"], metric_mode(promo["metric"], promo["mode"])
    # The fit measured the candidate's final weights on every validation row (as evaluate
    # would), and production's score is kept while neither it nor the validation set changed:
    # a run evaluates only what it does not know (B24c: 2 s of a 12 s warm run).
    cand = metric_value(
        validated or evaluate(candidate, val_name, registry=registry, client=client), metric
    )
    val_key = _validation_key(client, val_name)
    prod, prod_key, known = None, None, ""
    if model_exists(registry, name):
        prod_key = _model_key(registry, name)
        prod = _known_production_score(ctx, prod_key, metric, val_key)
        if prod is not None:
            known = " (measured by an earlier run: the same model on the same rows)"
        else:
            prod = metric_value(evaluate(name, val_name, registry=registry, client=client), metric)
    log.info(
        "evaluated on %s: candidate %s=%.4f, production %s%s",
        val_name,
        metric,
        cand,
        f"{metric}={prod:.4f}" if prod is not None else "none yet",
        known,
    )
    outcome: dict[str, Any] = {"metric": metric, "candidate": cand, "production_before": prod}
    if data is not None:
        outcome["data"] = data
    if selected is not None:
        outcome["selection"] = {"from": model["from_selection"], **selected}
    if is_better(cand, prod, mode, promo["min_delta"]):
        ctx.journal("promoting", candidate=candidate)
        record = {
            "run_id": ctx.run_id,
            "from": candidate,
            "metric": metric,
            "mode": mode,
            "candidate": cand,
            "previous": prod,
            "promoted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **({"data": data} if data is not None else {}),
        }
        over = registry.get_model(name) if prod is not None else None
        lineage = promoted(
            registry.get_model(candidate)["summary"] or {}, record,
            {"name": name, "registry_version": over["version"]} if over else None,
        )  # fmt: skip
        copy_model(registry, candidate, name, {"promotion": record, "lineage": lineage})
        log.info("promoted %s to production %s", candidate, name)
        score = _production_score(_model_key(registry, name), metric, cand, val_key)
        return {**outcome, "outcome": f"promoted {candidate} to {name}", **score}
    log.info(
        "kept production %s: the candidate is not better by more than %g", name, promo["min_delta"]
    )
    score = _production_score(prod_key, metric, prod, val_key)
    return {**outcome, "outcome": f"kept production {name}", **score}


def _validation_key(client: Any, val_name: str) -> dict[str, Any]:
    """What identifies the validation set's rows: its dataset id and version."""
    from dvml.store.datasets import describe

    ds = describe(val_name, client)
    return {"name": val_name, "dataset_id": ds.summary["dataset_id"], "version": ds.version}


def _model_key(registry: Any, name: str) -> str:
    """A registered model's version and save time (a registry made anew restarts versions),
    read without its weights."""
    row = registry.list_models().set_index("name").loc[name]
    return f"version {row['version']} saved {row['updated_at']}"


def _production_score(
    model_key: str | None, metric: str, value: float | None, val_key: dict[str, Any]
) -> dict[str, Any]:
    """The state's record of production's score: which model version, on which rows."""
    if value is None:
        return {}
    return {"production_score": {"model": model_key, "metric": metric, "value": value,
                                 "validation": val_key}}  # fmt: skip


def _known_production_score(
    ctx: RunContext, model_key: str, metric: str, val_key: dict[str, Any]
) -> float | None:
    """Production's score from the last successful run when it is still the same model
    version on the same validation version (else None: evaluate it)."""
    known = (ctx.read_state().get("last_success") or {}).get("production_score") or {}
    same = (known.get("model"), known.get("metric"), known.get("validation"))
    if same != (model_key, metric, val_key):
        return None
    return float(known["value"])


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the retrain workflow with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    from dvml.jobs.schemas import JOB_SCHEMA

    return run_workflow(
        "retrain", DESCRIPTION, JOB_SCHEMA, plan, run, argv, memory=fit_memory_plan
    )  # --dry-run prints the memory plan too


if __name__ == "__main__":
    import sys

    sys.exit(main())
