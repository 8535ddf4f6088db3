"""The memory plan of a feature cache: the features each vineyardd receives, and the growth of
each Dask worker that runs the backbone, against its host's room.

Pure: plain values in (each worker's buffers' rows, its vineyardd and host, whether TensorFlow
is already imported in it; the backbone's sizes; each vineyardd's and host's room), a
:class:`FeatureMemoryPlan` out. :mod:`dvml.features.cache_memory` gathers the rooms and refuses
a cache that does not fit before any feature is written.

A feature cache (:func:`dvml.features.cache`) runs its backbone INSIDE the Dask workers that
hold the images (:func:`dvml.features.featurize.featurize_buffer`), one buffer per task, and
puts each buffer's features beside its images. What it takes:

- **shared memory**, per vineyardd: each row's features (the extractor's output, pooling
  included, float32) and its labels (one-hot float32, whatever the source's layout), put in
  place of nothing else: exactly ``rows x (feature values + label values) x 4`` bytes. A raw
  source is packed first: its buffers' bytes (``source``) come on top until the cache is
  published, when the packed source is dropped;
- **the Dask worker's resident growth**, per worker (a peak: what it holds while its largest
  buffer is featurized):

  - *runtime*: TensorFlow and tf-keras imported into the worker and one extractor run
    (:data:`FEATURIZE_RUNTIME_BYTES`, config ``dvml.memory.featurize-runtime``); 0 when the
    worker has imported TensorFlow already (an earlier cache, a prediction);
  - *weights*: the extractor's parameters, float32, twice: the built model's variables and
    the weights shipped to the worker in its spec (held while the cache runs);
  - *batch*: one backbone batch's activations, every layer's output (``batch x the sum of the
    layers' output values x 4``), and its input as a float32 tensor (twice for a compact
    source: its uint8 pixels are converted first);
  - *buffer*: the largest buffer's features (and, for a compact source, its one-hot labels),
    built in the worker before they are copied into shared memory.

A worker's growth does not depend on how many buffers it featurizes (one at a time); the
shared memory does not depend on ``batch_size``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dvml.placement.fit_memory import HostRoom, room_line
from dvml.placement.memory import PlanRow, VineyarddRoom, format_size

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FEATURIZE_RUNTIME_BYTES",
    "BackboneSize",
    "FeatureHostRow",
    "FeatureMemoryPlan",
    "FeatureTarget",
    "FeatureWorker",
    "plan_features",
]

_MiB = 2**20
_FLOAT = 4  # features, labels, weights and activations are float32

#: Resident growth of a Dask worker that imports TensorFlow 2.21 and tf-keras and runs a tiny
#: extractor over one buffer (CPU; ``RssAnon + RssFile``, peak sampled every 5 ms during the
#: cache: measured 585-605 MiB in 6 workers, less the extractor's own few MiB), rounded up. Config
#: ``dvml.memory.featurize-runtime``.
FEATURIZE_RUNTIME_BYTES = 600 * _MiB


@dataclasses.dataclass(frozen=True)
class BackboneSize:
    """What the plan reads from a checked backbone (:class:`dvml.features.backbone.Backbone`).

    Attributes
    ----------
    params : int
        The extractor's parameters.
    activations_per_row : int
        The values its layers output per row, summed over the layers.
    input_values, feature_values, label_values : int
        Values of one row's image, features and one-hot labels.
    """

    params: int
    activations_per_row: int
    input_values: int
    feature_values: int
    label_values: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one cached row in shared memory: features and one-hot labels."""
        return _FLOAT * (self.feature_values + self.label_values)


@dataclasses.dataclass(frozen=True)
class FeatureTarget:
    """One worker that featurizes buffers: its host, vineyard instance, the rows of each of its
    buffers, whether TensorFlow is imported in it already, and the bytes of a raw source packed
    into its vineyardd first (0 for a packed dataset)."""

    worker: str
    host: str
    instance_id: int
    buffer_rows: tuple[int, ...]
    tf_imported: bool = False
    source_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class FeatureWorker:
    """One worker's planned bytes (see the module's docstring)."""

    worker: str
    host: str
    instance_id: int
    rows: int
    batch: int  # rows of its largest backbone batch
    features: int  # shared memory: its features and labels
    source: int  # shared memory: a raw source packed first
    runtime: int
    weights: int
    batches: int
    buffer: int

    @property
    def shared(self) -> int:
        return self.features + self.source

    @property
    def resident(self) -> int:
        """The Dask worker's planned growth."""
        return self.runtime + self.weights + self.batches + self.buffer


@dataclasses.dataclass(frozen=True)
class FeatureHostRow:
    """One host (machine): its featurizing workers' growth, with the margin, against its room."""

    host: str
    workers: tuple[FeatureWorker, ...]
    room: HostRoom
    margin: float

    @property
    def needed(self) -> int:
        return sum(w.resident for w in self.workers)

    @property
    def with_margin(self) -> int:
        return math.ceil(self.needed * (1 + self.margin))

    @property
    def fits(self) -> bool:
        return self.with_margin <= self.room.room

    def line(self) -> str:
        what = f"{len(self.workers)} Dask worker(s) grow by"
        return room_line(self.host, what, self.needed, self.with_margin, self.margin, self.room)


