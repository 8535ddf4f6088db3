"""B23: a job's memory plan against what the job used, and the admission of jobs that do not fit.

B23a, plan accuracy: for each workload, the bytes it used (dvml side) against the bytes its
plan, computed before it started, said it would use (baseline side). Target: the ratio
within 10 % either way (above: a job can outgrow its plan and be killed; below: the plan
refuses jobs that would fit); the details give each worker's figures.

- B23a1, pack a table: Dask arrays of float32 features and integer labels, packed by
  :func:`dvml.training_preprocessor`: the plan's shared-memory bytes per vineyardd
  (:func:`dvml.plan.pack`) against the growth of each vineyardd's usage, as the vineyardd
  reports it.
- B23a2, pack images: uint8 images (the default, compact layout: uint8 pixels and class
  indices), the same figures.
- B23a3 and B23a4, ``dvml.fit`` with ``sync="iteration"`` and ``sync="step"``: each machine's
  planned resident bytes (:func:`dvml.plan.fit`: its trainers' and, once, the zygote's they
  are forked from) against its peak: each trainer's private bytes sampled at every
  iteration's end plus the zygote's resident set (the fit's summary, ``host_memory``).
- B23a5, ``dvml.fit_multiple`` of 3 configurations, 2 iterations: the same figures for its
  serving trainers (:func:`dvml.plan.fit_multiple`; the states parked in the Dask workers
  between hops are left out of both sides: nothing samples a Dask worker's share of them).
- B23a6, the feature cache (``dvml.features.cache`` of the B23a2 images, float32, with
  MobileNetV2 ``alpha=0.35``, seeded random weights, global average pooling, batch 64, on
  Dask workers that have not imported TensorFlow): the plan (:func:`dvml.plan.features`, made
  just before) against what the cache used: each vineyardd's growth plus each Dask worker's
  peak resident growth (``RssAnon + RssFile`` from ``/proc/self/status``, sampled every 5 ms
  by a thread in the worker from just before the cache to its end, less the value at the
  start; the vineyard pages it maps are left out, counted in their vineyardd). Both sides of
  a repeat read the same cache: whichever runs first runs it.

B23c, cost: a fit's wall (dvml side) against the same wall less what its planning and
accounting cost, measured directly (baseline): the plan, the reservation and its release, the
samples. Target: ratio <= 1.01 (planning and accounting add at most 1 %). Measured directly
because a 1 % difference between two walls is below this machine's noise.

B23b, admission: ten attempts at 1.2x to 3x oversubscription (four packs larger than the free
shared memory, four fits whose trainers do not fit the host's memory as configured by
``memory.host-memory``, two fits that fit alone but not beside a running fit's reservation):
the slowest refusal's seconds (dvml side) against 1 s (baseline).
Target: ratio <= 1. The details count the refusals, the bytes any vineyardd gained (0) and the
kernel's OOM kills meanwhile (``/proc/vmstat`` ``oom_kill``: 0).

One LocalCluster of 2 workers (vineyardds of 512 MiB; ``--quick``: 192 MiB), digits for the
fits (B4's CNN, 2 iterations).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from typing import Any

from benchmarks import _training as t
from benchmarks.harness import Benchmark, register

MiB = 1 << 20
SIZES = {False: (1 << 20, 512 * MiB), True: (1 << 16, 192 * MiB)}  # rows of B23a1, vineyardd
IMAGES = {False: 20_000, True: 2_000}
TABLE, PICTURES, DIGITS = "bench_b23_table", "bench_b23_images", "bench_b23_digits"
FEATURE_SOURCE, FEATURES = "bench_b23_fc_src", "bench_b23_features"
BACKBONE = {"application": "MobileNetV2", "kwargs": {"alpha": 0.35}, "seed": 0}
COMPILE = "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
FIT = "batch_size=64, epochs=1"
COST_FIT = "batch_size=256, epochs=4"  # B23c: B20's fit (one iteration)
ATTEMPTS = (1.2, 1.5, 2.0, 3.0)  # oversubscription of a pack, and of a fit alone
CONCURRENT = (1.2, 2.0)  # of a fit beside a running one: both fits' bytes over the room


def _table(rows: int) -> dict[str, Any]:
    import dask.array as da

    x = da.random.default_rng(23).random((rows, 64), chunks=(rows // 8, 64)).astype("float32")
    return {"x": x, "label": da.random.default_rng(24).integers(0, 10, rows, chunks=rows // 8)}


def _images(n: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(23)
    return {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "label": rng.integers(0, 10, n)}  # fmt: skip


def _usage(cluster: Any) -> dict[str, int]:
    """Each vineyardd's bytes in use, by one of its workers (a vineyardd once)."""
    table = cluster.status()
    seen: dict[str, int] = {}
    for socket, used in zip(table["vineyard_socket"], table["memory_used"], strict=True):
        seen.setdefault(str(socket), int(used or 0))
    return seen


