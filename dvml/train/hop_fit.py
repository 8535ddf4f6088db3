"""``dvml.fit_multiple``: train many configurations at once with Model Hopper Parallelism.

MADlib's ``madlib_keras_fit_multiple_model`` on dvml's pinned partitions. The data stays in
each worker's vineyardd; the MODELS move. Every worker that holds training partitions runs
one long-lived hop trainer (:mod:`dvml.train.hop_trainer`: TensorFlow imported once per
worker and job, one plain Keras model per configuration, no distribution strategy). An
iteration is ``W`` rounds over the ``W`` workers (:func:`dvml.train.hop_schedule.hop_schedule`):
in round ``r`` model ``m`` trains its ``epochs`` on worker ``(m + r) mod W``'s local rows, then
its weights AND optimizer variables go to the next worker. Each hop is a pinned Dask task
whose input is the previous hop's result, so Dask moves a model's state directly between
the two workers; the client holds only futures (it receives each model's weights once, at
the end, to register them).

After each iteration every model's state is checkpointed on the worker that holds it; a
rerun of the same call resumes every model from the last iteration all of them completed.
The models and MADlib's info and summary tables are registered at the end, in one
transaction.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import pandas as pd

from dvml import config
from dvml._version import __version__
from dvml.cluster.workers import WorkerInfo, current_client
from dvml.exceptions import ArgumentError, ArgumentTypeError, TrainerFailedError
from dvml.names import check_suffixed_name
from dvml.registry.database import Registry, open_registry
from dvml.registry.weights import weights_from_bytes, weights_to_bytes
from dvml.store.datasets import Dataset, resolve_dataset
from dvml.store.leases import holding
from dvml.train import hop_worker, launch
from dvml.train.fit import (
    _check_fit_args,
    _job_key,
    _machine,
    _now,
    _trainers,
    _warm_start_weights,
)
from dvml.train.hop_schedule import Config, build_info, check_configs, hop_schedule
from dvml.train.model import Model
from dvml.train.model_selection import resolve_model_configs
from dvml.train.params import format_params, parse_compile_params, parse_fit_params
from dvml.train.summary import build_summary, check_shapes, iteration_record, weights_size_kb

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ModelSelection", "fit_multiple", "model_name"]

logger = logging.getLogger("dvml.train")


def model_name(model_output: str, mst_key: int) -> str:
    """The registry name of configuration ``mst_key``'s model: ``f"{model_output}_{mst_key}"``."""
    return f"{model_output}_{int(mst_key)}"


class ModelSelection:
    """The result of :func:`fit_multiple`: MADlib's info and summary tables and the models."""

    def __init__(self, name: str, registry: Registry) -> None:
        self.name, self.registry = name, registry

    @property
    def info(self) -> pd.DataFrame:
        """MADlib's ``<model_output>_info``: one row per configuration, by mst_key."""
        return pd.DataFrame(self.registry.model_selection_run(self.name)["info"])

    @property
    def summary(self) -> dict[str, Any]:
        """MADlib's ``<model_output>_summary`` (and dvml's own fields)."""
        return dict(self.registry.model_selection_run(self.name)["summary"])

    @property
    def mst_keys(self) -> list[int]:
        return [int(k) for k in self.info["mst_key"]]

    def model(self, mst_key: int) -> Model:
        """The registered model of one configuration (evaluate, predict, warm start by name)."""
        if int(mst_key) not in self.mst_keys:
            raise ArgumentError(
                f"No configuration with mst_key={mst_key!r} in {self.name!r}. Received: "
                f"mst_key={mst_key!r}; this run has {self.mst_keys}."
            )
        return Model(model_name(self.name, mst_key), self.registry)

    def best(self, by: str = "validation_metrics_final", maximize: bool = True) -> Model:
        """The model whose ``by`` column of :attr:`info` is the highest (or lowest)."""
        info = self.info
        if by not in info or info[by].isna().all():
            raise ArgumentError(
                f"Cannot rank the models by {by!r}: the info table has no values in it. "
                f"Received: by={by!r}. Columns: {list(info.columns)}; pass a validation_set "
                "to rank by validation figures."
            )
        row = info.loc[info[by].idxmax() if maximize else info[by].idxmin()]
        return self.model(int(row["mst_key"]))

    def __repr__(self) -> str:
        return f"<dvml.ModelSelection {self.name!r} configurations={len(self.mst_keys)}>"


