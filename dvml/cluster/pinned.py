"""Run tasks pinned to the workers that hold their buffers, surviving a worker restart.

A task pinned to a worker that died would wait for the scheduler's no-workers timeout; here a
task whose worker left is resubmitted to the worker of the same NAME once its Nanny has
restarted it. Its vineyardd runs on, so the buffer is still there and the placement holds.
Resubmitting is safe because every attempt puts its objects under its own staging name, and
the caller deletes every staged object that is not published. The pack graph (a task per
thread of each target) and the feature cache (build, save, load: a task per buffer) both run
their tasks through :func:`run_pinned`.

A worker whose Nanny is gone too (its host died or was cut off, or its ``dask worker``
process was killed) will not come back: :class:`NannyWatch` probes the Nanny and fails the
call once it has not answered for :data:`NANNY_GONE_AFTER` seconds, instead of waiting out
the restart timeout.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dvml.cluster.health import require_daemons
from dvml.cluster.probe import probe_context, reachable
from dvml.cluster.workers import WorkerInfo
from dvml.exceptions import ClusterError, DaemonDiedError

if TYPE_CHECKING:
    from distributed import Client, Future

__all__ = [
    "ATTEMPTS",
    "NANNY_GONE_AFTER",
    "NannyWatch",
    "live_identities",
    "live_workers",
    "pinned_step",
    "run_pinned",
    "wait_while_targets_live",
]

logger = logging.getLogger("dvml.cluster")

ATTEMPTS = 3

# Seconds a departed worker's Nanny may not answer before the worker counts as gone for good.
# A Nanny restarts its worker in seconds; a whole `dask worker` restarted by a supervisor
# (systemd, a pod) registers its worker of the same name within this too.
NANNY_GONE_AFTER = 10.0

# A worker process as the scheduler knows it: (address, server id). The server id is new for
# every worker process, so a restart is seen even when the new process got the same address.
Identity = tuple[str, str | None]


def live_workers(client: Client) -> dict[str, str]:
    """Worker name → address of the workers connected right now."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {str(w["name"]): addr for addr, w in info.items()}


def live_identities(client: Client) -> dict[str, Identity]:
    """Worker name → identity (address, server id) of the workers connected right now."""

    # Defined here so that it is pickled by value: the scheduler need not import dvml.
    def identities(dask_scheduler: Any) -> dict[str, tuple[str, str]]:
        return {str(ws.name): (ws.address, str(ws.server_id))
                for ws in dask_scheduler.workers.values()}  # fmt: skip

    return {name: (a, sid) for name, (a, sid) in client.run_on_scheduler(identities).items()}


def pinned_step(status: str, pinned: Identity, now: Identity | None) -> str:
    """What to do with a pinned task, from one reading of its future's status.

    Parameters
    ----------
    status : str
        The future's status, read ONCE: it changes under the caller's feet (a second reading
        may see ``"finished"`` where the first saw ``"pending"``).
    pinned : Identity
        The worker process the task was submitted to.
    now : Identity or None
        The live worker process of the same name, None when no worker has that name.

    Returns
    -------
    str
        ``"done"`` (collect the result), ``"failed"`` (the task's own error, on the worker
        that ran it), ``"wait"`` (still running, or settling, on that same worker),
        ``"gone"`` (no worker of that name: wait for its Nanny to restart it) or
        ``"restarted"`` (another process serves the name: submit the task again there).
    """
    if status == "finished":
        return "done"
    if now == pinned:
        return "failed" if status in ("error", "cancelled") else "wait"
    return "gone" if now is None else "restarted"