def _pack_sides(kwargs_of: Any) -> tuple[Any, Any]:
    """The (used, planned) sides of a pack workload; ``kwargs_of(context)`` gives its call."""

    def used(context: dict[str, Any]) -> float:
        import dvml

        cluster, kwargs = context["cluster"], kwargs_of(context)
        before = _usage(cluster)
        dvml.training_preprocessor(client=cluster.client, **kwargs)
        after = _usage(cluster)
        grown = {s: after[s] - before.get(s, 0) for s in after}
        context["figures"].setdefault(kwargs["name"], {})["used"] = grown
        dvml.datasets.drop(kwargs["name"], client=cluster.client)
        return float(sum(grown.values()))

    def planned(context: dict[str, Any]) -> float:
        import dvml

        cluster, kwargs = context["cluster"], kwargs_of(context)
        plan = dvml.plan.pack(client=cluster.client, **kwargs)
        context["figures"].setdefault(kwargs["name"], {})["planned"] = plan
        return float(sum(row.needed for row in plan.rows))

    return used, planned


def _fit_sides(sync: str) -> tuple[Any, Any]:
    def used(context: dict[str, Any]) -> float:
        import dvml

        model = dvml.fit(DIGITS, f"bench_b23_{sync}", context["arch_id"], COMPILE, FIT,
                         num_iterations=2, sync=sync, registry=context["registry"],
                         client=context["cluster"].client)  # fmt: skip
        # per machine: its trainers' peaks and their zygote's, once (dvml.train.memory_use)
        memory = model.summary["host_memory"]
        context["figures"][f"fit {sync}"] = memory
        return float(sum(int(m["peak_bytes"] or 0) for m in memory.values()))

    def planned(context: dict[str, Any]) -> float:
        import dvml

        plan = dvml.plan.fit(DIGITS, context["arch_id"], COMPILE, FIT,
                             registry=context["registry"],
                             client=context["cluster"].client)  # fmt: skip
        return float(sum(host.needed for host in plan.hosts))  # the zygote's once per host

    return used, planned


def _hop_configs(arch_id: int) -> Any:
    import pandas as pd

    return pd.DataFrame([
        {"mst_key": k + 1, "model_id": arch_id, "fit_params": "batch_size=64, epochs=1",
         "compile_params": f"loss='categorical_crossentropy', optimizer='Adam(learning_rate="
                           f"{lr})', metrics=['accuracy']"}
        for k, lr in enumerate((0.003, 0.01, 0.001))
    ])  # fmt: skip


def _hop_used(context: dict[str, Any]) -> float:
    import dvml

    selection = dvml.fit_multiple(DIGITS, "bench_b23_hop", _hop_configs(context["arch_id"]), 2,
                                  progress=False, overwrite=True, registry=context["registry"],
                                  client=context["cluster"].client)  # fmt: skip
    memory = selection.summary["host_memory"]
    context["figures"]["fit_multiple"] = memory
    return float(sum(int(m["peak_bytes"] or 0) for m in memory.values()))


