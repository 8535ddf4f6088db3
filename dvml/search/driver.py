"""``dvml.automl``: MADlib's ``madlib_keras_automl`` (Hyperband, hyperopt) and ASHA, each a
scheduler on ONE job of serving trainers.

MADlib runs every step of a search as one ``fit_multiple`` call, with warm start for the
configurations that go on. dvml runs the whole search on one
:class:`~dvml.train.runtime.hopper.ModelHopper` (:class:`~dvml.search.hop_search.HopSearch`):
the trainers start once, new configurations join the running job, and a configuration that
goes on continues from its state in the cluster (weights and optimizer variables), never from
the registry:

- ``method="hyperband"``: :class:`~dvml.search.hyperband.HyperbandRun` gives each diagonal;
  its configurations were sampled up front (MADlib's random ``generate_model_configs``, with
  ``mst_key`` 1..N, largest bracket first). A diagonal trains its survivors and the bracket
  that starts there together with ``fit_multiple``'s MOP schedule for ``r`` iterations.
  Survivors are ranked by validation loss, else training loss.
- ``method="hyperopt"``: :class:`~dvml.search.hyperopt_run.HyperoptRun` proposes MADlib's
  batches of as many configurations as there are workers (seeded random or Optuna's TPE); each
  batch trains ``num_iterations`` with the MOP schedule, each loss told back to the sampler.

At the end the driver registers one model per configuration, ``f"{model_output}_{mst_key}"``
(so ``dvml.evaluate``, ``predict`` and warm start work on any of them), and MADlib's outputs
under ``model_output``: ``.info`` (every configuration, its metrics concatenated over the
search as MADlib does, ``metrics_iters`` counted over the whole search, plus ``s`` and ``i``
for Hyperband), ``.summary`` (with ``automl_method``, ``automl_params``, ``random_state`` and
the search's journal) and the one-row model selection table of the best configuration
(``f"{model_output}_best"``, loadable by name with ``dvml.describe_model_configs``).

``method="asha"`` (dvml's, beyond MADlib) is :class:`~dvml.search.asha.Asha` driven on one
job of serving trainers that never restart (:mod:`dvml.search.asha_driver`): new
configurations join the running job on idle workers, promotions resume parked models from their
state, every decision is journaled in the registry before it is carried out, and
``resume=True`` continues a search whose client died from its last decision.

Every search holds its datasets (a drop or overwrite is refused while it runs) and goes on
without a worker that leaves the cluster, named within the runtime watcher's bound.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from dvml import config
from dvml import configs as cs
from dvml.cluster.workers import current_client
from dvml.configs.search_space import SearchSpace
from dvml.exceptions import ArgumentError, RegistryNotFoundError
from dvml.names import check_name, check_suffixed_name
from dvml.registry.database import Registry, open_registry
from dvml.search import hyperband as hb
from dvml.search.asha import Asha
from dvml.search.asha_driver import AshaDriver, data_identity
from dvml.search.automl_params import (
    AshaParams,
    HyperbandParams,
    HyperoptParams,
    parse_automl_params,
)
from dvml.search.hop_search import HopSearch
from dvml.search.hyperopt_run import HyperoptRun
from dvml.search.outcome import SearchOutcome
from dvml.search.search_memory import bounding_configs
from dvml.store.datasets import Dataset
from dvml.store.leases import holding
from dvml.tracking.model_events import log_models_saved
from dvml.train.fit_multiple import ModelSelection, track_selection
from dvml.train.model_lock import holding_output
from dvml.train.outputs import check_outputs_free, existing_outputs
from dvml.train.runtime.plan import JobArgs, now, place_job, utc_text

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["AutoMLResult", "automl"]

logger = logging.getLogger("dvml.search")


class AutoMLResult(ModelSelection):
    """The result of :func:`automl`: MADlib's ``.info``, ``.summary`` and ``.best``.

    ``.info`` has one row per configuration (with ``s`` and ``i`` for Hyperband),
    ``.summary`` the search's parameters and journal, ``.best_config`` the one-row model
    selection table of the best configuration, ``.model(k)`` any configuration's model.
    """

    @property
    def loss_column(self) -> str:
        return str(self.summary["automl_loss"])

    @property
    def best_config(self) -> pd.DataFrame:
        """MADlib's model selection table after AutoML: the best configuration's row."""
        return self.registry.model_selection(f"{self.name}_best")

    def best(self, by: str | None = None, maximize: bool = False) -> Any:
        """The model of the lowest loss (validation, else training), or by another column."""
        return super().best(by or self.loss_column, maximize)

    def __repr__(self) -> str:
        return f"<dvml.AutoMLResult {self.name!r} configurations={len(self.mst_keys)}>"


def _loss(row: Mapping[str, Any], column: str) -> float | None:
    value = row.get(column)
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def automl(
    training_set: str | Dataset,
    model_output: str,
    arch_ids: int | Sequence[int],
    compile_params_grid: str | Mapping[str, Any],
    fit_params_grid: str | Mapping[str, Any] | None,
    method: str = "hyperband",
    params: str | Mapping[str, Any] | None = None,
    seed: int | None = None,
    validation_set: str | Dataset | None = None,
    metrics_compute_frequency: int | None = None,
    use_gpus: bool = False,
    name: str | None = None,
    description: str | None = None,
    custom_objects: list[str] | None = None,
    *,
    augment: Any = None,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> AutoMLResult:
    """Search configurations with early stopping, MADlib's ``madlib_keras_automl``.

    Parameters
    ----------
    training_set : str or Dataset
        As for :func:`dvml.fit_multiple`.
    model_output : str
        The search's name: its models are ``f"{model_output}_{mst_key}"``, its info and
        summary are found under ``model_output``, its best configuration under
        ``f"{model_output}_best"``.
    arch_ids : int or list of int
        Architectures (:func:`dvml.load_keras_model`).
    compile_params_grid, fit_params_grid : dict or str
        MADlib's grids: lists of choices, ``optimizer_params_list``, and ranges
        ``[low, high, 'linear' | 'log' | 'log_near_one']``.
    method : {"hyperband", "hyperopt", "asha"}
        MADlib's ``automl_method``, or ``"asha"``: asynchronous successive halving on one job
        of serving trainers (:mod:`dvml.search.asha_driver`).
    params : str or dict, optional
        MADlib's ``automl_params``: ``'R=6, eta=3, skip_last=0'`` (hyperband, the default) or
        ``'num_configs=20, num_iterations=5, algorithm=tpe'`` (hyperopt; ``tpe`` needs
        ``pip install 'dvml[automl]'``), or ASHA's ``'max_t=81, eta=3, grace_period=1,
        max_configs=100, time_budget_s=600, sampler=random'`` (``sampler=tpe`` needs the
        extra too).
    seed : int, optional
        MADlib's ``random_state``: the sampler's seed.
    validation_set : str or Dataset, optional
        As for :func:`dvml.fit_multiple`; configurations are ranked by the validation loss
        when there is a validation set, else by the training loss (never by the metric).
    metrics_compute_frequency, use_gpus, name, description, custom_objects : optional
        As for :func:`dvml.fit_multiple` (a frequency larger than a call's iterations is
        dropped for that call, as MADlib does).
    augment : tf-keras layer or function, optional
        Per-epoch augmentation of every configuration's training batches, as in
        :func:`dvml.fit`.
    progress : bool
        A line per decision, with the best configuration so far.
    resume : bool
        ``method="asha"`` only: continue the search ``model_output`` whose client died from the
        journal's last decision (each active model loses at most the iteration it was
        training); a finished one is returned as it is; one not found starts afresh.
    overwrite : bool
        Replace the outputs of ``model_output`` that exist (the run, its models, the table
        ``f"{model_output}_best"``). By default they are refused, as MADlib refuses an
        output table that exists, unless ``resume=True`` continues that search.
    registry, client : optional
        The registry (default: config ``dvml.registry.url``) and Dask client (default: the
        current one).

    Returns
    -------
    AutoMLResult

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Before anything trains: an unknown method, MADlib's ``automl_params`` refusals, a bad
        grid or name.
    FitRunningError
        Another ``automl`` or ``fit_multiple`` of ``model_output`` is running (in this or
        another process of this state directory); nothing was started.
    """
    check_name(model_output, "model_output")
    parsed = parse_automl_params(method, params)
    space = SearchSpace(arch_ids, compile_params_grid, fit_params_grid, custom_objects or ())
    if resume and not isinstance(parsed, AshaParams):
        raise ArgumentError(
            f"resume=True continues an ASHA search from its journal; MADlib's {method!r} is "
            f"run again from the start. Received: method={method!r}, resume=True. Pass "
            "resume=False, or use method='asha'."
        )
    reg = open_registry(registry)
    if not (resume or overwrite):
        found = existing_outputs(reg, model_output, selection=True)
        check_outputs_free(reg, "dvml.automl", model_output, found,
                           "resume=True (method='asha') to continue that search")  # fmt: skip
    client = current_client(client)
    if resume and _finished_asha(reg, model_output, parsed):
        return AutoMLResult(model_output, reg)  # nothing left to resume
    loss_column = "validation_loss_final" if validation_set is not None else "training_loss_final"
    started = time.time()
    args = JobArgs(
        model_output, training_set, validation_set, _most_iterations(parsed),
        metrics_compute_frequency, use_gpus, False, custom_objects, seed, None, augment,
    )  # fmt: skip
    # One run per model_output at a time (with fit_multiple's): a second search would share
    # this one's checkpoints (an ASHA resume its journal). Held until the outputs are saved.
    job = f"dvml.automl {model_output!r} method={method.strip().lower()!r}"
    with holding_output(config.state_dir(), model_output, job, "dvml.automl"):
        # The datasets are leased for the whole search: a drop or overwrite is refused meanwhile.
        # Checked after each hop (ASHA) or diagonal/batch: a forced drop stops the search at once.
        with holding(
            [training_set, validation_set], job=f"dvml.automl {model_output!r}", client=client
        ) as lease:
            if isinstance(parsed, AshaParams):
                outcome = _asha(reg, client, args, space, parsed, resume, progress, name,
                                description, lease.check)  # fmt: skip
            else:
                outcome = _hop_search(reg, client, args, space, parsed, progress, name,
                                      description, lease.check)  # fmt: skip
        _save(reg, args, outcome, method, parsed, loss_column, started)
        log_models_saved(client, [(m["name"], m["summary"]) for m in outcome.models],
                         f"dvml.automl {model_output}")  # fmt: skip
    result = AutoMLResult(model_output, reg)
    track_selection("automl", result)
    return result


def _save(
    reg: Registry,
    args: JobArgs,
    outcome: SearchOutcome,
    method: str,
    parsed: AshaParams | HyperbandParams | HyperoptParams,
    loss_column: str,
    started: float,
) -> None:
    """Register the search's run (``.info``, ``.summary``) and its best configuration's table."""
    model_output, seed, custom_objects = args.output, args.seed, args.custom_objects
    info, models, summary = outcome.info, outcome.models, outcome.summary
    rows = [info[k] for k in sorted(info)]
    ranked = sorted(rows, key=lambda r: (hb.rank_key(_loss(r, loss_column)), r["mst_key"]))
    best = info[outcome.best] if outcome.best is not None else ranked[0]
    summary.update(
        model=model_output,
        model_info=f"{model_output}_info",
        model_selection_table=f"{model_output}_best",
        automl_method=method.strip().lower(),
        automl_params=parsed.text(),
        random_state=seed,
        automl_loss=loss_column,
        best_mst_key=int(best["mst_key"]),
        mst_keys=[int(r["mst_key"]) for r in rows],
        model_names=[r["model_name"] for r in rows],
        # as every other summary writes them (UTC, ISO 8601, seconds, with the offset)
        start_training_time=utc_text(started),
        end_training_time=now(),
        journal=outcome.journal,
        status="finished",
    )
    reg.save_model_selection_run(model_output, models, rows, summary)
    best_row = cs.ModelConfig(
        int(best["mst_key"]), int(best["model_id"]), best["compile_params"], best["fit_params"]
    )  # drawn from the space, parsed then: a checked row
    reg.save_model_selection(
        f"{model_output}_best",
        [best_row],
        search=summary["automl_method"],
        seed=seed,
        source={"automl_params": parsed.text(), "model_output": model_output},
        custom_objects=custom_objects,
        description=f"the best configuration of automl run {model_output!r}",
        replace=True,
    )


def _asha(
    reg: Registry,
    client: Client,
    args: JobArgs,
    space: SearchSpace,
    parsed: AshaParams,
    resume: bool,
    progress: bool,
    name: str | None,
    description: str | None,
    check: Callable[[], None],
) -> SearchOutcome:
    """ASHA on one job of serving trainers; the journal saved in the registry as it goes."""
    job = place_job(reg, client, args)
    search = Asha(space, parsed, args.seed)
    running = _running_summary(reg, args.output) if resume else None
    journal = str(running["journal"]) if running is not None else None
    if journal is not None:
        resumed = Asha.from_journal(journal)
        if resumed.journal.header != search.journal.header:
            raise ArgumentError(
                f"resume=True but search {args.output!r} was started with other arguments. "
                f"Received: {search.journal.header!r:.300}; the journal has "
                f"{resumed.journal.header!r:.300}. Resume with the same arguments, or pass "
                "resume=False to start afresh."
            )
        search = resumed

    keys: dict[str, Any] = {}
    logged = [0]  # journal records told to the dashboard page so far

    def save(text: str) -> None:
        reg.save_model_selection_run(
            args.output, [], [], {"automl_method": "asha", "status": "running",
                                  "automl_params": parsed.text(), "random_state": args.seed,
                                  "journal": text, **keys},
        )  # fmt: skip
        logged[0] = _log_journal(client, args.output, search.journal.records, logged[0])

    driver = AshaDriver(
        client, reg, job, search, args.output, save, progress=progress,
        resumed=journal is not None, name=name, description=description, check=check,
        memory_configs=bounding_configs(reg, space, job, parsed.max_configs),
    )  # fmt: skip
    # the key of the search's checkpoints (its datasets' contents, workers, parameters): a
    # resume on other data would find none and train its models again from scratch
    identity = {"training": data_identity(job.train),
                "validation": data_identity(job.valid) if job.valid else None}  # fmt: skip
    keys.update(checkpoint_key=driver.key, checkpoint_data=identity)
    recorded = (running or {}).get("checkpoint_key")
    if journal is not None and recorded is not None and recorded != driver.key:
        was = (running or {}).get("checkpoint_data") or {}
        differ = sorted(
            f"{part}.{field}" for part in identity
            for field in {*(identity[part] or {}), *(was.get(part) or {})}
            if (identity[part] or {}).get(field) != (was.get(part) or {}).get(field)
        )  # fmt: skip
        raise ArgumentError(
            f"resume=True but search {args.output!r} was started on other datasets or "
            f"workers: its checkpoints are keyed {recorded!r}, these datasets and workers give "
            f"{driver.key!r} (differing: {', '.join(differ) or 'the workers'}). Received: "
            f"training_set={job.train.name!r} "
            f"({job.train.rows} rows on {[w.name for w in job.workers]}), validation_set="
            f"{job.valid.name if job.valid else None!r}. Resume on the data the search was "
            "started on (the same source, preprocessed the same way), or pass resume=False to "
            "start afresh."
        )
    return driver.run()


def _finished_asha(reg: Registry, model_output: str, parsed: Any) -> bool:
    """Whether ``model_output`` is a finished ASHA search with these parameters."""
    try:
        summary = reg.model_selection_run(model_output)["summary"]
    except RegistryNotFoundError:
        return False
    return (
        summary.get("automl_method") == "asha"
        and summary.get("status") == "finished"
        and summary.get("automl_params") == parsed.text()
    )


def _running_summary(reg: Registry, model_output: str) -> dict[str, Any] | None:
    """The run summary (its journal, its checkpoints' key) of the unfinished ASHA search
    ``model_output``, if there is one."""
    try:
        summary = reg.model_selection_run(model_output)["summary"]
    except RegistryNotFoundError:
        return None
    if summary.get("automl_method") != "asha" or summary.get("status") != "running":
        return None
    return dict(summary)


def _most_iterations(parsed: Any) -> int:
    """The most iterations one step of the search trains (a job's ``num_iterations``)."""
    if isinstance(parsed, AshaParams):
        return parsed.max_t
    if isinstance(parsed, HyperbandParams):
        return parsed.R
    return int(parsed.num_iterations)


def _hop_search(
    reg: Registry,
    client: Client,
    args: JobArgs,
    space: SearchSpace,
    parsed: HyperbandParams | HyperoptParams,
    progress: bool,
    name: str | None,
    description: str | None,
    check: Callable[[], None],
) -> SearchOutcome:
    """Hyperband or hyperopt on one job of serving trainers (:class:`HopSearch`)."""
    job = place_job(reg, client, args)
    scheduler: hb.HyperbandRun | HyperoptRun
    if isinstance(parsed, HyperbandParams):
        scheduler = hb.HyperbandRun(parsed.R, parsed.eta, parsed.skip_last)
        count = scheduler.num_configs
    else:
        scheduler = HyperoptRun(space, parsed, len(job.workers), args.seed)
        count = parsed.num_configs
    check_suffixed_name(args.output, [f"_{k}" for k in range(1, count + 1)], "model_output")
    # admitted by the memory plan of the space's largest configurations (search_memory)
    bound = bounding_configs(reg, space, job, count)
    search = HopSearch(client, reg, job, args.output, scheduler.journal.header,
                       progress=progress, name=name, description=description,
                       memory_configs=bound)  # fmt: skip
    try:
        if isinstance(scheduler, hb.HyperbandRun):
            _hyperband(scheduler, space, args.seed, search, progress, check)
            columns = {k: {"s": scheduler.bracket_of[k], "i": scheduler.last_round[k]}
                       for k in scheduler.bracket_of}  # fmt: skip
        else:
            _hyperopt(scheduler, search, progress, check)
            columns = {}
    except BaseException:
        search.stop()
        raise
    return search.finish(columns, scheduler.journal.dumps(), None)  # ranked by .info


def _hyperband(
    search: hb.HyperbandRun,
    space: SearchSpace,
    seed: int | None,
    hop: HopSearch,
    progress: bool,
    check: Callable[[], None],
) -> None:
    """MADlib's diagonals: each one's survivors and new bracket trained together."""
    # The space's own seeded draws, as model_configs(search="random") draws (one engine).
    by_key = {c.mst_key: c for c in space.distinct_configs(search.num_configs, seed)}
    losses: dict[int, float | None] = {}
    _log_brackets(hop.client, hop.model_output, search, "running")
    while (diagonal := search.next_diagonal()) is not None:
        if progress:
            logger.warning(
                "automl hyperband: diagonal %d, %d configurations (%d new) for %d iterations",
                diagonal.i, len(diagonal.keys), len(diagonal.new_keys), diagonal.num_iterations,
            )  # fmt: skip
        found = hop.train([by_key[k] for k in diagonal.keys], diagonal.num_iterations,
                          diagonal.offset)  # fmt: skip
        losses.update(found)
        search.report(found)
        _log_brackets(hop.client, hop.model_output, search, "running")
        _progress(progress, losses)
        check()
    _log_brackets(hop.client, hop.model_output, search, "finished")


def _hyperopt(
    search: HyperoptRun, hop: HopSearch, progress: bool, check: Callable[[], None]
) -> None:
    """MADlib's batches: each trained from scratch, its losses told to the sampler."""
    losses: dict[int, float | None] = {}
    while (batch := search.next_batch()) is not None:
        if progress:
            logger.warning("automl hyperopt: evaluating %d newly suggested configurations",
                           len(batch.rows))  # fmt: skip
        rows = [cs.ModelConfig(*(r[c] for c in cs.COLUMNS)) for r in batch.rows]
        found = hop.train(rows, batch.num_iterations, 0)
        losses.update(found)
        search.report(found)
        _progress(progress, losses)
        check()


def _progress(progress: bool, losses: Mapping[int, float | None]) -> None:
    if not progress or not losses:
        return
    best = min(losses, key=lambda k: (hb.rank_key(losses[k]), k))
    logger.warning("automl: best so far mst_key=%s loss=%s", best, losses[best])


def _log_brackets(client: Client, output: str, search: hb.HyperbandRun, state: str) -> None:
    """Tell the scheduler where a Hyperband search stands (topic ``dvml-search-<output>``,
    for dvml's dashboard page: :meth:`~dvml.search.hyperband.HyperbandRun.brackets`). Best
    effort, as :func:`_log_journal`."""
    try:
        client.log_event(
            f"dvml-search-{output}", {"kind": "hyperband", "state": state, **search.brackets()}
        )
    except Exception:
        pass


def _log_journal(client: Client, output: str, records: list[dict[str, Any]], sent: int) -> int:
    """Tell the scheduler the journal's records from ``sent`` on (topic
    ``dvml-search-<output>``, for dvml's dashboard page); return how many are told. Best
    effort: the search goes on when the scheduler misses them."""
    if len(records) > sent:
        try:
            client.log_event(
                f"dvml-search-{output}",
                {"kind": "journal", "offset": sent, "records": records[sent:]},
            )
        except Exception:
            return sent
    return len(records)