def _resolve_configs(configs: Any) -> list[dict[str, Any]]:
    """Configuration records from a DataFrame or a list of dicts.

    A DataFrame (as :func:`dvml.model_configs` returns) or a list of dicts, each with
    ``mst_key``, ``model_id``, ``compile_params`` and ``fit_params``. A str, the name of a
    stored configuration table, is resolved by
    :func:`dvml.train.model_selection.resolve_model_configs` before this function is reached;
    any other type is refused here.

    Raises
    ------
    ArgumentTypeError
        ``configs`` is neither a DataFrame nor a list (or tuple) of dicts.
    """
    if isinstance(configs, pd.DataFrame):
        return [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in configs.to_dict(orient="records")
        ]
    if isinstance(configs, list | tuple):
        return list(configs)
    raise ArgumentTypeError(
        "configs must be a pandas DataFrame (as dvml.model_configs returns) or a list of "
        "dicts with keys mst_key, model_id, compile_params, fit_params. Received: "
        f"{type(configs).__name__}."
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    model_output: str
    configs: list[Config]
    parsed: dict[int, dict[str, Any]]  # mst_key -> compile/fit params parsed, arch JSON
    initial: dict[int, bytes]  # mst_key -> starting state (weights, no optimizer state)
    train: Dataset
    valid: Dataset | None
    workers: list[WorkerInfo]
    num_iterations: int
    frequency: int
    use_gpus: bool
    warm_start: bool
    seed: int
    timeout: float
    key: str
    checkpoint_dir: str
    custom_sources: dict[str, str]


def fit_multiple(
    training_set: str | Dataset,
    model_output: str,
    configs: Any,
    num_iterations: int,
    use_gpus: bool = False,
    validation_set: str | Dataset | None = None,
    metrics_compute_frequency: int | None = None,
    warm_start: bool = False,
    name: str | None = None,
    description: str | None = None,
    *,
    custom_objects: list[str] | None = None,
    resume: bool = True,
    seed: int | None = None,
    timeout: float | None = None,
    progress: bool = True,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> ModelSelection:
    """Train every configuration of ``configs`` with Model Hopper Parallelism (MOP).

    MADlib's ``madlib_keras_fit_multiple_model``. Each worker that holds partitions of
    ``training_set`` runs one trainer for the whole job; in each iteration every model trains
    one sub-epoch (its ``epochs``) on every worker's LOCAL partition in turn, with its
    weights and optimizer state moving from worker to worker between sub-epochs (Cerebro's
    round-robin: model ``m`` on worker ``(m + round) mod W``). No gradients and no data cross
    the network, only model states, once per hop. With at least as many configurations as
    workers every worker is busy in every round; with fewer, ``W - M`` workers sit idle in
    each round (MADlib's rule: use at least as many configurations as segments).

    Parameters
    ----------
    training_set : str or Dataset
        Built by :func:`dvml.training_preprocessor`.
    model_output : str
        Name of the run. Configuration ``k``'s model is registered as
        ``f"{model_output}_{k}"`` (:func:`model_name`); MADlib's ``<model_output>_info`` and
        ``<model_output>_summary`` are stored under ``model_output``.
    configs : str, pandas.DataFrame or list of dict
        The name of a stored model selection table, or the table itself
        (:func:`dvml.model_configs`): ``mst_key``, ``model_id``
        (an architecture id), ``compile_params`` and ``fit_params`` (MADlib strings, parsed
        safely). ``batch_size`` is the batch of the single trainer that holds the model.
    num_iterations : int
        Iterations; in each, every model visits every partition once.
    use_gpus : bool
        Train on the workers' GPUs (refused when one has none).
    validation_set : str or Dataset, optional
        Built by :func:`dvml.validation_preprocessor` for this training set.
    metrics_compute_frequency : int, optional
        Compute training/validation metrics every this many iterations (and at the end).
    warm_start : bool
        Start configuration ``k`` from the registered model ``f"{model_output}_{k}"``.
    name, description : str, optional
        Free text stored in the summary.
    custom_objects : list of str, optional
        Custom losses/metrics registered with :func:`dvml.registry.register_custom_function`.
    resume : bool
        Resume from the checkpoints of an interrupted run of the same call.
    seed : int, optional
        Seeds the models' initial weights and the shuffles (config ``dvml.preprocess.seed``).
    timeout : float, optional
        Seconds one hop may take before its trainer is stopped (config
        ``dvml.train.trainer-timeout``).
    progress : bool
        Log one line per iteration.

    Returns
    -------
    ModelSelection
        ``.info`` (a DataFrame, one row per configuration), ``.summary``, ``.model(mst_key)``
        and ``.best()``.

    Raises
    ------
    TrainerFailedError
        A trainer or a worker failed during a hop: every trainer is stopped and nothing is
        registered; run the same call again to resume.
    """
    client = current_client(client)
    reg = open_registry(registry)
    # The datasets it reads are leased for the whole run: a drop or overwrite is refused.
    with holding([training_set, validation_set], job=f"dvml.fit_multiple {model_output!r}"):
        plan = _plan(
            reg, client, training_set, model_output, configs, num_iterations, use_gpus,
            validation_set, metrics_compute_frequency, warm_start, custom_objects, seed, timeout,
        )  # fmt: skip
        start_iteration, states, history = _resume(client, plan, resume)
        start = _now()
        started = time.time()
        job_id = uuid.uuid4().hex[:12]
        job = {**_job(plan, job_id), "started_at": started}
        try:
            finals, records, evals = _run(
                client, plan, job, start_iteration, states, progress, started
            )
            weights = _final_weights(client, plan, finals)
        finally:
            client.run(hop_worker.stop_session, job_id, on_error="ignore")
        end = _now()
        _register(reg, plan, history, records, evals, weights, start, end, start_iteration, name,
                  description, started)  # fmt: skip
        client.gather(
            [
                client.submit(
                    launch.clear_checkpoint, plan.checkpoint_dir, workers=[w.address], pure=False
                )
                for w in plan.workers
            ]
        )
    return ModelSelection(model_output, reg)


def _plan(
    reg: Registry,
    client: Client,
    training_set: str | Dataset,
    model_output: str,
    configs: Any,
    num_iterations: int,
    use_gpus: bool,
    validation_set: str | Dataset | None,
    frequency: int | None,
    warm_start: bool,
    custom_objects: list[str] | None,
    seed: int | None,
    timeout: float | None,
) -> _Plan:
    """Check every argument and configuration up front (no trainer starts before this)."""
    _check_fit_args(model_output, num_iterations, frequency)
    # A stored table's name, or rows given here: parsed and checked against the registry.
    table = resolve_model_configs(configs, reg, custom_objects)
    custom_objects = custom_objects or list(table.attrs.get("custom_objects") or [])
    checked = check_configs(_resolve_configs(table))
    check_suffixed_name(model_output, [f"_{int(c['mst_key'])}" for c in checked], "model_output")
    train = resolve_dataset(training_set, client)
    valid = resolve_dataset(validation_set, client) if validation_set is not None else None
    parsed: dict[int, dict[str, Any]] = {}
    initial: dict[int, bytes] = {}
    for c in checked:
        key = c["mst_key"]
        compile_parsed = parse_compile_params(
            c["compile_params"], custom_names=custom_objects or []
        )
        fit_parsed = parse_fit_params(c["fit_params"])
        fit_parsed.setdefault("epochs", 1)
        fit_parsed.setdefault("batch_size", 32)
        arch = reg.get_architecture(c["model_id"])
        check_shapes(arch, train.summary, train.name)
        weights = arch["weights"]
        if warm_start:
            weights = _warm_start_weights(reg, model_name(model_output, key), c["model_id"])
        parsed[key] = {
            "model_json": arch["model_json"],
            "compile_params": compile_parsed,
            "fit_params": fit_parsed,
        }
        initial[key] = _state_bytes(list(weights) if weights is not None else [])
    workers = _trainers(client, train, valid, use_gpus)
    freq = frequency or num_iterations
    seed = int(config.get("preprocess.seed", seed))
    key = _job_key(
        "fit_multiple",
        model_output,
        train.summary["dataset_id"],
        valid.summary["dataset_id"] if valid else None,
        [(c["mst_key"], c["model_id"], parsed[c["mst_key"]]) for c in checked],
        num_iterations,
        freq,
        seed,
        warm_start,
        [w.name for w in workers],
    )
    return _Plan(
        model_output=model_output,
        configs=checked,
        parsed=parsed,
        initial=initial,
        train=train,
        valid=valid,
        workers=workers,
        num_iterations=num_iterations,
        frequency=freq,
        use_gpus=use_gpus,
        warm_start=warm_start,
        seed=seed,
        timeout=float(config.get("train.trainer-timeout", timeout)),
        key=key,
        checkpoint_dir=str(config.state_dir() / "checkpoints" / f"{model_output}-mop-{key}"),
        custom_sources=reg.custom_function_sources(custom_objects or []),
    )


def _state_bytes(weights: list[Any]) -> bytes:
    """A starting state: weights (none = the model's own seeded initialisation), no optimizer."""
    import numpy as np

    return weights_to_bytes([np.array([len(weights)], dtype=np.int64), *weights])


def _job(plan: _Plan, job_id: str) -> dict[str, Any]:
    """What every hop trainer is told (each adds its own worker name and index)."""
    return {
        "job_id": job_id,
        "model_output": plan.model_output,  # names the job in its trainers' job files
        "configs": {str(k): v for k, v in plan.parsed.items()},
        "training": plan.train.name,
        "validation": plan.valid.name if plan.valid else None,
        "seed": plan.seed,
        "custom_objects": plan.custom_sources,
        "use_gpus": plan.use_gpus,
        "timeout": plan.timeout,
        "workers": [w.name for w in plan.workers],
        "trainers_on_host": [
            sum(1 for o in plan.workers if _machine(o) == _machine(w)) for w in plan.workers
        ],
        "threads": [config.get("train.intra-op-threads"), config.get("train.inter-op-threads")],
    }


def _resume(
    client: Client, plan: _Plan, resume: bool
) -> tuple[int, dict[int, Any], list[dict[str, Any]]]:
    """First iteration to run, each model's starting state (future or bytes), the history.

    Resumes from the last iteration for which EVERY model has a checkpointed state.
    """
    fresh: dict[int, Any] = dict(plan.initial)
    if not resume:
        return 1, fresh, []
    listings = client.gather(
        [
            client.submit(
                hop_worker.list_checkpoints,
                plan.checkpoint_dir,
                plan.key,
                workers=[w.address],
                allow_other_workers=False,
                pure=False,
            )
            for w in plan.workers
        ]
    )
    holders: dict[tuple[int, int], WorkerInfo] = {}
    history: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for w, listing in zip(plan.workers, listings, strict=True):
        for meta in listing:
            at = (int(meta["mst_key"]), int(meta["iteration"]))
            if meta["has_state"]:
                holders[at] = w
            if at not in seen:
                seen.add(at)
                history.append(meta)
    keys = [c["mst_key"] for c in plan.configs]
    done = 0
    for iteration in range(plan.num_iterations, 0, -1):
        if all((k, iteration) in holders for k in keys):
            done = iteration
            break
    if done == 0:
        return 1, fresh, []
    logger.warning("resuming %s from iteration %d", plan.model_output, done)
    states = {
        k: client.submit(
            hop_worker.load_checkpoint,
            plan.checkpoint_dir,
            k,
            done,
            workers=[holders[(k, done)].address],
            allow_other_workers=False,
            pure=False,
        )
        for k in keys
    }
    return done + 1, states, [h for h in history if h["iteration"] <= done]


def _run(
    client: Client,
    plan: _Plan,
    job: dict[str, Any],
    start_iteration: int,
    states: dict[int, Any],
    progress: bool,
    started: float,
) -> tuple[dict[int, Any], list[dict[str, Any]], dict[tuple[int, int], list[dict[str, Any]]]]:
    """Submit every hop of every remaining iteration, wait, and return what they produced."""
    keys = [c["mst_key"] for c in plan.configs]
    n_workers = len(plan.workers)
    schedule = hop_schedule(len(keys), n_workers)
    current: dict[int, Any] = {}
    for k in keys:  # a state in bytes is put on the worker of the model's first hop
        first = plan.workers[schedule[0][keys.index(k)][1]]
        state = states[k]
        if isinstance(state, bytes):
            # A list of one: scattering a dict would scatter each of its values on its own.
            state = client.scatter(
                [{"state": state, "record": None}], workers=[first.address], hash=False
            )[0]
        current[k] = state
    record_futures: list[Any] = []
    eval_futures: dict[tuple[int, int], list[Any]] = {}
    checkpoints: dict[int, list[Any]] = {}
    last_checkpoint: dict[int, Any] = {}
    pending_keys: list[Any] = []
    hops: list[Any] = []
    for iteration in range(start_iteration, plan.num_iterations + 1):
        per_model_records: dict[int, list[Any]] = {k: [] for k in keys}
        holder: dict[int, WorkerInfo] = {}
        for r, round_ in enumerate(schedule):
            for m, w in round_:
                k, worker = keys[m], plan.workers[w]
                previous = current[k]
                hop = client.submit(
                    hop_worker.train_hop,
                    job,
                    k,
                    iteration,
                    previous,
                    previous.key,
                    workers=[worker.address],
                    allow_other_workers=False,
                    pure=False,
                    retries=0,
                    key=f"dvml-hop-{job['job_id']}-{iteration}-{r}-{k}",
                )
                rec = client.submit(
                    hop_worker.hop_record,
                    hop,
                    workers=[worker.address],
                    allow_other_workers=False,
                    pure=False,
                )
                hops.append(hop)
                per_model_records[k].append(rec)
                record_futures.append(rec)
                current[k], holder[k] = hop, worker
        due = iteration % plan.frequency == 0 or iteration == plan.num_iterations
        checkpoints[iteration] = []
        for k in keys:
            evals = []
            if due:
                evals = [
                    client.submit(
                        hop_worker.evaluate_state,
                        job,
                        k,
                        current[k],
                        workers=[w.address],
                        allow_other_workers=False,
                        pure=False,
                    )
                    for w in plan.workers
                ]
                eval_futures[(k, iteration)] = evals
            last_checkpoint[k] = client.submit(
                hop_worker.checkpoint,
                plan.checkpoint_dir,
                plan.key,
                k,
                iteration,
                current[k],
                per_model_records[k],
                evals,
                # after the model's previous checkpoint: a worker killed with the
                # earlier one still queued must not leave a gap in the history
                last_checkpoint.get(k),
                workers=[holder[k].address],
                allow_other_workers=False,
                pure=False,
            )
            checkpoints[iteration].append(last_checkpoint[k])
        pending_keys.extend(checkpoints[iteration])
    submitted = [*hops, *record_futures, *pending_keys]
    submitted += [f for futures in eval_futures.values() for f in futures]
    try:
        for iteration in range(start_iteration, plan.num_iterations + 1):
            _wait(client, plan, checkpoints[iteration], record_futures)
            if progress:
                line = (
                    f"[dvml.fit_multiple {plan.model_output}] iteration {iteration}/"
                    f"{plan.num_iterations}: {len(keys)} models ({time.time() - started:.1f}s)"
                )
                logger.info(line)
                print(line, flush=True)
        records = client.gather(record_futures)
        evals_out = {at: client.gather(futures) for at, futures in eval_futures.items()}
    except BaseException:
        # Every task of the job, not only those waited on: the hops of a model whose chain
        # did not break would go on (their futures live on in this frame, held by the
        # traceback), start trainers after the job stopped them and write checkpoints that
        # the rerun then reads.
        client.cancel(submitted)
        raise
    return current, records, evals_out


def _wait(client: Client, plan: _Plan, futures: list[Any], everything: list[Any]) -> None:
    """Wait for ``futures``; on a failed task or a departed worker, raise (bounded time)."""
    from dvml.train.peers import describe_departure

    while True:
        for _ in range(8):  # future statuses are updated by the client's event loop
            if any(f.status != "pending" for f in futures) and all(
                f.status == "finished" for f in futures
            ):
                break
            if any(f.status == "error" for f in everything):
                break
            time.sleep(0.25)
        failed = [f for f in (*everything, *futures) if f.status == "error"]
        if failed:
            exc = failed[0].exception()
            client.cancel(everything + futures)
            if isinstance(exc, TrainerFailedError):
                raise exc
            raise TrainerFailedError(
                f"A hop of fit_multiple {plan.model_output!r} failed: {type(exc).__name__}: "
                f"{exc}. Run fit_multiple again: it resumes every model from the last "
                "iteration all of them completed."
            ) from exc
        if all(f.status == "finished" for f in futures):
            return
        # The scheduler drops a worker whose process died at once. (No TCP probe here: a
        # worker busy training on a loaded host may be slow to accept a connection.)
        # Asked of the scheduler directly: client.scheduler_info() returns a cache that the
        # client's periodic refresh may have replaced by one without the workers (a race
        # that made every worker look gone here).
        identity = client.sync(client.scheduler.identity, n_workers=-1)  # type: ignore[union-attr]
        alive = set(identity["workers"])
        gone = [w for w in plan.workers if w.address not in alive]
        if gone:
            client.cancel(everything + futures)
            raise TrainerFailedError(
                f"{describe_departure(gone)}; fit_multiple {plan.model_output!r} was stopped. "
                "Bring the worker back (or preprocess onto the remaining workers) and run "
                "fit_multiple again: it resumes every model from the last iteration all of "
                "them completed."
            )


def _final_weights(client: Client, plan: _Plan, finals: dict[int, Any]) -> dict[int, bytes]:
    """Each model's final weights (the optimizer state stays on the workers)."""
    keys = list(finals)
    futures = [
        client.submit(hop_worker.weights_of, finals[k], pure=False, workers=None) for k in keys
    ]
    return dict(zip(keys, client.gather(futures), strict=True))


def _register(
    reg: Registry,
    plan: _Plan,
    history: list[dict[str, Any]],
    records: list[dict[str, Any]],
    evals: dict[tuple[int, int], list[dict[str, Any]]],
    weights: dict[int, bytes],
    start: str,
    end: str,
    start_iteration: int,
    name: str | None,
    description: str | None,
    started: float,
) -> None:
    """Build every model's summary and the info/summary tables; register all in one go."""
    per_model: dict[int, dict[int, dict[str, Any]]] = {c["mst_key"]: {} for c in plan.configs}
    for h in history:  # resumed iterations, as the checkpoints recorded them
        per_model[int(h["mst_key"])][int(h["iteration"])] = {
            "records": h["records"],
            "evals": h["evals"],
        }
    for r in records:
        entry = per_model[r["mst_key"]].setdefault(r["iteration"], {"records": [], "evals": []})
        entry["records"].append(r)
    for (k, iteration), found in evals.items():
        per_model[k][iteration]["evals"] = found
    models, summaries, seconds, names = [], {}, {}, {}
    for c in plan.configs:
        k = c["mst_key"]
        iterations = []
        train_s = moving_s = 0.0
        for iteration in sorted(per_model[k]):
            entry = per_model[k][iteration]
            elapsed = max((r.get("elapsed", 0.0) for r in entry["records"]), default=0.0)
            train_s += sum(r["train_s"] for r in entry["records"])
            moving_s += sum(r["moving_s"] for r in entry["records"])
            pseudo = [{"iteration": iteration, "elapsed": elapsed, **e} for e in entry["evals"]]
            iterations.append(
                iteration_record(pseudo or [{"iteration": iteration, "elapsed": elapsed}])
            )
        parsed = plan.parsed[k]
        final = weights_from_bytes(weights[k])
        names[k] = model_name(plan.model_output, k)
        summary = build_summary(
            training=plan.train,
            validation=plan.valid,
            model=names[k],
            arch_id=c["model_id"],
            compile_params=parsed["compile_params"],
            fit_params=parsed["fit_params"],
            compile_text=format_params(parsed["compile_params"]),
            fit_text=format_params(parsed["fit_params"]),
            num_iterations=plan.num_iterations,
            metrics_compute_frequency=plan.frequency,
            name=name,
            description=description,
            start=start,
            end=end,
            iterations=iterations,
            model_size_kb=weights_size_kb(final),
            trainers=[w.name for w in plan.workers],
            weights_identical=True,
            warm_start=plan.warm_start,
            version=__version__,
        )
        summary.update(
            custom_objects=sorted(plan.custom_sources),
            sync="model_hopper",
            mst_key=k,
            model_selection=plan.model_output,
            resumed_from_iteration=start_iteration - 1 if start_iteration > 1 else None,
        )
        summaries[k], seconds[k] = summary, {"training_s": train_s, "moving_s": moving_s}
        models.append(
            {
                "name": names[k],
                "arch_id": c["model_id"],
                "weights": final,
                "summary": summary,
                "iterations": iterations,
            }
        )
    info = build_info(plan.configs, names, summaries, seconds)
    ts = plan.train.summary
    hops = records
    run_summary = {
        "source_table": plan.train.name,
        "validation_table": plan.valid.name if plan.valid else None,
        "model": plan.model_output,
        "model_info": f"{plan.model_output}_info",
        "dependent_varname": ts["dependent_varname"],
        "independent_varname": ts["independent_varname"],
        "model_arch_table": "model_arch",
        "model_selection_table": "model_configs",
        "num_iterations": plan.num_iterations,
        "metrics_compute_frequency": plan.frequency,
        "warm_start": plan.warm_start,
        "name": name,
        "description": description,
        "start_training_time": start,
        "end_training_time": end,
        "madlib_version": __version__,
        "version": __version__,
        "num_classes": ts["num_classes"],
        "class_values": ts["class_values"],
        "dependent_vartype": ts["dependent_vartype"],
        "normalizing_const": ts["normalizing_const"],
        "metrics_iters": summaries[plan.configs[0]["mst_key"]]["metrics_iters"],
        # dvml's own fields
        "mst_keys": [c["mst_key"] for c in plan.configs],
        "model_names": [names[c["mst_key"]] for c in plan.configs],
        "workers": [w.name for w in plan.workers],
        "rounds_per_iteration": len(plan.workers),
        "hops": len(hops),
        "hop_workers": sorted({(r["mst_key"], r["iteration"], r["worker"]) for r in hops}),
        "training_seconds": sum(r["train_s"] for r in hops),
        "moving_seconds": sum(r["moving_s"] for r in hops),
        "transfer_seconds": sum(r["transfer_s"] for r in hops),
        "moved_bytes": sum(r["bytes"] for r in hops),
        "wall_seconds": time.time() - started,
        "resumed_from_iteration": start_iteration - 1 if start_iteration > 1 else None,
    }
    reg.save_model_selection_run(plan.model_output, models, info, run_summary)
