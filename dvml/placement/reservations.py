"""Memory reservations of running jobs, and the admission of a new job against them (pure).

A job admitted by its plan holds a *reservation* of its planned bytes per machine for as long
as it runs (:mod:`dvml.train.fit_admission` keeps them on the Dask scheduler). The next job's
plan is admitted only if, on each of its machines, its bytes fit in the machine's room less
what running jobs reserved there. A machine is named by its hosts joined with ``" + "``
(hosts that share one kernel, :func:`~dvml.placement.fit_memory.machine_rooms`): two jobs
whose machines share a host count against each other, even when one job uses fewer of the
machine's hosts than the other.

The room is read while the running jobs run, so their resident bytes may already be out of
it and be counted again by their reservations: admission errs on the side of refusing, never
of an OOM kill. A room capped by ``dvml.memory.host-memory`` (the usual way to give dvml a
share of a host) is not lowered by running jobs, and the arithmetic is exact there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dvml.placement.memory import format_size

__all__ = [
    "Short",
    "admission",
    "hosts_of",
    "refusal_message",
    "reservation_record",
    "reservation_rows",
    "reserved_on",
]


def hosts_of(machine: str) -> frozenset[str]:
    """The hosts of a machine's name (``"host-0 + host-1"``)."""
    return frozenset(h.strip() for h in machine.split(" + "))


def reservation_record(
    job: str, client: str, pid: int, host: str, ttl: float, now: str, reservation_id: str,
    machines: Mapping[str, int],
) -> dict[str, Any]:  # fmt: skip
    """The content of one reservation: ``machines`` maps machine name to reserved bytes."""
    return {
        "id": str(reservation_id), "job": str(job), "client": str(client), "pid": int(pid),
        "host": str(host), "ttl": float(ttl), "since": now,
        "machines": {str(m): int(b) for m, b in machines.items()},
    }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Short:
    """A machine on which a job does not fit beside the running jobs."""

    machine: str
    needed: int  # the job's bytes there, margin included
    room: int  # the machine's room, before reservations
    held: tuple[tuple[str, int], ...]  # (running job, bytes it reserved there)

    @property
    def free(self) -> int:
        return self.room - sum(b for _, b in self.held)


def _held_on(machine: str, reservations: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    hosts = hosts_of(machine)
    held = []
    for r in reservations:
        total = sum(int(b) for m, b in r["machines"].items() if hosts & hosts_of(m))
        if total:
            held.append((str(r["job"]), total))
    return held


def admission(
    needed: Mapping[str, int],
    rooms: Mapping[str, int],
    reservations: Iterable[Mapping[str, Any]],
) -> list[Short]:
    """The machines where a job needing ``needed`` (machine → bytes, margin included) does not
    fit in ``rooms`` (machine → bytes) less the ``reservations`` of running jobs; empty: it is
    admitted."""
    records = list(reservations)
    shorts = []
    for machine, bytes_ in needed.items():
        held = _held_on(machine, records)
        short = Short(machine, int(bytes_), int(rooms[machine]), tuple(held))
        if held and short.needed > short.free:
            shorts.append(short)
    return shorts


def refusal_message(job: str, shorts: Sequence[Short], what: str = "trainer") -> str:
    """The refusal of ``job`` beside running jobs: who holds the memory, how much, the fixes."""
    parts = []
    for s in shorts:
        holders = ", ".join(f"{j} ({format_size(b)})" for j, b in s.held)
        parts.append(
            f"on {s.machine} it needs {format_size(s.needed)} (margin included); the room is "
            f"{format_size(s.room)}, of which running jobs reserve {holders}, leaving "
            f"{format_size(max(0, s.free))}"
        )
    return (
        f"{job} does not fit beside the jobs running on this cluster: {'; '.join(parts)}. "
        f"No {what} was started. Received: {job} while those jobs hold their memory. Wait for "
        "them to end and run it again (it fits alone), or make it smaller (a smaller "
        "batch_size, fewer trainers per host), or give dvml more room "
        "(dvml.memory.host-memory, more hosts)."
    )


def reserved_on(host: str, reservations: Iterable[Mapping[str, Any]]) -> int:
    """The bytes running jobs reserve on the machine of ``host`` (a machine of several hosts:
    its whole reservation, which its hosts share)."""
    return sum(
        int(b) for r in reservations for m, b in r["machines"].items() if host in hosts_of(m)
    )


def reservation_rows(reservations: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per running job and machine: what ``dvml cluster status`` prints."""
    return [
        {"job": r["job"], "machine": m, "reserved": format_size(int(b)), "since": r["since"],
         "client pid": f"{r['host']}:{r['pid']}"}
        for r in sorted(reservations, key=lambda r: str(r["since"]))
        for m, b in sorted(r["machines"].items())
    ]  # fmt: skip
