"""Is every etcd and vineyardd of the cluster alive? Asked before and during each dvml call.

A vineyard call that needs etcd (persist, put_name, delete of a persisted object) blocks inside
vineyardd while etcd is down, and the blocked client call holds the worker's GIL: the whole
worker process freezes, its event loop included, and nothing ever returns (vineyard 0.24.2).
dvml therefore never waits on such a call blindly:

- before a call (:func:`require_daemons`): the owner of the cluster checks its processes by
  pid; a client that does not own it asks the scheduler's process (``dvml cluster up`` runs the
  scheduler in the process that owns the daemons), else the workers, which check their etcd
  endpoint (``DVML_ETCD_ENDPOINT``) and their vineyardd socket with a short connect;
- while a call waits for its tasks (:func:`wait_watched`, used by the pack, the feature cache
  and the catalog calls): the same check once a second, so that a daemon that dies DURING the
  call ends it with :class:`~dvml.exceptions.DaemonDiedError` naming the daemon.

Every question to a worker or the scheduler is bounded by ``cluster.daemon-timeout`` seconds: a
worker frozen on a dead etcd is reported as not answering instead of hanging the caller.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.cluster.connection import unix_socket_answers
from dvml.exceptions import DaemonDiedError, VineyarddDiedError

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = [
    "ETCD_ENV",
    "bounded_run",
    "daemon_timeout",
    "endpoint_answers",
    "known_dead",
    "probe_daemons",
    "register_owner",
    "require_daemons",
    "unix_socket_answers",
    "unregister_owner",
    "wait_watched",
]

ETCD_ENV = "DVML_ETCD_ENDPOINT"
_RESTART = (
    "Restart the cluster (`dvml cluster down` then `up`, or close the LocalCluster and start "
    "a new one)."
)

# Checks of the clusters this process owns, by scheduler address: the LocalCluster registers
# its own `check_daemons` (it knows every daemon's pid) and removes it when it closes.
_OWNERS: dict[str, Callable[[], None]] = {}
_OWNERS_LOCK = threading.Lock()
_NO_ANSWER = object()


def daemon_timeout() -> float:
    """Seconds a dvml call waits for a worker or daemon to answer (``cluster.daemon-timeout``)."""
    return float(config.get("cluster.daemon-timeout"))


def register_owner(scheduler_address: str, check: Callable[[], None]) -> None:
    """Record that this process owns the cluster at ``scheduler_address`` (see module doc)."""
    with _OWNERS_LOCK:
        _OWNERS[scheduler_address] = check


def unregister_owner(scheduler_address: str) -> None:
    with _OWNERS_LOCK:
        _OWNERS.pop(scheduler_address, None)


def _owner_check(scheduler_address: str) -> Callable[[], None] | None:
    with _OWNERS_LOCK:
        return _OWNERS.get(scheduler_address)


def endpoint_answers(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether something accepts connections at ``endpoint`` (``http://host:port``,
    ``host:port`` or ``unix://path``).

    A connect, not a request: it works whatever the endpoint speaks (TLS, client-certificate
    auth) and tells a dead daemon (connection refused) from a live one at once.
    """
    if endpoint.startswith(("unix://", "unixs://")):
        return unix_socket_answers(endpoint.split("://", 1)[1], timeout)
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"tcp://{endpoint}")
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 2379
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def probe_daemons() -> dict[str, Any]:
    """Run on a worker: can its etcd and its vineyardd be reached? Connects only, never blocks.

    No vineyard client call is made: the process's one IPC connection may be held by a task
    blocked in vineyardd, and waiting behind it would freeze the caller too.
    """
    etcd = os.environ.get(ETCD_ENV) or None
    sock = os.environ.get("VINEYARD_IPC_SOCKET") or None
    return {
        "etcd_endpoint": etcd,
        "etcd": None if etcd is None else endpoint_answers(etcd),
        "vineyard_socket": sock,
        "vineyardd": None if sock is None else unix_socket_answers(sock),
    }


async def _probe_async(dask_worker: Any = None) -> dict[str, Any]:
    # On the worker's event loop, the connects in a thread: the loop keeps serving.
    result = await asyncio.to_thread(probe_daemons)
    if dask_worker is not None:
        result["name"] = str(dask_worker.name)
    return result


