"""What the dvml page shows, as plain values: pure functions of the scheduler's workers and
the events dvml logs on it (no Dask, no I/O; tested without a cluster).

Events are ``(timestamp, message)`` pairs as :meth:`distributed.Scheduler.get_events` returns
them. Topics:

- ``dvml-datasets``: ``{"op": "publish", "name", "kind", "rows", "nbytes", "workers":
  {worker: {"rows", "nbytes"}}}`` and ``{"op": "drop", "name"}``, logged by the client that
  published or dropped (:mod:`dvml.store.publish`, :mod:`dvml.store.datasets`);
- ``dvml-fit-<job id>``: one training job. The client logs ``{"kind": "job", ...}`` when it
  starts the trainers and ``{"kind": "ended", "outcome"}`` when they are done; every trainer
  message (``Iteration`` among them) is logged by the worker that runs the trainer
  (:mod:`dvml.train.runtime.launch`), so its ``worker`` is the worker's address.
- ``dvml-hop-<job id>``: one model-hopper job (``fit_multiple``, the searches). The client
  logs ``job``, ``park`` (``mst_key``) and ``ended``; each hop's worker logs ``{"kind":
  "hop", "mst_key", "iteration", "worker", "fit_loss", "train_s", ...}``.
- ``dvml-search-<model output>``: an ASHA search's journal (:mod:`dvml.search.journal`), as
  ``{"kind": "journal", "offset", "records"}``: the records from ``offset`` on.
- ``dvml-models``: ``{"op": "save", "name", "at", "trained_by", "training", "validation",
  "warm_start"}`` for each model registered (:mod:`dvml.tracking.model_events`).

Besides the events, the page shows the memory reservations of the running jobs, as the
scheduler holds them (:mod:`dvml.train.fit_admission`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dvml.train.stragglers import by_iteration, cumulative, stragglers

DATASETS_TOPIC = "dvml-datasets"
"""The topic of datasets published and dropped."""

JOB_TOPIC_PREFIX = "dvml-fit-"
"""Every training job's topic starts with this (``dvml-fit-<job id>``; not ``-abort-``)."""

HOP_TOPIC_PREFIX = "dvml-hop-"
"""Every model-hopper job's topic starts with this."""

SEARCH_TOPIC_PREFIX = "dvml-search-"
"""Every ASHA search's topic starts with this."""

MODELS_TOPIC = "dvml-models"
"""The topic of models registered."""

RECENT_MODELS = 20
"""How many of the latest registered models the page lists."""

Events = Sequence[tuple[float, Any]]


def datasets_view(events: Events) -> list[dict[str, Any]]:
    """The datasets that exist, from their ``dvml-datasets`` events (replayed in order).

    Returns
    -------
    list of dict
        One per dataset, by name: ``name``, ``kind``, ``version``, ``rows``, ``nbytes``,
        ``published`` (the event's time) and ``workers`` (``{worker: {"rows", "nbytes"}}``).
    """
    live: dict[str, dict[str, Any]] = {}
    for at, message in events:
        if not isinstance(message, Mapping) or "name" not in message:
            continue
        if message.get("op") == "publish":
            live[message["name"]] = {
                "name": message["name"],
                "kind": message.get("kind"),
                "version": int(message.get("version") or 1),
                "rows": int(message.get("rows") or 0),
                "nbytes": int(message.get("nbytes") or 0),
                "published": at,
                "workers": dict(message.get("workers") or {}),
            }
        elif message.get("op") == "drop":
            live.pop(message["name"], None)
    return [live[name] for name in sorted(live)]


