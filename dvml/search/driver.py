"""``dvml.automl``: MADlib's ``madlib_keras_automl`` (Hyperband, hyperopt) on ``fit_multiple``.

MADlib runs every step of a search as one ``fit_multiple`` call, with warm start for the
configurations that go on; so does this driver, on dvml's public :func:`dvml.fit_multiple`:

- ``method="hyperband"``: :class:`~dvml.search.hyperband.HyperbandRun` gives each diagonal;
  its configurations were sampled up front (MADlib's random ``generate_model_configs``, with
  ``mst_key`` 1..N, largest bracket first). A diagonal is one ``fit_multiple`` call for the
  survivors (``warm_start=True``: each goes on from its registered model for ``r`` more
  iterations) and one for the bracket that starts there (from scratch), as ``fit_multiple``'s
  warm start applies to a whole call. Survivors are ranked by validation loss, else training
  loss.
- ``method="hyperopt"``: :class:`~dvml.search.hyperopt_run.HyperoptRun` proposes MADlib's
  batches of as many configurations as there are workers (seeded random or Optuna's TPE); each
  batch is one ``fit_multiple`` call of ``num_iterations``, each loss told back to the sampler.

Every call registers its models as ``f"{model_output}_{mst_key}"`` (so ``dvml.evaluate``,
``predict`` and warm start work on any of them); at the end the driver writes MADlib's outputs
under ``model_output``: ``.info`` (every configuration, its metrics concatenated over the calls
as MADlib does, ``metrics_iters`` counted over the whole search, plus ``s`` and ``i`` for
Hyperband), ``.summary`` (with ``automl_method``, ``automl_params``, ``random_state`` and the
search's journal) and the one-row model selection table of the best configuration
(``f"{model_output}_best"``, loadable by name with ``dvml.load_model_configs``).

``method="asha"`` (dvml's, beyond MADlib) is :class:`~dvml.search.asha.Asha` driven on one
job of serving trainers that never restart (:mod:`dvml.search.asha_driver`): new
configurations join the running job on idle workers, promotions resume parked models from their
state, every decision is journaled in the registry before it is carried out, and
``resume=True`` continues a search whose client died from its last decision.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from dvml.cluster.workers import current_client
from dvml.exceptions import ArgumentError, RegistryNotFoundError
from dvml.names import check_name
from dvml.registry.database import Registry, open_registry
from dvml.search import hyperband as hb
from dvml.search.asha import Asha
from dvml.search.asha_driver import AshaDriver, SearchOutcome
from dvml.search.automl_params import (
    AshaParams,
    HyperbandParams,
    HyperoptParams,
    parse_automl_params,
)
from dvml.search.hyperopt_run import HyperoptRun
from dvml.search.search_space import SearchSpace
from dvml.store.datasets import Dataset, buffer_workers, resolve_dataset
from dvml.train import config_search as cs
from dvml.train.fit_multiple import ModelSelection, fit_multiple
from dvml.train.runtime.plan import JobArgs, place_job

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["AutoMLResult", "automl"]

logger = logging.getLogger("dvml.search")

# .info columns MADlib concatenates when a configuration trains again (warm start)
_APPENDED = (
    "metrics_elapsed_time",
    "training_metrics",
    "training_loss",
    "validation_metrics",
    "validation_loss",
)
_REPLACED = (
    "training_metrics_final",
    "training_loss_final",
    "validation_metrics_final",
    "validation_loss_final",
    "model_size",
)


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


def _merge(
    info: dict[int, dict[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    iteration_offset: int,
    seconds_offset: float,
) -> None:
    """Fold one ``fit_multiple`` call's info rows into the search's (MADlib's update)."""
    for new in rows:
        key = int(new["mst_key"])
        iters = [iteration_offset + int(m) for m in (new.get("metrics_iters") or [])]
        elapsed = [seconds_offset + float(t) for t in (new.get("metrics_elapsed_time") or [])]
        if key not in info:
            info[key] = {**new, "metrics_iters": iters, "metrics_elapsed_time": elapsed}
            continue
        old = info[key]
        for column in _APPENDED:
            added = elapsed if column == "metrics_elapsed_time" else new.get(column)
            old[column] = list(old.get(column) or []) + list(added or [])
        for column in _REPLACED:
            old[column] = new.get(column)
        old["metrics_iters"] = list(old.get("metrics_iters") or []) + iters
        for column in ("training_seconds", "moving_seconds"):
            old[column] = round(float(old.get(column) or 0) + float(new.get(column) or 0), 4)


def _worker_count(client: Client, training_set: str | Dataset) -> int:
    dataset = resolve_dataset(training_set, client)
    return len({w.name for w in buffer_workers(client, dataset)})


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
    progress: bool = True,
    resume: bool = False,
    registry: Registry | str | None = None,
    client: Client | None = None,
) -> AutoMLResult:
    """Search configurations with early stopping, MADlib's ``madlib_keras_automl``.

    Parameters
    ----------
    training_set, validation_set : str or Dataset
        As for :func:`dvml.fit_multiple`; configurations are ranked by the validation loss
        when there is a validation set, else by the training loss (never by the metric).
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
    metrics_compute_frequency, use_gpus, name, description, custom_objects
        As for :func:`dvml.fit_multiple` (a frequency larger than a call's iterations is
        dropped for that call, as MADlib does).
    progress : bool
        A line per decision, with the best configuration so far.
    resume : bool
        ``method="asha"`` only: continue the search ``model_output`` whose client died from the
        journal's last decision (each active model loses at most the iteration it was
        training); a finished one is returned as it is; one not found starts afresh.

    Returns
    -------
    AutoMLResult

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Before anything trains: an unknown method, MADlib's ``automl_params`` refusals, a bad
        grid or name.
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
    client = current_client(client)
    reg = open_registry(registry)
    if resume and _finished_asha(reg, model_output, parsed):
        return AutoMLResult(model_output, reg)  # nothing left to resume
    loss_column = "validation_loss_final" if validation_set is not None else "training_loss_final"
    common: dict[str, Any] = {
        "training_set": training_set,
        "model_output": model_output,
        "use_gpus": use_gpus,
        "validation_set": validation_set,
        "name": name,
        "description": description,
        "custom_objects": custom_objects,
        "progress": progress,
        "registry": reg,
        "client": client,
    }
    started = time.time()
    info: dict[int, dict[str, Any]] = {}
    summary: dict[str, Any] = {}

    def train(rows: list[cs.ModelConfig], iterations: int, warm: bool, offset: int) -> None:
        frequency = metrics_compute_frequency
        if frequency is not None and not 1 <= frequency <= iterations:
            frequency = None  # MADlib's _is_valid_metrics_compute_frequency
        run = fit_multiple(
            configs=[r.as_dict() for r in rows],
            num_iterations=iterations,
            metrics_compute_frequency=frequency,
            warm_start=warm,
            seed=seed,
            **common,
        )
        record = reg.model_selection_run(run.name)  # plain JSON values, None kept
        _merge(info, record["info"], offset, time.time() - started)
        summary.update(record["summary"])

    models: list[dict[str, Any]] = []
    best_key: int | None = None
    if isinstance(parsed, AshaParams):
        args = JobArgs(
            model_output, training_set, validation_set, parsed.max_t, metrics_compute_frequency,
            use_gpus, False, custom_objects, seed, None,
        )  # fmt: skip
        outcome = _asha(reg, client, args, space, parsed, resume, progress, name, description)
        info, models, best_key = outcome.info, outcome.models, outcome.best
        summary.update(outcome.summary)
        journal = {"text": outcome.journal}
    elif isinstance(parsed, HyperbandParams):
        journal = _hyperband(parsed, space, seed, info, train, loss_column, progress)
        for k, row in info.items():  # MADlib's .info columns s (bracket) and i (last round)
            row["s"], row["i"] = journal["bracket_of"][k], journal["last_round"][k]
    else:
        journal = _hyperopt(parsed, space, seed, info, train, loss_column, progress, client,
                            training_set)  # fmt: skip
    rows = [info[k] for k in sorted(info)]
    ranked = sorted(rows, key=lambda r: (hb.rank_key(_loss(r, loss_column)), r["mst_key"]))
    best = info[best_key] if best_key is not None else ranked[0]
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
        start_training_time=pd.Timestamp(started, unit="s").isoformat(),
        end_training_time=pd.Timestamp(time.time(), unit="s").isoformat(),
        journal=journal["text"],
        status="finished",
    )
    for column in ("num_iterations", "warm_start", "hops", "hop_workers"):
        summary.pop(column, None)  # one call's, not the search's
    reg.save_model_selection_run(model_output, models, rows, summary)
    best_row = {c: best[c] for c in cs.COLUMNS}
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
    return AutoMLResult(model_output, reg)


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
) -> SearchOutcome:
    """ASHA on one job of serving trainers; the journal saved in the registry as it goes."""
    job = place_job(reg, client, args)
    search = Asha(space, parsed, args.seed)
    journal = _running_journal(reg, args.output) if resume else None
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

    def save(text: str) -> None:
        reg.save_model_selection_run(
            args.output, [], [], {"automl_method": "asha", "status": "running",
                                  "automl_params": parsed.text(), "random_state": args.seed,
                                  "journal": text},
        )  # fmt: skip

    driver = AshaDriver(
        client, reg, job, search, args.output, save, progress=progress,
        resumed=journal is not None, name=name, description=description,
    )  # fmt: skip
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


def _running_journal(reg: Registry, model_output: str) -> str | None:
    """The journal of the unfinished ASHA search ``model_output``, if there is one."""
    try:
        summary = reg.model_selection_run(model_output)["summary"]
    except RegistryNotFoundError:
        return None
    if summary.get("automl_method") != "asha" or summary.get("status") != "running":
        return None
    return str(summary["journal"])


def _hyperband(
    parsed: HyperbandParams,
    space: SearchSpace,
    seed: int | None,
    info: dict[int, dict[str, Any]],
    train: Any,
    loss_column: str,
    progress: bool,
) -> dict[str, Any]:
    search = hb.HyperbandRun(parsed.R, parsed.eta, parsed.skip_last)
    g = space.grids()
    configs = cs.plan_configs(
        g["arch_ids"], g["compile_params_grid"], g["fit_params_grid"], "random",
        search.num_configs, seed, g["custom_names"],
    )  # fmt: skip
    by_key = {c.mst_key: c for c in configs}
    while (diagonal := search.next_diagonal()) is not None:
        if progress:
            logger.warning(
                "automl hyperband: diagonal %d, %d configurations (%d new) for %d iterations",
                diagonal.i, len(diagonal.keys), len(diagonal.new_keys), diagonal.num_iterations,
            )  # fmt: skip
        for keys, warm in ((diagonal.warm_keys, True), (diagonal.new_keys, False)):
            if keys:
                train([by_key[k] for k in keys], diagonal.num_iterations, warm, diagonal.offset)
        search.report({k: _loss(info[k], loss_column) for k in diagonal.keys})
        _progress(progress, info, loss_column)
    return {
        "text": search.journal.dumps(),
        "bracket_of": dict(search.bracket_of),
        "last_round": dict(search.last_round),
    }


def _hyperopt(
    parsed: HyperoptParams,
    space: SearchSpace,
    seed: int | None,
    info: dict[int, dict[str, Any]],
    train: Any,
    loss_column: str,
    progress: bool,
    client: Client,
    training_set: str | Dataset,
) -> dict[str, Any]:
    search = HyperoptRun(space, parsed, _worker_count(client, training_set), seed)
    while (batch := search.next_batch()) is not None:
        if progress:
            logger.warning("automl hyperopt: evaluating %d newly suggested configurations",
                           len(batch.rows))  # fmt: skip
        rows = [cs.ModelConfig(*(r[c] for c in cs.COLUMNS)) for r in batch.rows]
        train(rows, batch.num_iterations, False, 0)
        search.report({k: _loss(info[k], loss_column) for k in batch.keys})
        _progress(progress, info, loss_column)
    return {"text": search.journal.dumps()}


def _progress(progress: bool, info: Mapping[int, Mapping[str, Any]], column: str) -> None:
    if not progress or not info:
        return
    best = min(info.values(), key=lambda r: (hb.rank_key(_loss(r, column)), r["mst_key"]))
    logger.warning(
        "automl: best so far mst_key=%s %s=%s", best["mst_key"], column, _loss(best, column)
    )
