"""moto's S3-compatible server for the object-store benchmark (B18): 127.0.0.1, a free port,
stopped by its pid. Authentication is off: the benchmark measures reads, not signatures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["S3Process", "start_s3"]


class S3Process:
    """A running moto_server: its endpoint and the fsspec options that reach it."""

    def __init__(self, proc: subprocess.Popen[bytes], endpoint: str) -> None:
        self.proc = proc
        self.endpoint = endpoint

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": "bench", "secret": "bench", "client_kwargs": {"endpoint_url": self.endpoint}}

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_s3(timeout: float = 30) -> S3Process:
    from dvml.cluster.processes import free_port

    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if exe is None:
        raise RuntimeError("B18 needs moto's server: pip install 'moto[server]'")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return S3Process(proc, endpoint)
        except urllib.error.HTTPError:
            return S3Process(proc, endpoint)
        except OSError:
            time.sleep(0.1)
    S3Process(proc, endpoint).stop()
    raise RuntimeError(f"moto_server did not answer on {endpoint} within {timeout} s")