# Workers that did not answer a bounded question lately, by address: until the time stored
# (monotonic), the next question does not wait for them again (they get a short grace only),
# so that one frozen worker costs a command one daemon-timeout, not one per step.
_SILENT: dict[str, float] = {}
_SILENT_LOCK = threading.Lock()
_SILENT_GRACE_S = 1.0
"""How long a worker that was silent lately is waited for (it may have thawed)."""


def _recently_silent(addresses: Sequence[str], now: float) -> set[str]:
    with _SILENT_LOCK:
        return {a for a in addresses if _SILENT.get(a, 0.0) > now}


def _remember(answers: dict[str, Any], timeout: float, now: float) -> None:
    with _SILENT_LOCK:
        for address, answer in answers.items():
            if answer is _NO_ANSWER:
                _SILENT[address] = now + 4 * timeout
            else:
                _SILENT.pop(address, None)


def bounded_run(
    client: Client,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float | None = None,
    workers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``client.run(fn)`` (on ``workers``, default all), answered within ``timeout`` seconds.

    The common case costs what ``client.run`` costs: one broadcast, given a third of
    ``timeout``. When it has not answered, every worker is asked on its own for the rest, so
    that one frozen worker (see module doc) costs the caller ``timeout`` in all, never more,
    and the others' answers still come back. A worker that did not answer lately (within four
    timeouts) is given about a second only, and no broadcast waits for it: the steps of one
    command do not each wait for the same frozen worker. The result maps the address of every
    worker to its answer (the exception it raised, if it failed), or to None when it did not
    answer in time.
    """
    import time

    timeout = daemon_timeout() if timeout is None else timeout
    chosen = None if workers is None else list(workers)

    async def ask_all() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        asked = chosen
        if asked is None:
            identity = await asyncio.wait_for(
                client.scheduler.identity(n_workers=-1),  # type: ignore[union-attr]
                timeout,
            )
            asked = list(identity["workers"])
        now = time.monotonic()
        lately = _recently_silent(asked, now)
        if not lately:
            try:
                answered = await asyncio.wait_for(
                    client._run(fn, *args, workers=chosen, on_error="return"), timeout / 3
                )
                return dict(answered)
            except (TimeoutError, OSError):
                pass

        async def ask(address: str) -> tuple[str, Any]:
            left = max(0.1, deadline - loop.time())
            wait = min(left, _SILENT_GRACE_S) if address in lately else left
            try:
                answer = await asyncio.wait_for(
                    client._run(fn, *args, workers=[address], on_error="return"), wait
                )
            except TimeoutError:
                return address, _NO_ANSWER
            except OSError as exc:  # the worker's connection closed: it left
                return address, exc
            return address, answer.get(address, _NO_ANSWER)

        pairs = dict(await asyncio.gather(*(ask(a) for a in asked)))
        _remember(pairs, timeout, now)
        return {a: (None if r is _NO_ANSWER else r) for a, r in pairs.items()}

    return dict(client.sync(ask_all, callback_timeout=timeout + 10))


def _scheduler_check(dask_scheduler: Any = None) -> str | tuple[str, str] | None:
    """Run in the scheduler's process: the owner's verdict on its daemons, or None.

    A dead daemon is ``(class name, message)``.
    """
    address = getattr(dask_scheduler, "address", None)
    check = _owner_check(address) if address else None
    if check is None:
        return "unknown"
    try:
        check()
    except DaemonDiedError as exc:
        return (type(exc).__name__, str(exc))
    return None


def known_dead(client: Client) -> DaemonDiedError | None:
    """A dead daemon the owner of the cluster knows of, without asking any worker.

    The owner is this process (a LocalCluster) or the scheduler's (``dvml cluster up``); it
    checks its daemons by pid. None when all run, or when no owner can tell (a cluster started
    by hand): then only the workers could, and a frozen one would not answer.
    """
    address = str(getattr(client.scheduler, "address", ""))
    check = _owner_check(address)
    if check is not None:
        try:
            check()
        except DaemonDiedError as exc:
            return exc
        return None
    try:
        verdict = client.sync(
            client._run_on_scheduler, _scheduler_check, callback_timeout=daemon_timeout() / 3
        )
    except Exception:  # an old scheduler, a timeout: nobody can tell
        return None
    if verdict is None or verdict == "unknown":
        return None
    kind, message = verdict
    error = VineyarddDiedError if kind == VineyarddDiedError.__name__ else DaemonDiedError
    return error(message)


def require_daemons(client: Client, what: str | None = None, vineyardd: bool = True) -> None:
    """Raise :class:`DaemonDiedError` when an etcd or vineyardd of the cluster is not running.

    Bounded by ``cluster.daemon-timeout`` seconds (see the module doc for how it decides).
    ``vineyardd=False`` checks etcd only: for calls that read the catalog through any live
    vineyardd (listing and describing datasets, which then show the lost ones as damaged).

    Raises
    ------
    DaemonDiedError
        Naming the daemon (etcd and its endpoint or pid, or the vineyardd of a worker), or the
        workers that did not answer, and what to do.
    """
    try:
        _require_daemons(client, what)
    except VineyarddDiedError:
        if vineyardd:
            raise


def _require_daemons(client: Client, what: str | None) -> None:
    address = str(getattr(client.scheduler, "address", ""))
    check = _owner_check(address)
    if check is not None:
        _with_context(check, what)
        return
    timeout = daemon_timeout()
    try:
        verdict = client.sync(client._run_on_scheduler, _scheduler_check, callback_timeout=timeout)
    except Exception:  # an old scheduler, a timeout: ask the workers instead
        verdict = "unknown"
    if verdict is None:
        return
    if verdict != "unknown":
        kind, message = verdict
        error = VineyarddDiedError if kind == VineyarddDiedError.__name__ else DaemonDiedError
        raise error(f"{_prefix(what)}{message}")
    _check_workers(client, what, timeout)


def _prefix(what: str | None) -> str:
    return f"{what[:1].upper()}{what[1:]} stopped: " if what else ""


def _with_context(check: Callable[[], None], what: str | None) -> None:
    try:
        check()
    except DaemonDiedError as exc:
        if not what:
            raise
        raise type(exc)(f"{_prefix(what)}{exc}") from None


def _check_workers(client: Client, what: str | None, timeout: float) -> None:
    answers = bounded_run(client, _probe_async, timeout=timeout)
    dead_etcd = sorted({a["etcd_endpoint"] for a in answers.values()
                        if isinstance(a, dict) and a["etcd"] is False})  # fmt: skip
    if dead_etcd:
        raise DaemonDiedError(
            f"{_prefix(what)}etcd at {', '.join(dead_etcd)} is not running (the workers "
            f"cannot connect to it), so vineyard metadata cannot be read or written. {_RESTART}"
        )
    dead_vineyardd = [f"{a.get('name', addr)} (socket {a['vineyard_socket']})"
                      for addr, a in answers.items()
                      if isinstance(a, dict) and a["vineyardd"] is False]  # fmt: skip
    if dead_vineyardd:
        raise VineyarddDiedError(
            f"{_prefix(what)}The vineyardd of {', '.join(dead_vineyardd)} is not running; "
            f"the data on that worker is lost. {_RESTART}"
        )
    silent = [a for a, answer in answers.items() if not isinstance(answer, dict)]
    if silent:
        raise DaemonDiedError(
            f"{_prefix(what)}Workers {silent} did not answer within {timeout:.0f}s "
            "(cluster.daemon-timeout). A worker freezes when a vineyard call waits on a dead "
            "etcd: check `dvml cluster status`, and restart the cluster if a daemon died."
        )


def wait_watched(
    client: Client,
    futures: Sequence[Future],
    what: str | None = None,
    interval: float = 1.0,
    vineyardd: bool = True,
) -> None:
    """Wait until every future is done, checking the daemons every ``interval`` seconds.

    ``vineyardd=False`` watches etcd only, as :func:`require_daemons` does: for tasks that run
    on live vineyardds while another is known to be dead (reading the catalog, deleting what
    the live ones hold), which must finish however long they take.

    Raises
    ------
    DaemonDiedError
        As soon as a check finds a dead daemon; the futures are cancelled.
    """
    from distributed import wait

    pending = [f for f in futures if not f.done()]
    while pending:
        try:
            with client.as_current():
                wait(pending, timeout=interval, return_when="ALL_COMPLETED")
        except TimeoutError:
            pass
        pending = [f for f in pending if not f.done()]
        if pending:
            try:
                require_daemons(client, what, vineyardd=vineyardd)
            except DaemonDiedError:
                client.cancel(list(futures))
                raise