class NannyWatch:
    """Whether the departed workers among a call's targets can still come back.

    A worker killed alone is restarted by its Nanny; when the Nanny does not answer either
    for :data:`NANNY_GONE_AFTER` seconds (a refused or a timed-out connection), its host is
    down or cut off, or its ``dask worker`` process died, and the worker will not come back.
    A worker without a Nanny, or one that had left before the watch began, is waited for as
    before (the caller's restart timeout).

    Parameters
    ----------
    client : distributed.Client
    targets : sequence of WorkerInfo
        The workers the call writes to.
    answers : callable, optional
        ``answers(nanny_address) -> bool``; the default is a TCP probe (1 s) with the client's
        TLS context (:func:`dvml.cluster.probe.reachable`).
    """

    def __init__(
        self,
        client: Client,
        targets: Sequence[WorkerInfo],
        answers: Callable[[str], bool] | None = None,
    ) -> None:
        self.client = client
        self.names = sorted({t.name for t in targets})
        nannies = worker_nannies(client)
        self.nannies = {name: nannies[name] for name in self.names if name in nannies}
        self.answers = answers or self._probe
        self.silent_since: dict[str, float] = {}

    @functools.cached_property
    def _tls(self) -> Any:
        # Built on first use only: a TLS context loads the certificates (tens of ms), which
        # a call whose workers all stay pays for nothing.
        return probe_context(self.client)

    def _probe(self, address: str) -> bool:
        return reachable(address, 1.0, self._tls)

    def check(self, name: str, what: str) -> None:
        """Raise :class:`ClusterError` when worker ``name``, not connected now, will not come
        back (see the class doc); ``what`` names the call in the message."""
        nanny = self.nannies.get(name)
        if nanny is None:
            return
        if self.answers(nanny):
            self.silent_since.pop(name, None)
            return
        since = self.silent_since.setdefault(name, time.monotonic())
        if time.monotonic() - since >= NANNY_GONE_AFTER:
            raise ClusterError(
                f"Worker {name} left the cluster during {what}, and its Nanny at {nanny} has "
                f"not answered for {NANNY_GONE_AFTER:.0f}s: its host is down or cut off, or "
                "its `dask worker` process died, so the worker will not come back. Check the "
                "host, restart its worker (same name), then run the call again."
            )

    def check_targets(self, what: str) -> None:
        """:meth:`check` every target that is not connected now."""
        live = live_workers(self.client)
        for name in self.names:
            if name not in live:
                self.check(name, what)


def worker_nannies(client: Client) -> dict[str, str]:
    """Worker name → its Nanny's address, for the workers connected now that have one."""

    # Defined here so that it is pickled by value: the scheduler need not import dvml.
    def nannies(dask_scheduler: Any) -> dict[str, str]:
        return {str(ws.name): str(ws.nanny)
                for ws in dask_scheduler.workers.values() if ws.nanny}  # fmt: skip

    return dict(client.run_on_scheduler(nannies))


def wait_while_targets_live(
    client: Client, futures: Sequence[Future], what: str, watch: NannyWatch | None
) -> None:
    """Wait for ``futures``, failing as soon as one of ``watch``'s targets has left for good,
    and returning as soon as one of them failed (the caller raises its error and cancels the
    rest).

    For the work before a call's pinned tasks (a pack's reading and splitting): Dask
    recomputes elsewhere what a departed worker held, which only delays the error when that
    worker's buffers are to be written next. One failed task fails the call: waiting for the
    others only repeats the failure (an object store that died makes every read task wait
    out its own timeout, and each logs a "Compute Failed" block on its worker).
    """
    from distributed import wait

    futures = list(futures)
    while True:
        try:
            with client.as_current():  # distributed.wait looks up the default client
                wait(futures, timeout=1)
            return
        except TimeoutError:
            if any(f.status == "error" for f in futures):
                return
            if watch is not None:
                watch.check_targets(what)


def _wait_for_worker(
    client: Client, name: str, what: str, timeout: float, watch: NannyWatch
) -> Identity:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        identity = live_identities(client).get(name)
        if identity is not None:
            return identity
        watch.check(name, what)
        time.sleep(0.5)
    raise ClusterError(
        f"Worker {name} left the cluster during {what} and did not come back within "
        f"{timeout:.0f}s. Its buffers live in its vineyardd; check the worker, then run the "
        "call again."
    )