def workers_view(
    workers: Iterable[Mapping[str, Any]], datasets: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each worker with its vineyardd's bytes and the bytes of each dataset it holds.

    ``workers`` are plain dicts: ``name``, ``address``, ``host``, ``gpus`` and ``vineyard``
    (``{"used", "limit"}`` from the worker's heartbeat, or None before its first).
    """
    rows = []
    for w in workers:
        held = {
            d["name"]: int(d["workers"][w["name"]]["nbytes"])
            for d in datasets
            if w["name"] in d["workers"]
        }
        vineyard = w.get("vineyard") or {}
        rows.append(
            {
                "name": w["name"],
                "address": w["address"],
                "host": w.get("host"),
                "gpus": w.get("gpus", 0),
                "vineyard_used": vineyard.get("used"),
                "vineyard_limit": vineyard.get("limit"),
                "datasets": held,
            }
        )
    return sorted(rows, key=lambda r: str(r["name"]))


def jobs_view(
    topics: Mapping[str, Events], names: Mapping[str, str], now: float
) -> list[dict[str, Any]]:
    """Every training job the scheduler has events of, newest first.

    Parameters
    ----------
    topics : mapping
        Topic → its events; topics that are not a job's are ignored.
    names : mapping
        Worker address → worker name (a worker's ``log_event`` stamps its address).
    now : float
        The current time (seconds since the epoch), for a running job's elapsed time and ETA.

    Returns
    -------
    list of dict
        ``job`` (its id), ``model``, ``program``, ``sync``, ``num_iterations``, ``state``
        (``running``, ``done``, ``failed``), ``iteration`` (the last every trainer finished),
        ``elapsed``, ``eta_seconds`` (None until an iteration is done), ``trainers`` (per
        trainer: ``worker``, ``iteration``, ``steps``, ``step_seconds`` (its own input and
        compute per step over the run), ``waiting_step_seconds`` (per step in the averaging),
        ``peak_resident_bytes`` (its highest sample at an iteration's end, or None)) and
        ``straggler`` (the slowest trainer named by :mod:`dvml.train.stragglers`, or None).
    """
    jobs = [
        _job_view(topic[len(JOB_TOPIC_PREFIX) :], events, names, now)
        for topic, events in topics.items()
        if topic.startswith(JOB_TOPIC_PREFIX) and not topic.startswith("dvml-fit-abort-")
    ]
    return sorted(jobs, key=lambda j: -j["started"])


def _job_view(job_id: str, events: Events, names: Mapping[str, str], now: float) -> dict[str, Any]:
    start, ended, started, elapsed = _lifetime(events, now)
    iterations = []
    for _, m in events:
        if _kind(m) == "iteration":
            worker = names.get(str(m.get("worker")), str(m.get("worker")))
            iterations.append({**m, "worker": worker})
    per_iteration = by_iteration(iterations)
    totals = {t.worker: t for t in cumulative(per_iteration)}
    last: dict[str, int] = {}
    peak: dict[str, int] = {}  # the highest resident-bytes sample (train.runtime.memory_sample)
    for m in iterations:
        last[m["worker"]] = max(last.get(m["worker"], 0), int(m["iteration"]))
        if m.get("resident_bytes") is not None:
            peak[m["worker"]] = max(peak.get(m["worker"], 0), int(m["resident_bytes"]))
    workers = list(start.get("workers") or sorted(last))
    trainers = [
        {
            "worker": w,
            "iteration": last.get(w, 0),
            "steps": totals[w].steps if w in totals else 0,
            "step_seconds": totals[w].step_seconds if w in totals else None,
            "waiting_step_seconds": totals[w].waiting_step_seconds if w in totals else None,
            "peak_resident_bytes": peak.get(w),
        }
        for w in workers
    ]
    done = min((t["iteration"] for t in trainers), default=0)
    first = int(start.get("start_iteration") or 1)
    total = start.get("num_iterations")
    finished = done - first + 1
    eta = None
    if ended is None and total and finished > 0:
        eta = elapsed / finished * max(int(total) - done, 0)
    slow = stragglers(list(totals.values()))
    return {
        "job": job_id,
        "model": start.get("model"),
        "program": start.get("program"),
        "sync": start.get("sync"),
        "training": start.get("training"),
        "num_iterations": total,
        "state": "running" if ended is None else ended.get("outcome", "done"),
        "error": (ended or {}).get("error"),
        "started": started,
        "iteration": done,
        "elapsed": elapsed,
        "eta_seconds": eta,
        "trainers": trainers,
        "straggler": None if not slow else {"worker": slow[0].worker, "ratio": slow[0].ratio},
    }


def _lifetime(
    events: Events, now: float
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None, float, float]:
    """A job's first ``job`` event, its first ``ended`` event (None while it runs), when it
    started and how long it ran (until its end, or until ``now``)."""
    start: Mapping[str, Any] = next((m for _, m in events if _kind(m) == "job"), {})
    ended = next((m for _, m in events if _kind(m) == "ended"), None)
    started = float(start.get("started") or (events[0][0] if events else now))
    end_time = float(ended.get("at", now)) if ended else now
    return start, ended, started, max(end_time - started, 0.0)


def _kind(message: Any) -> Any:
    return message.get("kind") if isinstance(message, Mapping) else None


def hop_jobs_view(
    topics: Mapping[str, Events], names: Mapping[str, str], now: float
) -> list[dict[str, Any]]:
    """Every model-hopper job, newest first: ``job``, ``model`` (the job's name: the model
    output), ``state``, ``elapsed``, ``hops`` and ``models`` (per ``mst_key``: ``hops``,
    ``iteration``, the last ``worker`` and ``fit_loss``, ``train_s`` in all and ``state``:
    ``training``, ``parked`` or ``done``). ``names`` maps worker addresses to names (a
    worker's ``log_event`` stamps its address)."""
    jobs = []
    for topic, events in topics.items():
        if not topic.startswith(HOP_TOPIC_PREFIX):
            continue
        start, ended, started, elapsed = _lifetime(events, now)
        departed = [
            {"at": m.get("at", at), "workers": list(m.get("workers") or [])}
            for at, m in events
            if _kind(m) == "departed"
        ]
        models: dict[int, dict[str, Any]] = {}
        for _, m in events:
            if _kind(m) == "hop":
                model = models.setdefault(
                    int(m["mst_key"]), {"mst_key": int(m["mst_key"]), "hops": 0, "train_s": 0.0}
                )
                model["hops"] += 1
                model["train_s"] += float(m.get("train_s") or 0.0)
                model["iteration"] = max(int(m["iteration"]), model.get("iteration", 0))
                worker = names.get(str(m.get("worker")), m.get("worker"))
                model.update(worker=worker, fit_loss=m.get("fit_loss"), state="training")
            elif _kind(m) == "park" and int(m["mst_key"]) in models:
                models[int(m["mst_key"])]["state"] = "parked"
        if ended is not None:
            for model in models.values():
                model["state"] = "parked" if model["state"] == "parked" else "done"
        jobs.append(
            {
                "job": topic[len(HOP_TOPIC_PREFIX) :],
                "model": start.get("model"),
                "state": "running" if ended is None else ended.get("outcome", "done"),
                "started": started,
                "elapsed": elapsed,
                "workers": list(start.get("workers") or []),
                "departed": departed,
                "hops": sum(m["hops"] for m in models.values()),
                "models": [models[k] for k in sorted(models)],
            }
        )
    return sorted(jobs, key=lambda j: -j["started"])


_TRIAL_STATES = {"start": "running", "promote": "running", "park": "parked",
                 "finish": "finished", "fail": "failed"}  # fmt: skip


def searches_view(topics: Mapping[str, Events]) -> list[dict[str, Any]]:
    """Every ASHA and Hyperband search: ``model_output``, ``method``, ``state``, ``best``.

    An ASHA search, from its journal: ``state`` (``running`` until the scheduler's ``stop``),
    ``rungs`` (``{rung: results there, failed ones included}``, ASHA's rung sizes), ``best``
    (``trial``, ``loss``, ``rung``: the lowest loss at the highest rung that has one, as ASHA
    ranks; None before a result) and ``trials`` (per trial: ``state``, ``rung``,
    ``iterations`` trained, last ``loss`` and ``worker``).

    A Hyperband search, from its latest report (:meth:`dvml.search.hyperband.HyperbandRun.
    brackets`): ``state`` (``running`` or ``finished``), ``diagonal`` and ``diagonals`` (done,
    in all), ``best`` (``trial``: the ``mst_key``, ``loss``) and ``brackets`` (per bracket
    ``s`` that started: its ``round`` and ``rounds``, surviving ``keys``, the ``iterations``
    each has trained, the best ``loss`` among them).
    """
    found = []
    for topic, events in topics.items():
        if not topic.startswith(SEARCH_TOPIC_PREFIX):
            continue
        output = topic[len(SEARCH_TOPIC_PREFIX) :]
        reports = [m for _, m in events if _kind(m) == "hyperband"]
        if reports:
            found.append({"model_output": output, **_hyperband(reports[-1])})
            continue
        records: list[Any] = []
        for _, m in events:  # a resumed search tells its journal again from the start
            if _kind(m) == "journal":
                offset = int(m["offset"])
                records[offset:] = list(m["records"])
        found.append({"model_output": output, "method": "asha", **_search(records)})
    return sorted(found, key=lambda s: s["model_output"])


def _hyperband(report: Mapping[str, Any]) -> dict[str, Any]:
    best = report.get("best")
    return {
        "method": "hyperband",
        "state": str(report.get("state", "running")),
        "diagonal": int(report.get("done", 0)),
        "diagonals": int(report.get("diagonals", 0)),
        "best": None if best is None else {"trial": int(best), "loss": report.get("loss")},
        # lists come back as tuples from the scheduler's events (msgpack)
        "brackets": [{**b, "keys": list(b["keys"])} for b in report.get("brackets") or []],
        "rungs": {},
        "trials": [],
    }


def _search(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    trials: dict[int, dict[str, Any]] = {}
    outcomes: dict[int, list[tuple[int, float | None]]] = {}  # rung → (trial, loss)
    stopped = False

    def trial(data: Mapping[str, Any]) -> dict[str, Any]:
        k = int(data["trial_id"])
        return trials.setdefault(k, {"trial": k, "state": "queued", "rung": 0, "iterations": 0,
                                     "loss": None, "worker": None, "results": 0})  # fmt: skip

    for record in records:
        event, decision = record.get("event") or {}, record.get("decision") or {}
        if event.get("type") in ("result", "failure"):
            # each job trains a trial to its next rung: its k-th outcome is at rung k - 1
            t = trial(event)
            loss = event.get("loss") if event["type"] == "result" else None
            outcomes.setdefault(t["results"], []).append((t["trial"], loss))
            t["results"] += 1
            if event["type"] == "result":
                t.update(iterations=int(event["iterations"]), loss=loss)
            else:
                t["state"] = "failed"
        elif event.get("type") == "departed":
            for k in event.get("lost") or []:
                trial({"trial_id": k})["state"] = "failed"
        kind = decision.get("type")
        if kind in _TRIAL_STATES:
            t = trial(decision)
            t["state"] = _TRIAL_STATES[kind]
            if "rung" in decision:
                t["rung"] = int(decision["rung"])
            if decision.get("worker"):
                t["worker"] = decision["worker"]
        elif kind == "stop":
            stopped = True
    best = None  # as ASHA ranks: the lowest loss at the highest rung that has one
    for rung in sorted(outcomes, reverse=True):
        scored = [(loss, k) for k, loss in outcomes[rung] if loss is not None]
        if scored:
            loss, k = min(scored)
            best = {"trial": k, "loss": loss, "rung": rung}
            break
    return {
        "state": "stopped" if stopped else "running",
        "rungs": {str(r): len(outcomes[r]) for r in sorted(outcomes)},
        "best": best,
        "trials": [{k: v for k, v in trials[t].items() if k != "results"} for t in sorted(trials)],
    }


def faults_view(
    jobs: Sequence[Mapping[str, Any]], hop_jobs: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Faults as events, newest first: failed training jobs with their error, and workers that
    left a model-hopper job (``at``, ``job``, ``model``, ``what``)."""
    found = [
        {"at": j["started"] + j["elapsed"], "job": j["job"], "model": j["model"],
         "what": j.get("error") or "failed"}
        for j in jobs
        if j["state"] == "failed"
    ]  # fmt: skip
    for j in hop_jobs:
        for d in j.get("departed") or []:
            found.append({"at": d["at"], "job": j["job"], "model": j["model"],
                          "what": f"worker(s) {', '.join(d['workers'])} left"})  # fmt: skip
    return sorted(found, key=lambda f: -f["at"])


def models_view(events: Events, limit: int = RECENT_MODELS) -> list[dict[str, Any]]:
    """The ``limit`` latest registrations, newest first (a name registered again shows once,
    at its latest): ``name``, ``at``, ``trained_by``, ``training`` and ``validation`` (the
    dataset ``name``, ``version`` and ``content_digest`` its lineage records) and
    ``warm_start``."""
    latest: dict[str, dict[str, Any]] = {}
    for _, m in events:
        if isinstance(m, Mapping) and m.get("op") == "save":
            latest[str(m["name"])] = {k: v for k, v in m.items() if k != "op"}
    return sorted(latest.values(), key=lambda m: (-m["at"], m["name"]))[:limit]


def reservations_view(reservations: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The running jobs' memory reservations, oldest first: ``job``, ``since`` (ISO 8601),
    ``machines`` (``{machine: bytes reserved}``) and ``total`` bytes."""
    found = [
        {"job": r["job"], "since": r["since"], "machines": dict(r["machines"]),
         "total": sum(int(b) for b in r["machines"].values())}
        for r in reservations
    ]  # fmt: skip
    return sorted(found, key=lambda r: (r["since"], r["job"]))


def page_state(
    workers: Iterable[Mapping[str, Any]],
    topics: Mapping[str, Events],
    now: float,
    reservations: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Everything the page shows: ``workers``, ``datasets``, ``jobs`` (lock-step fits),
    ``hop_jobs`` (model hoppers), ``searches`` (ASHA), ``faults``, ``models`` (the latest
    registered) and ``reservations`` (memory held by running jobs), see the views."""
    datasets = datasets_view(topics.get(DATASETS_TOPIC, ()))
    listed = list(workers)
    names = {str(w["address"]): str(w["name"]) for w in listed}
    jobs, hop_jobs = jobs_view(topics, names, now), hop_jobs_view(topics, names, now)
    return {
        "time": now,
        "workers": workers_view(listed, datasets),
        "datasets": datasets,
        "jobs": jobs,
        "hop_jobs": hop_jobs,
        "searches": searches_view(topics),
        "faults": faults_view(jobs, hop_jobs),
        "models": models_view(topics.get(MODELS_TOPIC, ())),
        "reservations": reservations_view(reservations),
    }
