"""Child processes that dvml starts and stops by pid: etcd and vineyardd."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from dvml.cluster.lifeline import spawn

__all__ = ["ManagedProcess", "free_port", "poll_for", "port_is_free", "server_port"]


def poll_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Call ``condition`` until it returns True or ``timeout`` seconds pass; return the result."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


SERVER_PORTS = (15000, 32768)
"""Where :func:`server_port` looks, when the kernel's ephemeral range cannot be read."""


def server_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` and on every address, outside the ephemeral range.

    For a server another process binds later (a trainer's gRPC collectives): a port from
    ``bind(("", 0))`` comes from the kernel's ephemeral range, which every outgoing
    connection draws from too, so in the gap before the server binds it, a connection can
    take it ("Could not start gRPC server"). Below that range only explicit binds compete.
    """
    low = ephemeral_ports()[0]
    start, end = (SERVER_PORTS[0], low) if low - SERVER_PORTS[0] >= 1000 else SERVER_PORTS
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(start, end)
        if port_is_free(port, host) and port_is_free(port, "0.0.0.0"):
            return port
    return free_port(host)  # a crowded host: the ephemeral range, as before


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unread)."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` on ``host`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ManagedProcess:
    """A child process with its log file, stopped by its own pid (never by name).

    Parameters
    ----------
    name : str
        A label used in error messages, e.g. ``"vineyardd of worker-0"``.
    argv : sequence of str
        The command line.
    log_path : str
        File that receives the process's stdout and stderr.
    env : dict, optional
        Environment of the child; the parent's when None.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            # A new session: a Ctrl-C in the user's terminal reaches dvml, which then stops
            # the daemons in order, instead of killing them under running workers. spawn: the
            # child is killed by the kernel if this process dies without stopping it.
            self.popen = spawn(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, n_lines: int = 15) -> str:
        """The last lines of the process's log, for error messages."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n_lines:]).strip()
        except OSError:
            return ""

    def terminate(self) -> None:
        """Send SIGTERM without waiting (see :meth:`stop`)."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; always reaps the child."""
        if self.popen.poll() is not None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(5)
        except ProcessLookupError:
            self.popen.poll()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited({self.returncode()})"
        return f"<ManagedProcess {self.name} pid={self.pid} {state}>"
