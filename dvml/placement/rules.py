"""Distribution rules: which workers receive the packed buffers of a dataset.

The user says it the MADlib way (``distribution_rules='all_segments'``, a list of hosts, a table
such as the output of :func:`dvml.gpu_configuration`); :meth:`DistributionRules.parse` turns
that into a plain value and :func:`resolve_rules` matches it against the workers the cluster
reported. Nothing here talks to a cluster: the worker list is an argument.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvml.exceptions import ArgumentTypeError, PlacementError

if TYPE_CHECKING:
    from dvml.cluster.workers import WorkerInfo

__all__ = ["KINDS", "DistributionRules", "describe_resolution", "resolve_rules"]

KINDS = ("all_workers", "gpu_workers", "workers", "hosts", "table")

# MADlib's names are accepted as aliases, so a MADlib user's habits carry over.
_KEYWORDS = {
    "all_workers": "all_workers",
    "all_segments": "all_workers",
    "gpu_workers": "gpu_workers",
    "gpu_segments": "gpu_workers",
}
_HOST_COLUMNS = ("host", "hostname")
_ACCEPTED = (
    "'all_workers' (alias 'all_segments'), 'gpu_workers' (alias 'gpu_segments'), one worker "
    "address or name as a string, a list or tuple of worker addresses/names or of host names, "
    "or a pandas DataFrame with a 'worker' or 'host'/'hostname' column "
    "(such as the output of dvml.gpu_configuration())"
)
_MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class DistributionRules:
    """Parsed distribution rules, not yet matched against a cluster.

    Parameters
    ----------
    kind : str
        ``"all_workers"``, ``"gpu_workers"``, ``"workers"`` (explicit strings, matched against
        worker addresses and names, else against host names, at resolve time), ``"hosts"``
        (a table with a host column) or ``"table"`` (a table with a ``worker`` column).
    items : tuple of str
        The worker or host identifiers, in the user's order; empty for the keywords. For
        ``"table"`` and ``"hosts"`` repeated rows are already folded into one item.
    given : object
        A JSON-able form of what the user gave, kept for the dataset summary: a string, a
        list, or ``{"table": [records]}``. Not part of equality.
    """

    kind: str
    items: tuple[str, ...] = ()
    given: object = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlacementError(
                f"Unknown distribution rules kind. Received: kind={self.kind!r}. "
                f"Use one of {list(KINDS)}."
            )
        if not isinstance(self.items, tuple) or not all(isinstance(i, str) for i in self.items):
            raise ArgumentTypeError(
                f"DistributionRules.items must be a tuple of str. Received: items={self.items!r}."
            )
        if self.kind in ("all_workers", "gpu_workers") and self.items:
            raise PlacementError(
                f"Keyword distribution rules take no items. Received: kind={self.kind!r}, "
                f"items={self.items!r}."
            )

    @classmethod
    def parse(cls, value: object) -> DistributionRules:
        """Parse the ``distribution_rules`` a user gave.

        Parameters
        ----------
        value : str, list, tuple, pandas.DataFrame or DistributionRules
            ``"all_workers"``/``"all_segments"`` or ``"gpu_workers"``/``"gpu_segments"``
            (case-insensitive); any other string is one worker address or name (or, failing
            that, a host name); a list or tuple of such strings (worker names may also be
            ints, as Dask allows); a DataFrame with a ``worker`` column (used when present,
            so the output of :func:`dvml.gpu_configuration` selects its workers, each once)
            or else a ``host``/``hostname`` column.

        Returns
        -------
        DistributionRules

        Raises
        ------
        ArgumentTypeError
            For any other type, or list items that are not strings.
        PlacementError
            For a blank string, or a DataFrame without a usable column or with empty cells.
        """
        if isinstance(value, DistributionRules):
            return value
        if isinstance(value, str):
            return _parse_string(value)
        if isinstance(value, list | tuple):
            items = tuple(_item_to_str(v, position=i) for i, v in enumerate(value))
            return cls("workers", items, given=list(items))
        if _is_dataframe(value):
            return _parse_frame(value)
        raise ArgumentTypeError(
            f"distribution_rules has an unsupported type. Received: type "
            f"{type(value).__name__} ({_short_repr(value)}). Pass {_ACCEPTED}."
        )


def _parse_string(value: str) -> DistributionRules:
    text = value.strip()
    if not text:
        raise PlacementError(
            f"distribution_rules is a blank string. Received: distribution_rules={value!r}. "
            f"Pass {_ACCEPTED}."
        )
    keyword = _KEYWORDS.get(text.lower())
    if keyword is not None:
        return DistributionRules(keyword, (), given=value)
    return DistributionRules("workers", (text,), given=value)


def _item_to_str(item: object, *, position: int) -> str:
    # bool is an int subclass, but True is never a worker name.
    if isinstance(item, str) and item.strip():
        return item.strip()
    if isinstance(item, int) and not isinstance(item, bool):
        return str(item)
    if hasattr(item, "dtype") and getattr(item, "ndim", None) == 0:
        return _item_to_str(item.item(), position=position)  # type: ignore[attr-defined]
    raise ArgumentTypeError(
        f"distribution_rules lists must hold worker addresses, worker names or host names "
        f"as strings. Received: item {position} = {item!r} of type {type(item).__name__}. "
        f"Pass strings such as 'tcp://127.0.0.1:3456', 'worker-0' or a host name."
    )


def _is_dataframe(value: object) -> bool:
    # Only check pandas when it is loaded already: a DataFrame cannot exist otherwise.
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, pd.DataFrame)


def _parse_frame(frame: Any) -> DistributionRules:
    columns = [str(c) for c in frame.columns]
    if "worker" in columns:
        column, kind = "worker", "table"
    else:
        found = [c for c in _HOST_COLUMNS if c in columns]
        if not found:
            raise PlacementError(
                f"A distribution_rules table needs a 'worker' column (addresses or names) or "
                f"a 'host'/'hostname' column. Received: columns={columns}. Rename the column, "
                f"or pass dvml.gpu_configuration() filtered to the rows you want."
            )
        column, kind = found[0], "hosts"
    items: list[str] = []
    for position, cell in enumerate(frame[column].tolist()):
        if cell is None or (isinstance(cell, float) and math.isnan(cell)):
            raise PlacementError(
                f"The distribution_rules table has an empty cell in column {column!r}. "
                f"Received: row {position} = {cell!r}. Drop that row or fill it."
            )
        text = _item_to_str(cell, position=position)
        if text not in items:  # several GPU rows of one worker mean that worker once
            items.append(text)
    return DistributionRules(kind, tuple(items), given={"table": _records(frame)})


def _records(frame: Any) -> list[dict[str, Any]]:
    return [
        {str(k): _jsonable(v) for k, v in row.items()} for row in frame.to_dict(orient="records")
    ]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def _short_repr(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _strip_scheme(address: str) -> str:
    return address.split("://", 1)[-1]


def _known(workers: Sequence[WorkerInfo]) -> str:
    shown = [f"{w.name} ({w.address}, host {w.host}, {w.n_gpus} GPU(s))" for w in workers]
    more = len(shown) - _MAX_LISTED
    text = "; ".join(shown[:_MAX_LISTED]) + (f"; ... and {more} more" if more > 0 else "")
    hosts = _unique([w.host for w in workers])
    return f"Known workers: {text or 'none'}. Known hosts: {hosts}."


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _match_worker(item: str, workers: Sequence[WorkerInfo]) -> WorkerInfo | None:
    for w in workers:
        if item == w.address:
            return w
    for w in workers:
        if item == w.name:
            return w
    # "127.0.0.1:3456" names the worker "tcp://127.0.0.1:3456" as well.
    bare = _strip_scheme(item)
    matches = [w for w in workers if _strip_scheme(w.address) == bare]
    return matches[0] if len(matches) == 1 else None


def resolve_rules(rules: object, workers: Sequence[WorkerInfo]) -> list[WorkerInfo]:
    """Match distribution rules against the workers of a cluster.

    Parameters
    ----------
    rules : DistributionRules or anything :meth:`DistributionRules.parse` accepts
    workers : sequence of WorkerInfo
        The cluster's workers, in the cluster's order.

    Returns
    -------
    list of WorkerInfo
        The target workers: in the cluster's order for keywords and host selections, in the
        user's order for explicit worker lists and worker tables.

    Raises
    ------
    PlacementError
        For an unknown worker or host, a list that mixes workers and hosts, duplicates in an
        explicit list, an empty list or selection, ``gpu_workers`` on a cluster without GPUs,
        or a selected worker that has no vineyardd.
    """
    parsed = DistributionRules.parse(rules)
    workers = list(workers)
    if not workers:
        raise PlacementError(
            f"The cluster has no workers, so distribution_rules={parsed.given!r} selects "
            f"nothing. Start workers (dvml.LocalCluster(n_workers=...)) and try again."
        )
    if parsed.kind == "all_workers":
        targets = workers
    elif parsed.kind == "gpu_workers":
        targets = [w for w in workers if w.n_gpus > 0]
        if not targets:
            raise PlacementError(
                f"distribution_rules={parsed.given!r} selects the workers with GPUs, but no "
                f"worker reports a GPU. {_known(workers)} Declare GPUs for the workers "
                f"(dvml.LocalCluster(gpus=...) or DVML_GPUS) or use 'all_workers'."
            )
    else:
        targets = _resolve_items(parsed, workers)
    _check_vineyard(targets, parsed, workers)
    return targets


def _resolve_items(parsed: DistributionRules, workers: list[WorkerInfo]) -> list[WorkerInfo]:
    items = parsed.items
    if not items:
        raise PlacementError(
            f"distribution_rules is an empty {'table' if parsed.kind != 'workers' else 'list'}. "
            f"Received: distribution_rules={parsed.given!r}. {_known(workers)} Name at least "
            f"one worker or host, or use 'all_workers'."
        )
    if parsed.kind == "workers":
        dupes = sorted({i for i in items if items.count(i) > 1})
        if dupes:
            raise PlacementError(
                f"distribution_rules names the same worker or host more than once. Received: "
                f"duplicates {dupes} in {list(items)}. Name each one once."
            )
    hosts = set(_unique([w.host for w in workers]))
    as_workers = {i: _match_worker(i, workers) for i in items}
    if parsed.kind == "table" or (
        parsed.kind == "workers" and all(m is not None for m in as_workers.values())
    ):
        unknown = [i for i, m in as_workers.items() if m is None]
        if unknown:
            raise PlacementError(
                f"distribution_rules names unknown workers. Received: {unknown}. "
                f"{_known(workers)} Use worker addresses or names from dvml.gpu_configuration() "
                f"or client.scheduler_info()."
            )
        targets = [m for m in as_workers.values() if m is not None]
        if parsed.kind == "workers":
            _check_same_worker_twice(items, as_workers)
        # A table may name one worker by address in one row and by name in another.
        return list({w.address: w for w in targets}.values())
    if parsed.kind == "hosts" or all(i in hosts for i in items):
        unknown = [i for i in items if i not in hosts]
        if unknown:
            raise PlacementError(
                f"distribution_rules names unknown hosts. Received: {unknown}. {_known(workers)} "
                f"Use host names from dvml.gpu_configuration()['hostname']."
            )
        chosen = set(items)
        return [w for w in workers if w.host in chosen]
    unknown = [i for i in items if as_workers[i] is None and i not in hosts]
    if unknown:
        raise PlacementError(
            f"distribution_rules names {len(unknown)} unknown worker(s) or host(s). Received: "
            f"{unknown}. {_known(workers)} Use worker addresses, worker names or host names."
        )
    worker_items = [i for i in items if as_workers[i] is not None]
    host_items = [i for i in items if as_workers[i] is None]
    raise PlacementError(
        f"distribution_rules mixes workers and hosts. Received: workers {worker_items} and "
        f"hosts {host_items}. List only workers, or only hosts."
    )


def _check_same_worker_twice(items: tuple[str, ...], matched: dict[str, WorkerInfo | None]) -> None:
    seen: dict[str, str] = {}
    for item in items:
        w = matched[item]
        if w is None:
            continue
        if w.address in seen:
            raise PlacementError(
                f"distribution_rules names the same worker twice. Received: {seen[w.address]!r} "
                f"and {item!r} are both {w.name} ({w.address}). Name each worker once."
            )
        seen[w.address] = item


def _check_vineyard(
    targets: list[WorkerInfo], parsed: DistributionRules, workers: list[WorkerInfo]
) -> None:
    if not targets:
        raise PlacementError(
            f"distribution_rules={parsed.given!r} selects no worker. {_known(workers)} "
            f"Select at least one worker, or use 'all_workers'."
        )
    missing = [w for w in targets if w.vineyard_instance_id is None]
    # A worker started with a socket whose daemon does not answer lost its vineyardd (it died
    # or was killed): telling its owner to set VINEYARD_IPC_SOCKET would name the wrong cause.
    dead = [w for w in missing if w.vineyard_socket]
    if dead:
        names = [f"{w.name} ({w.address}, host {w.host}, socket {w.vineyard_socket})" for w in dead]
        raise PlacementError(
            f"The vineyardd of selected workers is not running (it died or was stopped), so "
            f"they cannot hold buffers. Received: {names}. Check `dvml cluster status`; "
            f"restart the cluster (its datasets on that daemon are lost), or leave these "
            f"workers out of distribution_rules."
        )
    if missing:
        names = [f"{w.name} ({w.address}, host {w.host})" for w in missing]
        raise PlacementError(
            f"Selected workers have no vineyardd, so they cannot hold buffers. Received: "
            f"{names}. Start each worker with VINEYARD_IPC_SOCKET pointing at a running "
            f"vineyardd (dvml.LocalCluster does this), or leave these workers out of "
            f"distribution_rules."
        )


def describe_resolution(rules: object, targets: Sequence[WorkerInfo]) -> dict[str, Any]:
    """The JSON-able record of the rules and their resolution, for the dataset summary.

    Parameters
    ----------
    rules : DistributionRules or anything :meth:`DistributionRules.parse` accepts
    targets : sequence of WorkerInfo
        What :func:`resolve_rules` returned.

    Returns
    -------
    dict
        ``{"given": ..., "kind": ..., "resolved": [{"worker", "name", "host",
        "vineyard_instance_id"}, ...]}``.
    """
    parsed = DistributionRules.parse(rules)
    given = parsed.given
    if given is None:  # built directly rather than parsed from what a user gave
        given = list(parsed.items) if parsed.items else parsed.kind
    return {
        "given": _jsonable_given(given),
        "kind": parsed.kind,
        "resolved": [
            {
                "worker": w.address,
                "name": w.name,
                "host": w.host,
                "vineyard_instance_id": w.vineyard_instance_id,
            }
            for w in targets
        ],
    }


def _jsonable_given(given: object) -> Any:
    if isinstance(given, dict):
        return {str(k): _jsonable_given(v) for k, v in given.items()}
    if isinstance(given, list | tuple):
        return [_jsonable_given(v) for v in given]
    return _jsonable(given)