def _hop_planned(context: dict[str, Any]) -> float:
    import dvml

    plan = dvml.plan.fit_multiple(DIGITS, _hop_configs(context["arch_id"]),
                                  registry=context["registry"],
                                  client=context["cluster"].client)  # fmt: skip
    # what the trainer processes and their zygote sample (not the Dask workers' parked states)
    return float(sum(h.process_bytes for h in plan.hosts))


def _fit_wall(context: dict[str, Any]) -> float:
    """B23c's dvml side: the wall of a fit as B20's (B4's CNN on digits, one iteration of 4
    epochs, global batch 256), which plans, admits and reserves its memory and samples its
    trainers at every iteration's end. Both sides of a repeat read the same fit: whichever
    runs first runs it, the other takes its wall."""
    import dvml

    if "fit_wall" in context:
        return float(context.pop("fit_wall"))
    start = time.perf_counter()
    dvml.fit(DIGITS, "bench_b23_cost", context["arch_id"], COMPILE, COST_FIT, num_iterations=1,
             progress=False, overwrite=True, registry=context["registry"],
             client=context["cluster"].client)  # fmt: skip
    context["fit_wall"] = wall = time.perf_counter() - start
    return wall


def _fit_wall_without_the_plan(context: dict[str, Any]) -> float:
    """B23c's baseline: that wall less what planning and accounting cost, measured directly
    (the median of 5): the memory plan as the fit makes it (each host's room read from the
    workers' heartbeats, :func:`dvml.train.trainer_memory.fit_memory_plan`), the admission's
    reservation on the scheduler and its release, and the samples of its one iteration (each trainer
    samples in parallel; this process's sample stands for one). The placement and the
    model's parameters the plan reads are the fit's own work, with or without a plan: left
    out."""
    import statistics

    from dvml.registry.database import open_registry
    from dvml.train.fit_admission import admitted
    from dvml.train.runtime import memory_sample
    from dvml.train.runtime.plan import JobArgs, batch_split, model_spec, place_job
    from dvml.train.trainer_memory import fit_memory_plan

    client, registry = context["cluster"].client, open_registry(context["registry"])
    args = JobArgs("bench_b23_cost", DIGITS, None, 1, None, False, False, None, None, None)
    job = place_job(registry, client, args)
    spec = model_spec(registry, context["arch_id"], COMPILE, COST_FIT, job.train, [])
    per_worker, _ = batch_split(job.train, job.workers, int(spec.fit_params["batch_size"]))
    costs = []
    for _ in range(5):
        start = time.perf_counter()
        plan = fit_memory_plan(client, job.workers, per_worker, job.train.summary, spec.arch,
                               spec.compile_params, spec.weights)  # fmt: skip
        with admitted(client, plan, "bench_b23_cost", int(spec.fit_params["batch_size"])):
            pass
        memory_sample.sample()  # one iteration: one sample per trainer
        memory_sample.zygote_bytes()
        costs.append(time.perf_counter() - start)
    cost = statistics.median(costs)
    wall = _fit_wall(context)
    context["figures"]["cost"] = {
        "fit wall s": round(wall, 2),
        "plan and accounting s": round(cost, 4),
        "share %": round(100 * cost / wall, 3),
    }
    return wall - cost


def _rss_sampler_start() -> None:
    """In a Dask worker: start a thread sampling ``RssAnon + RssFile`` every 5 ms (B23a6)."""
    import sys
    import threading

    state = sys.__dict__.setdefault("_dvml_b23_rss", {})
    state.update(stop=False, base=_private_rss(), peak=_private_rss())

    def loop() -> None:
        while not state["stop"]:
            state["peak"] = max(state["peak"], _private_rss())
            time.sleep(0.005)

    state["thread"] = threading.Thread(target=loop, daemon=True, name="b23-rss")
    state["thread"].start()