@dataclasses.dataclass(frozen=True)
class FeatureMemoryPlan:
    """A feature cache's shared memory per vineyardd and workers' growth per host.

    Attributes
    ----------
    vineyardds : tuple of PlanRow
        One per vineyardd that receives features (``needed``: features, labels and a raw
        source's buffers).
    hosts : tuple of FeatureHostRow
        One per host whose workers run the backbone.
    row_bytes : int
        Bytes of one cached row (features and labels).
    fixes, notes : tuple of str
        What would make it fit (empty when it fits); what the plan assumed.
    """

    vineyardds: tuple[PlanRow, ...]
    hosts: tuple[FeatureHostRow, ...]
    row_bytes: int
    fixes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.vineyardds) and all(h.fits for h in self.hosts)

    @property
    def workers(self) -> tuple[FeatureWorker, ...]:
        return tuple(w for h in self.hosts for w in h.workers)

    @property
    def shared(self) -> int:
        """Bytes of the whole cache in shared memory (features and labels)."""
        return sum(w.features for w in self.workers)

    def table(self) -> pd.DataFrame:
        """One row per worker: its shared bytes, its growth by part, and its rooms."""
        import pandas as pd

        vineyardd = {r.instance_id: r for r in self.vineyardds}
        columns = ["worker", "host", "instance_id", "rows", "batch", "features", "source",
                   "runtime", "weights", "batches", "buffer", "resident", "vineyardd_free",
                   "host_needed", "host_room", "fits"]  # fmt: skip
        return pd.DataFrame(
            [
                {**{k: getattr(w, k) for k in columns[:11]}, "resident": w.resident,
                 "vineyardd_free": vineyardd[w.instance_id].free, "host_needed": h.with_margin,
                 "host_room": h.room.room, "fits": h.fits and vineyardd[w.instance_id].fits}
                for h in self.hosts for w in h.workers
            ],
            columns=columns,
        )  # fmt: skip

    def describe(self) -> str:
        """The plan in words: the shared memory per vineyardd, each host and worker, the
        fixes and notes."""
        lines = ["Shared memory (features and one-hot labels, float32):"]
        lines.extend(f"  {r.line()}" for r in self.vineyardds)
        lines.append("The Dask workers that run the backbone:")
        for h in self.hosts:
            lines.append(f"  {h.line()}")
            lines.extend(
                f"    {w.worker}: {format_size(w.resident)} = TensorFlow's runtime "
                f"{format_size(w.runtime)} + the backbone's weights {format_size(w.weights)} + a "
                f"{w.batch}-row batch's activations {format_size(w.batches)} + its largest "
                f"buffer's features {format_size(w.buffer)}"
                for w in h.workers
            )
        if self.fixes:
            lines.append("What would make it fit:")
            lines.extend(f"  - {fix}" for fix in self.fixes)
        lines.extend(f"Note: {n}" for n in self.notes)
        return "\n".join(lines)


def plan_features(
    targets: Sequence[FeatureTarget],
    backbone: BackboneSize,
    batch_size: int,
    vineyardds: Sequence[VineyarddRoom],
    rooms: Sequence[HostRoom],
    *,
    compact: bool = False,
    runtime: int = FEATURIZE_RUNTIME_BYTES,
    margin: float = 0.2,
    pooled_values: int | None = None,
) -> FeatureMemoryPlan:
    """The memory plan of a feature cache (see the module's docstring for what it counts).

    Parameters
    ----------
    targets : sequence of FeatureTarget
        One per worker that holds buffers of the source.
    backbone : BackboneSize
        The extractor's sizes.
    batch_size : int
        Images per backbone batch (capped by a buffer's rows).
    vineyardds : sequence of VineyarddRoom
        The status of every vineyardd that ``targets`` name.
    rooms : sequence of HostRoom
        One per host that ``targets`` name.
    compact : bool
        The source is stored compact (uint8 pixels, class indices): each batch is converted
        to float32 and each buffer's labels one-hot encoded in the worker.
    runtime : int
        Bytes of TensorFlow's runtime in a Dask worker that has not imported it.
    margin : float
        Fraction added to each host's sum before it is compared with its room.
    pooled_values : int, optional
        Values per row with pooling, when the features are unpooled maps: offered as a fix.
    """
    from dvml.exceptions import ArgumentError

    by_id = {r.instance_id: r for r in vineyardds}
    by_host = {r.host: r for r in rooms}
    missing = sorted({t.instance_id for t in targets} - set(by_id)) + sorted(
        {t.host for t in targets} - set(by_host)
    )
    if missing or not targets or int(batch_size) < 1:
        raise ArgumentError(
            "A feature cache's plan needs at least one worker, a batch_size of at least 1 and "
            "the room of every vineyardd and host its workers name. Received: "
            f"{len(targets)} workers, batch_size={batch_size}, missing rooms for {missing}."
        )
    workers = [_worker(t, backbone, int(batch_size), compact, runtime) for t in targets]
    shared: dict[int, list[FeatureWorker]] = {}
    hosts: dict[str, list[FeatureWorker]] = {}
    for w in workers:
        shared.setdefault(w.instance_id, []).append(w)
        hosts.setdefault(w.host, []).append(w)
    plan = FeatureMemoryPlan(
        vineyardds=tuple(
            PlanRow(iid, tuple(w.worker for w in ws), sum(w.shared for w in ws),
                    by_id[iid].free, by_id[iid].limit, by_id[iid].usage)
            for iid, ws in shared.items()
        ),
        hosts=tuple(FeatureHostRow(h, tuple(ws), by_host[h], margin) for h, ws in hosts.items()),
        row_bytes=backbone.row_bytes,
        notes=tuple(_notes(workers)),
    )  # fmt: skip
    if plan.fits:
        return plan
    return dataclasses.replace(plan, fixes=tuple(_fixes(plan, backbone, pooled_values)))