def run_pinned(
    client: Client,
    submit: Callable[[int, str, int], Future],
    targets: Sequence[WorkerInfo],
    what: str,
    restart_timeout: float = 60.0,
    abort: Callable[[], None] | None = None,
    drain_timeout: float = 120.0,
    watch: NannyWatch | None = None,
) -> list[Any]:
    """Run ``submit(i, address, attempt)`` for every target ``i``; return results in order.

    Parameters
    ----------
    submit : callable
        Submits task ``i`` pinned to ``address`` (attempt 1, 2, ...) and returns its future.
    targets : sequence of WorkerInfo
        The worker of each task.
    what : str
        Named in errors, e.g. ``"featurization"``.
    abort : callable, optional
        Called when the run fails, before waiting (up to ``drain_timeout`` seconds) for the
        tasks still running: Dask cannot interrupt a running task, and one that finished
        after the caller's clean-up would leave its objects behind. Tasks should watch for
        what ``abort`` signals and stop early.
    watch : NannyWatch, optional
        The targets' Nannies, recorded before (a caller's earlier phase); else now.

    Raises
    ------
    Exception
        The task's own error when it failed on a live worker (bad data, no room); a
        :class:`ClusterError` when a worker left ``ATTEMPTS`` times or did not come back.
    """
    from distributed import wait

    addresses = [t.address for t in targets]
    watch = watch or NannyWatch(client, targets)
    live = live_identities(client)
    # The process each task is pinned to; a target whose address is no longer its name's
    # (restarted since it was discovered) counts as restarted at once.
    pinned: dict[int, Identity] = {}
    for i, t in enumerate(targets):
        now = live.get(t.name)
        pinned[i] = now if now is not None and now[0] == t.address else (t.address, None)
    futures = {i: submit(i, addresses[i], 1) for i in range(len(targets))}
    attempts = dict.fromkeys(futures, 1)
    results: dict[int, Any] = {}
    try:
        while len(results) < len(futures):
            pending = [f for i, f in futures.items() if i not in results]
            timed_out = False
            try:
                # All of them, or a second: one pass per second, not per finished task (at
                # hundreds of buffers, a pass per task cost the client more than the packs).
                with client.as_current():  # distributed.wait looks up the default client
                    wait(pending, timeout=1, return_when="ALL_COMPLETED")
            except TimeoutError:  # not all finished within the second: look at the workers
                # A daemon that died now would leave the tasks blocked in vineyardd forever.
                require_daemons(client, what)
                timed_out = True
            statuses = {i: str(f.status) for i, f in futures.items() if i not in results}
            done = [i for i, status in statuses.items() if status == "finished"]
            for i, result in zip(done, client.gather([futures[i] for i in done]), strict=True):
                results[i] = result
            if not timed_out and all(s == "finished" for s in statuses.values()):
                continue
            live = live_identities(client)
            for i, status in statuses.items():
                if status == "finished":
                    continue
                name = targets[i].name
                step = pinned_step(status, pinned[i], live.get(name))
                if step == "wait":
                    continue
                if step == "failed":
                    futures[i].result()  # raises the task's own error: not a lost worker
                    continue  # a cancelled future whose result did not raise: look again
                if attempts[i] >= ATTEMPTS:
                    raise ClusterError(
                        f"{what} task {i} failed {attempts[i]} times because its worker "
                        f"{name} left the cluster. Check the worker's logs and memory, then "
                        "run the call again."
                    )
                identity = live.get(name) or _wait_for_worker(
                    client, name, what, restart_timeout, watch
                )
                if identity == pinned[i]:  # it was only missing from one listing
                    continue
                futures[i].cancel()
                logger.warning("worker %s restarted as %s: redoing %s task %d",
                               name, identity[0], what, i)  # fmt: skip
                addresses[i], pinned[i] = identity[0], identity
                attempts[i] += 1
                futures[i] = submit(i, identity[0], attempts[i])
    except BaseException:
        if abort is not None:
            abort()
        _settle(client, [(f, addresses[i]) for i, f in futures.items() if i not in results],
                drain_timeout)  # fmt: skip
        raise
    return [results[i] for i in range(len(futures))]


def _settle(client: Client, tasks: list[tuple[Future, str]], timeout: float) -> None:
    """Let tasks that may still put objects finish, then cancel them all.

    Cancelling does not stop a task that a worker is running: one that finished after the
    caller's clean-up listed the staged objects would leave an orphan. Tasks pinned to a
    worker that is gone never run again, so they are not waited for.
    """
    from distributed import wait

    futures = [f for f, _ in tasks]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            # Tasks blocked on a dead etcd never finish: do not wait for them.
            require_daemons(client)
            live = set(live_workers(client).values())
            running = [f for f, address in tasks if f.status == "pending" and address in live]
            if not running:
                break
            try:
                with client.as_current():
                    wait(running, timeout=1, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
    except DaemonDiedError:  # the caller reports it
        pass
    except Exception:  # the cluster is failing: the caller cleans up what it can
        logger.warning("could not wait for the running tasks", exc_info=True)
    client.cancel(futures)
