"""The memory plan that ``--dry-run`` of ``dvml fit`` / ``dvml fit-multiple`` prints.

A dry run starts nothing and writes nothing: it plans on a cluster that already runs
(``--scheduler``, the job file's ``cluster.scheduler``, else the one ``dvml cluster up``
recorded), never on a LocalCluster it would have to start. On it:

- the pack of the job's training data (``dvml.plan.pack``'s arithmetic: the preprocessor
  reads the source and stops at its plan, before any buffer is written);
- the trainers (``dvml.plan.fit`` / ``dvml.plan.fit_multiple``), from the layout of the job's
  training set as it stands (``<name>-train``, which the run replaces with the same split);
  its architectures are registered in a registry in memory for the plan, so nothing is
  written to the job's registry (a ``from_selection`` model or a stored configuration table
  is read from it).

What cannot be planned is said, with why, and the dry run still exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dvml.cli._common import format_table

__all__ = ["print_memory_plan"]

DRY_RUN_CONNECT_S = 5.0
"""Seconds a dry run waits for the scheduler it plans on."""

_PACK_COLUMNS = ["instance_id", "workers", "needed", "free", "limit", "usage", "replaced", "fits"]
_TRAINER_COLUMNS = [
    "worker", "host", "batch", "runtime", "weights", "models", "batches", "evaluation", "parked",
    "total", "host_needed", "host_room", "fits",
]  # fmt: skip


def _running_scheduler(args: argparse.Namespace, section: Mapping[str, Any]) -> str | None:
    """The scheduler the job would attach to, if one runs; None when the job would start a
    LocalCluster or none is recorded."""
    from dvml.cli._common import state_dir_of
    from dvml.exceptions import ClusterError
    from dvml.jobs.job_cluster import recorded_scheduler

    address = args.scheduler or section.get("scheduler")
    if address or section.get("local") is not None:
        return address or None
    try:
        return recorded_scheduler(state_dir_of(args))
    except ClusterError:
        return None


def _sizes(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    from dvml.placement.memory import format_size

    return [{k: format_size(int(v)) if k in keys else v for k, v in r.items()} for r in rows]


@contextlib.contextmanager
def _registry_for_plan(url: str | None) -> Iterator[Any]:
    """The job's registry when it exists (read only here), else None; never created."""
    from dvml import config
    from dvml.registry import Registry

    url = url or config.registry_url()
    if url.startswith("sqlite:///") and not pathlib.Path(url[10:]).exists():
        yield None  # opening it would create it
        return
    with Registry(url) as registry:
        yield registry


def print_memory_plan(
    args: argparse.Namespace,
    job: dict[str, Any],
    base: Any,
    source: Any,
    trainers: Callable[[Any, Any, Any, str], Any],
) -> None:
    """Print the job's memory plan (see the module's docstring): the pack's table, then the
    trainers' (``trainers(client, memory_registry, job_registry, train_name)`` returns the
    plan)."""
    from dvml.jobs.data import dataset_names, prepare_datasets
    from dvml.jobs.job_cluster import open_cluster

    print("Memory plan (dry run: no trainer started, nothing written):")
    address = _running_scheduler(args, job["cluster"])
    if address is None:
        print("  - not computed: it is planned on a running cluster, and this job would start "
              "its own (cluster.local) or none is running. Start one with `dvml cluster up` "
              "(or pass --scheduler ADDR) and run the dry run again.")  # fmt: skip
        return
    from dvml.preprocess.admission import Planned, planning_only
    from dvml.registry import Registry
    from dvml.store.datasets import exists

    train_name = dataset_names(job["name"])[0]
    # A dry run is a quick look: a scheduler that does not answer within a few seconds is said
    # at once rather than after the job's own connect timeout (30 s by default).
    section = {**job["cluster"], "local": None, "timeout": DRY_RUN_CONNECT_S}
    with open_cluster(section, address) as cluster:
        client = cluster.client
        try:
            with planning_only():
                prepare_datasets(job, client, base, source)
            print("  - pack: not planned (the preprocessor did not stop at its plan)")
        except Planned as planned:
            pack = planned.plan
            print(f"  - pack of {train_name} into shared memory: "
                  f"{'fits' if pack.fits else 'does NOT fit'}")  # fmt: skip
            table = pack.table().to_dict(orient="records")
            print(format_table(_sizes(table, ("needed", "free", "limit", "usage", "replaced")),
                               [c for c in _PACK_COLUMNS if table and c in table[0]]))  # fmt: skip
            for fix in pack.fixes:
                print(f"    fix: {fix}")
        if not exists(train_name, client=client):
            print(f"  - trainers: planned from the layout of {train_name!r}, which does not "
                  "exist yet: run the job once (its pack makes it), then dry runs plan "
                  "them")  # fmt: skip
            return
        registry_url = args.registry or job["registry"]
        with Registry("sqlite://") as memory, _registry_for_plan(registry_url) as stored:
            try:
                plan = trainers(client, memory, stored, train_name)
            except Exception as exc:  # a plan that cannot be made is said, not raised
                print(f"  - trainers: not planned: {type(exc).__name__}: {exc}")
                return
    print(f"  - trainers on {train_name}'s layout: {'fit' if plan.fits else 'do NOT fit'} "
          "their hosts")  # fmt: skip
    rows = plan.table().to_dict(orient="records")
    sized = ("runtime", "weights", "models", "batches", "evaluation", "parked", "total",
             "host_needed", "host_room")  # fmt: skip
    print(format_table(_sizes(rows, sized), _TRAINER_COLUMNS))
    for fix in plan.fixes:
        print(f"    fix: {fix}")
    for note in plan.notes:
        print(f"    note: {note}")


def memory_architecture(spec: Any, memory: Any, stored: Any, base: Any) -> int:
    """The id in the in-memory registry ``memory`` of the job's architecture ``spec``: an id
    of the job's registry ``stored`` (copied, with its weights), else ``builtin:...`` or a
    JSON file (registered there)."""
    from dvml.exceptions import ConfigError
    from dvml.jobs.models import architecture_id

    if isinstance(spec, int) or str(spec).strip().isdigit():
        if stored is None:
            raise ConfigError(
                f"The architecture id {spec} is in the job's registry, which does not exist "
                "yet. Received: a registry that was never written. Register it first."
            )
        arch = stored.get_architecture(int(spec))
        return int(memory.add_architecture(arch["model_json"], arch.get("weights"),
                                           name=f"plan-{spec}"))  # fmt: skip
    return architecture_id(spec, memory, base)
