"""Pure planning of a local cluster: validate the arguments and decide every worker's layout.

No process is started here, so every check runs before anything exists that would need
cleaning up.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence

from dask.utils import parse_bytes

from dvml.exceptions import ArgumentError, ArgumentTypeError, SharedMemoryError
from dvml.limits import MAX_GPUS_PER_WORKER, MAX_WORKERS

__all__ = ["LocalWorkerSpec", "check_shared_memory", "parse_memory", "plan_workers"]


@dataclasses.dataclass(frozen=True)
class LocalWorkerSpec:
    """What one simulated worker gets: its name, host, declared GPUs and vineyard socket."""

    index: int
    name: str
    host: str
    gpus: tuple[str, ...]
    socket_name: str


def parse_memory(value: int | str, what: str = "vineyard_memory") -> int:
    """Parse a memory size (``536870912``, ``"512MiB"``, ``"2 GB"``) into bytes.

    Raises
    ------
    ArgumentTypeError
        When the value is a bool.
    ArgumentError
        When the value does not parse or is not positive.
    """
    if isinstance(value, bool):
        raise ArgumentTypeError(
            f"{what} must be a byte count or a size string. Received: {value!r}."
        )
    try:
        if not str(value).strip():  # dask's parse_bytes reads "" as 1 byte
            raise ValueError("empty size")
        nbytes = int(value) if isinstance(value, int) else parse_bytes(str(value))
    except (ValueError, TypeError) as exc:
        raise ArgumentError(
            f"{what} must be a byte count or a size such as '512MiB' or '2GB'. Received: {value!r}."
        ) from exc
    if nbytes <= 0:
        raise ArgumentError(f"{what} must be positive. Received: {value!r}.")
    return nbytes


def check_shared_memory(per_daemon: int, n_daemons: int, shm_path: str = "/dev/shm") -> None:
    """Refuse a layout whose vineyardd memory does not fit in free shared memory.

    A vineyardd whose ``--size`` exceeds free ``/dev/shm`` dies with SIGBUS on first use, so
    the check happens before any daemon starts.
    """
    try:
        free = shutil.disk_usage(shm_path).free
    except OSError as exc:
        raise SharedMemoryError(
            f"Cannot read free shared memory at {shm_path}: {exc}. vineyardd needs a tmpfs "
            "there; mount one or run on a host that has it."
        ) from exc
    needed = per_daemon * n_daemons
    if needed > free:
        raise SharedMemoryError(
            f"vineyard_memory={per_daemon} bytes for each of {n_daemons} vineyardd needs "
            f"{needed} bytes of shared memory, but {shm_path} has {free} bytes free. Lower "
            "vineyard_memory or n_workers, or enlarge /dev/shm."
        )


def plan_workers(
    n_workers: int,
    gpus: int | Sequence[int] = 0,
    hosts: int | Sequence[str] | None = None,
) -> list[LocalWorkerSpec]:
    """Decide the name, simulated host and declared GPUs of every local worker.

    Parameters
    ----------
    n_workers : int
        Number of Dask workers (each gets its own vineyardd). At least 1.
    gpus : int or sequence of int
        GPUs declared for every worker (an int) or for each worker (a sequence of length
        ``n_workers``).
    hosts : int or sequence of str, optional
        Simulated hosts: a number of hosts over which workers are spread in contiguous
        blocks (``host-0`` gets the first workers), or one host name per worker. By default
        every worker is on its own host.
    """
    if isinstance(n_workers, bool) or not isinstance(n_workers, int):
        raise ArgumentTypeError(f"n_workers must be an int. Received: n_workers={n_workers!r}.")
    if not 1 <= n_workers <= MAX_WORKERS:
        raise ArgumentError(
            f"n_workers must be at least 1 and at most {MAX_WORKERS}. Received: "
            f"n_workers={n_workers}. Pass a number of workers in range."
        )

    gpu_counts = _per_worker_gpus(gpus, n_workers)
    host_names = _per_worker_hosts(hosts, n_workers)
    specs = []
    next_gpu: dict[str, int] = {}  # GPUs are numbered per host, as nvidia-smi would
    for i in range(n_workers):
        first = next_gpu.get(host_names[i], 0)
        next_gpu[host_names[i]] = first + gpu_counts[i]
        declared = tuple(
            f"GPU {g}: Declared GPU (simulated) on {host_names[i]}"
            for g in range(first, first + gpu_counts[i])
        )
        specs.append(
            LocalWorkerSpec(
                index=i,
                name=f"worker-{i}",
                host=host_names[i],
                gpus=declared,
                socket_name=f"vineyard-{i}.sock",
            )
        )
    return specs


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _per_worker_gpus(gpus: int | Sequence[int], n_workers: int) -> list[int]:
    if isinstance(gpus, bool):
        raise ArgumentTypeError(f"gpus must be an int or a list of ints. Received: gpus={gpus!r}.")
    counts = [gpus] * n_workers if isinstance(gpus, int) else list(gpus)
    if len(counts) != n_workers:
        raise ArgumentError(
            f"gpus must give one count per worker ({n_workers} workers). Received {len(counts)} "
            f"counts: gpus={list(gpus)!r}."  # type: ignore[arg-type]
        )
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int):
            raise ArgumentTypeError(f"GPU counts must be ints. Received: gpus={gpus!r}.")
        if not 0 <= count <= MAX_GPUS_PER_WORKER:
            # Each declared GPU becomes a resource string: a billion would fill the memory.
            raise ArgumentError(
                f"GPU counts cannot be negative or above {MAX_GPUS_PER_WORKER} per worker. "
                f"Received: gpus={_short(gpus)}. Declare the GPUs each worker really has."
            )
    return counts


def _per_worker_hosts(hosts: int | Sequence[str] | None, n_workers: int) -> list[str]:
    if hosts is None:
        return [f"host-{i}" for i in range(n_workers)]
    if isinstance(hosts, bool):
        raise ArgumentTypeError(
            f"hosts must be an int or a list of names. Received: hosts={hosts!r}."
        )
    if isinstance(hosts, int):
        if not 1 <= hosts <= n_workers:
            raise ArgumentError(
                f"hosts must be between 1 and n_workers={n_workers}. Received: hosts={hosts}."
            )
        per_host = -(-n_workers // hosts)
        return [f"host-{i // per_host}" for i in range(n_workers)]
    names = [str(h) for h in hosts]
    if len(names) != n_workers:
        raise ArgumentError(
            f"hosts must name one host per worker ({n_workers} workers). "
            f"Received {len(names)}: hosts={names!r}."
        )
    if any(not n for n in names):
        raise ArgumentError(f"Host names cannot be empty. Received: hosts={names!r}.")
    return names