def _rss_sampler_stop() -> int:
    """In a Dask worker: stop the sampler; its peak growth in bytes."""
    import sys

    state = sys.__dict__["_dvml_b23_rss"]
    state["stop"] = True
    state["thread"].join()
    return int(max(state["peak"], _private_rss()) - state["base"])


def _private_rss() -> int:
    found = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                found += int(line.split()[1]) * 1024
    return found


def _feature_cache(context: dict[str, Any]) -> tuple[float, float]:
    """B23a6: (used, planned) bytes of one feature cache, computed once per repeat."""
    import cloudpickle

    import dvml

    if "feature_sides" in context:
        return context.pop("feature_sides")  # type: ignore[no-any-return]
    cluster = context["cluster"]
    client = cluster.client
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the samplers, by value
    if not dvml.datasets.exists(FEATURE_SOURCE, client=client):  # packed once, not measured
        dvml.training_preprocessor(_images(context["images"]), y="label", x="image",
                                   normalizing_const=255.0, name=FEATURE_SOURCE,
                                   client=client)  # fmt: skip
    kwargs = {"pooling": "avg", "batch_size": 64, "client": client}
    plan = dvml.plan.features(FEATURE_SOURCE, BACKBONE, **kwargs)
    before = _usage(cluster)
    client.run(_rss_sampler_start)
    try:
        dvml.features.cache(FEATURE_SOURCE, BACKBONE, name=FEATURES, overwrite=True, **kwargs)
    finally:
        grown_rss = client.run(_rss_sampler_stop)
    after = _usage(cluster)
    shared = sum(after[s] - before.get(s, 0) for s in after)
    dvml.datasets.drop(FEATURES, client=client)
    resident = sum(grown_rss.values())
    planned_resident = sum(w.resident for w in plan.workers)
    context["figures"]["features"] = {
        "shared used MiB": round(shared / MiB, 2),
        "shared planned MiB": round(plan.shared / MiB, 2),
        "workers' peak growth MiB": ", ".join(f"{v / MiB:.0f}" for v in grown_rss.values()),
        "workers' planned growth MiB": ", ".join(f"{w.resident / MiB:.0f}" for w in plan.workers),
        "TensorFlow imported before": ", ".join(str(w.runtime == 0) for w in plan.workers),
    }
    sides = (float(shared + resident), float(plan.shared + planned_resident))
    context["feature_sides"] = sides
    return sides


def _features_used(context: dict[str, Any]) -> float:
    return _feature_cache(context)[0]


def _features_planned(context: dict[str, Any]) -> float:
    return _feature_cache(context)[1]


def _oom_kills() -> int:
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return 0


def _refused(attempt: Any) -> float:
    """Seconds until ``attempt()`` was refused with MemoryPlanError (it must be)."""
    from dvml.exceptions import MemoryPlanError

    start = time.perf_counter()
    try:
        attempt()
    except MemoryPlanError:
        return time.perf_counter() - start
    raise AssertionError("an oversubscribed job was admitted")