def _worker(t: FeatureTarget, bb: BackboneSize, batch_size: int, compact: bool,
            runtime: int) -> FeatureWorker:  # fmt: skip
    largest = max(t.buffer_rows, default=0)
    batch = min(batch_size, largest)
    inputs = bb.input_values * (2 if compact else 1)
    buffer_values = bb.feature_values + (bb.label_values if compact else 0)
    return FeatureWorker(
        worker=t.worker, host=t.host, instance_id=t.instance_id, rows=sum(t.buffer_rows),
        batch=batch, features=sum(t.buffer_rows) * bb.row_bytes, source=int(t.source_bytes),
        runtime=0 if t.tf_imported else int(runtime), weights=2 * _FLOAT * bb.params,
        batches=batch * _FLOAT * (inputs + bb.activations_per_row),
        buffer=largest * _FLOAT * buffer_values,
    )  # fmt: skip


def _notes(workers: Sequence[FeatureWorker]) -> list[str]:
    notes = []
    if any(w.runtime == 0 for w in workers):
        notes.append("workers that imported TensorFlow already (an earlier cache or prediction) "
                     "count no runtime")  # fmt: skip
    if any(w.source for w in workers):
        notes.append("the raw source is packed into shared memory first (the 'source' bytes) "
                     "and dropped once the features are published")  # fmt: skip
    return notes


def _fixes(plan: FeatureMemoryPlan, bb: BackboneSize, pooled: int | None) -> list[str]:
    fixes = []
    short = [r for r in plan.vineyardds if not r.fits]
    if short:
        at_least = -(-max(r.usage + r.needed for r in short) // _MiB) * _MiB
        fixes.append(
            f"a larger vineyard_memory: at least {format_size(at_least)} per vineyardd (its "
            "usage now plus what this cache writes into the fullest one)"
        )
        fixes.append(
            "more workers holding the images (pack the source over more workers with "
            "distribution_rules), so each vineyardd holds fewer rows' features"
        )
        if pooled is not None and pooled < bb.feature_values:
            fixes.append(
                f"pooling='avg' (or 'max'): {pooled} values per row instead of "
                f"{bb.feature_values}, {pooled / bb.feature_values:.3f}x the features' bytes"
            )
        fixes.append("drop datasets these vineyardds hold (dvml datasets list / drop)")
        fixes.append("(a smaller batch_size does not help shared memory: every row's features "
                     "are kept)")  # fmt: skip
    for h in (h for h in plan.hosts if not h.fits):
        fixes.extend(_host_fixes(h))
    return fixes


def _host_fixes(h: FeatureHostRow) -> list[str]:
    fixes = [
        f"more memory on host {h.host}: at least {format_size(h.with_margin)} available (now "
        f"{format_size(h.room.room)}); stop other processes there, or raise "
        "dvml.memory.host-memory if it caps the plan"
    ]
    usable = math.floor(h.room.room / (1 + h.margin)) / len(h.workers)
    worst = max(h.workers, key=lambda w: w.resident)
    fixed = worst.runtime + worst.weights + worst.buffer
    per_row = worst.batches / max(1, worst.batch)
    if usable > fixed and per_row:
        rows = int((usable - fixed) // per_row)
        if 1 <= rows < worst.batch:
            fixes.append(
                f"a smaller batch_size: at most {rows} fits ({format_size(int(per_row))} of "
                "activations per row in a batch)"
            )
    else:
        fixes.append(
            f"(a smaller batch_size does not help: TensorFlow, the backbone and a buffer's "
            f"features alone take {format_size(fixed)} per worker, "
            f"{format_size(int(usable))} is left for each)"
        )
    fixes.append("more workers on more hosts, so fewer Dask workers per host run the backbone")
    return fixes
