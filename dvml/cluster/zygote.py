"""Trainers forked from one process per machine that imported TensorFlow once (the *zygote*).

Importing TensorFlow and tf-keras is most of a trainer's start: ~3.5 CPU-seconds per process,
and each process then holds its own copy of what the import built (~140 MiB of a trainer's
~450 MiB, measured). The Dask workers of one machine therefore share one zygote: a process
(``python -m dvml.train.runtime.trainer --zygote SOCKET``) that imports what every trainer
needs and then forks each standby trainer on request. A fork takes milliseconds, the import
is paid once per machine instead of once per trainer, and the forked trainers share the
zygote's pages until they write them.

The zygote belongs to a machine and, on a :class:`~dvml.LocalCluster`, to the cluster: its
socket lies in a 0700 directory (``DVML_ZYGOTE_DIR``, the cluster's ``sockets`` directory, else
``$TMPDIR/dvml-UID``), named by the Python executable, dvml's location and the trainers'
network namespace (a forked trainer lives in the zygote's). It serves only its own user
(``SO_PEERCRED``), and exits once no worker holds a connection to it and no trainer it forked
is alive. A worker's request passes the trainer's stdin, stdout and stderr as file
descriptors (``SCM_RIGHTS``, as :mod:`multiprocessing.forkserver` does) with its environment
and working directory; the trainer starts a session of its own (so that it is stopped as a
process group) and watches the requesting worker's pid instead of its parent's.

:class:`ForkedProcess` is the worker's handle: the subset of :class:`subprocess.Popen` the
trainer runtime uses (``pid``, ``stdin``, ``stdout``, ``poll``, ``wait``, ``returncode``); the
exit status comes from the zygote, which reaps its children. What fails here (no zygote
listens within its timeout, a private directory that is not private) raises
:class:`~dvml.exceptions.ClusterError`; :mod:`dvml.cluster.standby` then starts the trainer as
a process of its own, as without a zygote. ``dvml.train.fork-trainers: false`` turns the
zygote off.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from dvml.exceptions import ClusterError

__all__ = [
    "EXIT_UNKNOWN",
    "PARENT_ENV",
    "ZYGOTE_DIR_ENV",
    "ForkedProcess",
    "Zygote",
    "serve",
    "socket_path",
]

ZYGOTE_DIR_ENV = "DVML_ZYGOTE_DIR"
"""The directory (0700) of this machine's zygote socket; set on a LocalCluster's workers."""
PARENT_ENV = "DVML_TRAINER_PARENT"
"""Set in a forked trainer: the pid of the worker it serves (it exits when that one dies)."""
EXIT_UNKNOWN = 255
"""The return code of a forked trainer whose zygote died before it: its status is lost."""

_MESSAGE_BYTES = 1 << 20  # a request holds an environment: a few KiB
_SO_PEERCRED = struct.Struct("3i")  # pid, uid, gid
# The zygote's import takes ~3.5 CPU-seconds; on loaded cores much longer. A request waits
# in the socket's backlog meanwhile.
START_TIMEOUT = 120.0


def socket_path(environ: dict[str, str] | os._Environ[str], namespace: str = "") -> str:
    """Where the zygote for trainers started with ``environ`` listens.

    ``namespace`` names the network namespace the trainers run in (a LocalCluster's private
    one); else this process's own. The directory is created owner-only.
    """
    directory = environ.get(ZYGOTE_DIR_ENV) or os.path.join(
        tempfile.gettempdir(), f"dvml-{os.getuid()}"
    )
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ClusterError(
            f"The zygote directory {directory} must belong to uid {os.getuid()} and be "
            f"accessible only to it (mode {oct(info.st_mode & 0o777)}). Remove it, or set "
            f"{ZYGOTE_DIR_ENV} to a private directory."
        )
    if not namespace:
        with contextlib.suppress(OSError):
            namespace = os.readlink("/proc/self/ns/net")
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this dvml's
    key = "\0".join([sys.executable, package, namespace])
    # Short: a Unix socket's path has 107 bytes at most; no longer than a vineyardd's socket
    # name in the same directory (vineyard-N.sock).
    return os.path.join(directory, f"z-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) at the end."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _MESSAGE_BYTES, 3)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


# ------------------------------------------------------------------------------ worker side


class ForkedProcess:
    """A trainer forked by the zygote: what the trainer runtime uses of ``subprocess.Popen``.

    ``stdin`` and ``stdout`` are text pipes to the trainer; its exit status comes through
    ``connection`` from the zygote.
    """

    def __init__(self, pid: int, stdin: IO[str], stdout: IO[str], connection: socket.socket):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self.args = ["dvml-trainer", f"forked:{pid}"]
        self._connection: socket.socket | None = connection
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The return code once the trainer ended, else None (does not block)."""
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._check(0.0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the trainer's end; :class:`subprocess.TimeoutExpired` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left < 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            with self._lock:
                self._check(left)
        return self.returncode

    def _check(self, timeout: float) -> None:
        """Read the exit status if the zygote sent it within ``timeout`` seconds."""
        if self.returncode is not None:
            return
        if self._connection is None:  # the zygote died first: only whether the trainer lives
            if _alive(self.pid):
                time.sleep(timeout)
            else:
                self.returncode = EXIT_UNKNOWN
            return
        ready, _, _ = select.select([self._connection], [], [], timeout)
        if not ready:
            return
        try:
            message, _fds = _receive(self._connection)
        except (OSError, ValueError):
            message = None
        self._connection.close()
        self._connection = None
        if message is not None:
            self.returncode = int(message["exit"])
        elif not _alive(self.pid):  # the zygote died (closed without a status), and so did it
            self.returncode = EXIT_UNKNOWN


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs. A zombie does not: a fork whose zygote died is the child of
    whichever process adopted it, which may not reap it soon (a container's first process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc here: what kill said
        return True


class Zygote:
    """The worker's connection to one zygote (started on first use).

    Parameters
    ----------
    path : str
        Its socket (:func:`socket_path`).
    command : list of str
        The command that starts it with ``path`` as its last argument.
    env : dict
        Its environment (what trainers start with).
    """

    def __init__(self, path: str, command: list[str], env: dict[str, str]) -> None:
        self.path, self.command, self.env = path, command, env
        self._hold: socket.socket | None = None  # keeps the zygote alive while we live
        self._lock = threading.Lock()

    def fork(
        self, env: dict[str, str], cwd: str, stderr: int | None, timeout: float = START_TIMEOUT
    ) -> ForkedProcess:
        """Fork a trainer with ``env`` in ``cwd``; its fd 2 is ``stderr`` (None: its stdout).

        Raises
        ------
        ClusterError
            No zygote answered within ``timeout`` seconds, or it refused twice.
        """
        for _ in range(2):  # the zygote may end as we ask (its last holder had just gone)
            proc = self._fork(env, cwd, stderr, timeout)
            if proc is not None:
                return proc
        raise ClusterError(
            f"The trainer zygote at {self.path} ended twice before it forked a trainer; see "
            f"{self.path}.log. The trainer starts as a process of its own instead."
        )

    def _fork(
        self, env: dict[str, str], cwd: str, stderr: int | None, timeout: float
    ) -> ForkedProcess | None:
        """One request; None when the zygote ended before it answered."""
        connection = self._connect(timeout)
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        late = False
        try:
            request = {"env": env, "cwd": cwd, "parent": os.getpid()}
            _send(connection, request, [stdin_r, stdout_w, stdout_w if stderr is None else stderr])
            connection.settimeout(timeout)
            reply, _fds = _receive(connection)
            connection.settimeout(None)
        except TimeoutError:  # alive, but still importing (a loaded machine)
            reply, late = None, True
        except (OSError, ValueError):
            reply = None
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        if reply is None or "pid" not in reply:
            os.close(stdin_w)
            os.close(stdout_r)
            connection.close()
            if late:
                raise ClusterError(
                    f"The trainer zygote at {self.path} did not fork a trainer within "
                    f"{timeout:.0f}s; see {self.path}.log."
                )
            return None
        return ForkedProcess(
            int(reply["pid"]), os.fdopen(stdin_w, "w"), os.fdopen(stdout_r), connection
        )

    def _connect(self, timeout: float) -> socket.socket:
        """A new connection to the zygote, starting it when none listens."""
        with self._lock:
            # The zygote never writes to a hold: readable means it ended (a new one is needed).
            if self._hold is not None and select.select([self._hold], [], [], 0)[0]:
                self._hold.close()
                self._hold = None
            if self._hold is None:
                self._hold = self._open(timeout)
        return self._open(timeout)

    def _open(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        started = -float("inf")
        starters: list[subprocess.Popen[bytes]] = []
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect(self.path)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
            else:
                _stop_unneeded(starters, sock)
                return sock
            # None listens: start one (again after a while: the one started may have found
            # another that ended just then). A zygote binds before it imports.
            if starters and starters[-1].poll():  # it failed (not: found another)
                raise ClusterError(
                    f"The trainer zygote exited with code {starters[-1].returncode} before it "
                    f"listened at {self.path}:\n{_tail(self.path + '.log')}"
                )
            if time.monotonic() - started > 2.0:
                starters.append(self._start())
                started = time.monotonic()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"No trainer zygote listened at {self.path} within {timeout:.0f}s; "
                    f"see {self.path}.log."
                )
            time.sleep(0.02)

    def _start(self) -> subprocess.Popen[bytes]:
        """Start a zygote (it exits at once, with 0, when another one already listens)."""
        with open(self.path + ".log", "ab", opener=lambda p, f: os.open(p, f, 0o600)) as log:
            return subprocess.Popen(
                [*self.command, self.path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,  # a worker's SIGINT is not the zygote's
                cwd=os.path.dirname(self.path),
            )

    def close(self) -> None:
        """Let go of the zygote (it exits once no worker holds it and its trainers ended)."""
        with self._lock:
            if self._hold is not None:
                self._hold.close()
                self._hold = None


def _stop_unneeded(starters: list[subprocess.Popen[bytes]], connection: socket.socket) -> None:
    """Stop the zygotes started here that ``connection``'s zygote makes unneeded.

    A zygote started again while the first was still on its way (a loaded machine) would
    otherwise wait, bind once the one that served us has ended, and import for nothing until
    its unused timeout. None of them can bind while the one we are connected to lives.
    """
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size)
    serving, _uid, _gid = _SO_PEERCRED.unpack(creds)
    for starter in starters:
        if starter.pid != serving and starter.poll() is None:
            starter.kill()
            starter.wait()


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------------------ zygote side


def _bind(path: str) -> socket.socket | None:
    """Listen at ``path``; None when another zygote listens there already."""
    with open(path + ".lock", "a", opener=lambda p, f: os.open(p, f, 0o600)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
            return None  # alive
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        finally:
            probe.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead zygote's
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        return listener


# A zygote that nobody connected to exits after this many seconds (its starter died).
_UNUSED_EXIT = 60.0


def serve(path: str, prepare: Callable[[], None], child: Callable[[], int]) -> int:
    """Run a zygote at ``path``: ``prepare()`` once, then fork ``child()`` on each request.

    Returns when no connection and no child is left (or at once when another zygote
    listens at ``path``).
    """
    listener = _bind(path)
    if listener is None:
        return 0
    try:
        prepare()  # requests wait in the backlog meanwhile
    except BaseException:
        listener.close()  # a starter's next try starts afresh rather than finding a corpse
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    gc.collect()
    gc.freeze()  # the collector would otherwise touch, and so copy, every shared object
    return _Server(path, listener, os.stat(path).st_ino).run(child)


class _Server:
    def __init__(self, path: str, listener: socket.socket, inode: int) -> None:
        self.path, self.listener, self.inode = path, listener, inode
        self.served = False  # a worker asked for a fork once
        self.connections: dict[int, socket.socket] = {}
        self.children: dict[int, socket.socket | None] = {}  # pid -> its requester
        self.wakeup_r, self.wakeup_w = socket.socketpair()
        self.wakeup_w.setblocking(False)

    def run(self, child: Callable[[], int]) -> int:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wakeup_w.fileno())
        started = time.monotonic()
        try:
            # Until no worker holds it and no trainer it forked lives (a zygote that nobody
            # connected to: for a while, then its starter is gone).
            while (
                self.connections
                or self.children
                or (not self.served and time.monotonic() - started < _UNUSED_EXIT)
            ):
                readable = [self.listener, self.wakeup_r, *self.connections.values()]
                ready, _, _ = select.select(readable, [], [], 1.0)
                self._reap()
                for sock in ready:
                    if sock is self.listener:
                        self._accept()
                    elif sock is self.wakeup_r:
                        with contextlib.suppress(BlockingIOError):
                            self.wakeup_r.recv(4096)
                    else:
                        self._request(sock, child)
        finally:
            self._close()
        return 0

    def _accept(self) -> None:
        sock, _ = self.listener.accept()
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size)
        _pid, uid, _gid = _SO_PEERCRED.unpack(creds)
        if uid != os.getuid():
            sock.close()
            return
        self.connections[sock.fileno()] = sock

    def _request(self, sock: socket.socket, child: Callable[[], int]) -> None:
        try:
            request, fds = _receive(sock)
        except (OSError, ValueError):
            request, fds = None, []
        if request is None or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            self._drop(sock)
            return
        try:
            pid = self._fork(request, fds, child)
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = sock
        self.served = True
        with contextlib.suppress(OSError):
            _send(sock, {"pid": pid})

    def _drop(self, sock: socket.socket) -> None:
        self.connections.pop(sock.fileno(), None)
        for pid, owner in self.children.items():
            if owner is sock:
                self.children[pid] = None  # its worker went: nobody wants its status
        sock.close()

    def _fork(self, request: dict[str, Any], fds: list[int], child: Callable[[], int]) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 70
        try:
            self._become_trainer(request, fds)
            code = child()
        except BaseException:  # the child never returns into the zygote's loop
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        return 0  # unreachable

    def _become_trainer(self, request: dict[str, Any], fds: list[int]) -> None:
        """(In the child.) Drop the zygote's state and take the requester's stdio and
        environment."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in (self.listener, self.wakeup_r, self.wakeup_w, *self.connections.values()):
            sock.close()
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[PARENT_ENV] = str(int(request["parent"]))
        tempfile.tempdir = None  # read TMPDIR again

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            owner = self.children.pop(pid, None)
            if owner is not None:
                with contextlib.suppress(OSError):
                    _send(owner, {"exit": os.waitstatus_to_exitcode(status)})
                self._drop(owner)

    def _close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self.inode:  # not a successor's
                os.unlink(self.path)
        for sock in (self.listener, self.wakeup_r, self.wakeup_w, *self.connections.values()):
            sock.close()