def admission(context: dict[str, Any]) -> float:
    """B23b's dvml side: the slowest of ten refusals (and the checks of what they left)."""
    import dask
    import dask.array as da

    import dvml

    cluster = context["cluster"]
    client = cluster.client
    before, kills = _usage(cluster), _oom_kills()
    free = sum(context["limit"] - used for used in before.values())
    row_bytes = 4 * 64 + 1  # the default (compact) layout: float32 x, a uint8 class index
    seconds = []
    for factor in ATTEMPTS:
        rows = int(factor * free / row_bytes)
        source = {"x": da.zeros((rows, 64), "float32", chunks=(rows // 4 + 1, 64)),
                  "y": da.zeros(rows, "int64", chunks=rows // 4 + 1)}  # fmt: skip
        seconds.append(_refused(lambda s=source: dvml.training_preprocessor(
            s, y="y", x="x", name="bench_b23_over", num_classes=10, client=client)))  # fmt: skip
    plan = dvml.plan.fit(DIGITS, context["arch_id"], COMPILE, FIT,
                         registry=context["registry"], client=client)  # fmt: skip
    per_host = max(h.with_margin for h in plan.hosts)
    for factor in ATTEMPTS:
        with dask.config.set({"dvml.memory.host-memory": int(per_host / factor)}):
            seconds.append(_refused(lambda: _over_fit(context)))
    seconds += _beside_a_running_fit(context, per_host)
    after = _usage(cluster)
    n = len(ATTEMPTS)
    packs, fits, beside = seconds[:n], seconds[n : 2 * n], seconds[2 * n :]
    context["admission"] = {
        "refused": f"{len(seconds)} of {2 * n + len(CONCURRENT)}",
        "bytes written by refused jobs": sum(after[s] - before.get(s, 0) for s in after),
        "OOM kills": _oom_kills() - kills,
        "pack refusals s": ", ".join(f"{v:.2f}" for v in packs),
        "fit refusals s": ", ".join(f"{v:.2f}" for v in fits),
        "refusals beside a running fit s": ", ".join(f"{v:.2f}" for v in beside),
    }
    return max(seconds)


def _over_fit(context: dict[str, Any]) -> Any:
    import dvml

    return dvml.fit(DIGITS, "bench_b23_over", context["arch_id"], COMPILE, FIT, num_iterations=1,
                    registry=context["registry"], client=context["cluster"].client)  # fmt: skip


def _beside_a_running_fit(context: dict[str, Any], per_host: int) -> list[float]:
    """Fits that fit alone but not beside a running fit (the room capped at 2 plans over
    each factor of :data:`CONCURRENT`), each refused while that fit holds its reservation."""
    import threading

    import dask

    import dvml
    from dvml.train.fit_admission import read_reservations

    client = context["cluster"].client
    failed: list[BaseException] = []

    def running() -> None:
        try:
            dvml.fit(DIGITS, "bench_b23_running", context["arch_id"], COMPILE, FIT,
                     num_iterations=3, overwrite=True, progress=False,
                     registry=context["registry"], client=client)  # fmt: skip
        except BaseException as exc:  # told below: the benchmark needs that fit
            failed.append(exc)

    thread = threading.Thread(target=running, name="b23b-running-fit")
    thread.start()
    deadline = time.monotonic() + 120
    while not read_reservations(client) and not failed and time.monotonic() < deadline:
        time.sleep(0.05)
    seconds = []
    try:
        for factor in CONCURRENT:
            if not thread.is_alive() or not read_reservations(client):
                raise RuntimeError(f"B23b: the running fit ended before its refusals: {failed}")
            with dask.config.set({"dvml.memory.host-memory": int(2 * per_host / factor)}):
                seconds.append(_refused(lambda: _over_fit(context)))
    finally:
        thread.join()
    if failed:
        raise RuntimeError(f"B23b: the running fit failed: {failed[0]!r}") from failed[0]
    return seconds


def prepare(quick: bool) -> dict[str, Any]:
    import dvml
    from benchmarks import b4_end_to_end as b4
    from dvml.examples import digits_cnn_json

    rows, memory = SIZES[quick]
    cluster = t.start_cluster(2, memory)
    context: dict[str, Any] = {"cluster": cluster, "rows": rows, "images": IMAGES[quick],
                               "limit": memory, "figures": {}}  # fmt: skip
    try:
        context["directory"] = tempfile.mkdtemp(prefix="dvml-bench-b23-")
        context["registry"] = dvml.Registry(f"sqlite:///{context['directory']}/registry.db")
        context["arch_id"] = dvml.load_keras_model(digits_cnn_json(), name="digits-cnn",
                                                   registry=context["registry"])  # fmt: skip
        train, _ = b4.digits_frames(2 if quick else 8)
        dvml.training_preprocessor(train, y="label", x="pixels", normalizing_const=16.0,
                                   name=DIGITS, client=cluster.client)  # fmt: skip
    except BaseException:
        cleanup(context)
        raise
    return context


def cleanup(context: dict[str, Any]) -> None:
    import shutil

    registry = context.get("registry")
    if registry is not None:
        registry.close()
    with contextlib.suppress(Exception):
        context["cluster"].close()
    if context.get("directory"):
        shutil.rmtree(context["directory"], ignore_errors=True)


def _details_of(name: str) -> Any:
    """The details of the row whose figures ``context["figures"][name]`` holds."""

    def details(context: dict[str, Any]) -> dict[str, Any]:
        figures = context["figures"].get(name) or {}
        if name.startswith("fit"):
            return {
                host: f"peak {int(m['peak_bytes'] or 0) / MiB:.0f} MiB (its zygote "
                f"{int(m['zygote_peak_bytes'] or 0) / MiB:.0f} MiB), planned "
                f"{int(m['planned_bytes']) / MiB:.0f} MiB "
                f"({int(m['peak_bytes'] or 0) / int(m['planned_bytes']):.2f})"
                for host, m in sorted(figures.items())
            }
        if "used" in figures and "planned" in figures:
            planned = {row.instance_id: row.needed for row in figures["planned"].rows}
            return {"planned MiB": sum(planned.values()) / MiB,
                    "used MiB": sum(figures["used"].values()) / MiB}  # fmt: skip
        if name in ("cost", "features"):
            return dict(figures)
        return dict(context.get("admission", {}))

    return details


def _one_s(context: dict[str, Any]) -> float:
    return 1.0


_TABLE_USED, _TABLE_PLANNED = _pack_sides(
    lambda c: {"source": _table(c["rows"]), "y": "label", "x": "x", "name": TABLE}
)
_IMAGES_USED, _IMAGES_PLANNED = _pack_sides(
    lambda c: {
        "source": _images(c["images"]),
        "y": "label",
        "x": "image",
        "normalizing_const": 255.0,
        "name": PICTURES,
    }
)
_ITERATION_USED, _ITERATION_PLANNED = _fit_sides("iteration")
_STEP_USED, _STEP_PLANNED = _fit_sides("step")

for _key, _title, _used, _planned, _name in (
    ("B23a1", "pack a table: shared memory used vs planned", _TABLE_USED, _TABLE_PLANNED,
     TABLE),
    ("B23a2", "pack uint8 images: shared memory used vs planned", _IMAGES_USED,
     _IMAGES_PLANNED, PICTURES),
    ("B23a3", "fit, sync='iteration': trainers' peak resident bytes vs planned",
     _ITERATION_USED, _ITERATION_PLANNED, "fit iteration"),
    ("B23a4", "fit, sync='step': trainers' peak resident bytes vs planned", _STEP_USED,
     _STEP_PLANNED, "fit step"),
    ("B23a5", "fit_multiple (3 configurations): trainers' peak resident bytes vs planned",
     _hop_used, _hop_planned, "fit_multiple"),
    ("B23a6", "feature cache: shared memory and Dask workers' peak growth vs planned",
     _features_used, _features_planned, "features"),
    ("B23c", "a fit's wall vs the same less its planning and accounting", _fit_wall,
     _fit_wall_without_the_plan, "cost"),
    ("B23b", "slowest refusal of 10 oversubscribed jobs vs 1 s", admission, _one_s,
     "admission"),
):  # fmt: skip
    register(Benchmark(_key, _title, "B" if _key.startswith("B23a") else "s", _used, _planned,
                       {"B23b": 1.0, "B23c": 1.01}.get(_key, 1.1),
                       target_op="within" if _key.startswith("B23a") else "<=", prepare=prepare,
                       cleanup=cleanup, details=_details_of(_name)))  # fmt: skip
