"""A real MLflow tracking server (``mlflow server``, SQLite backend, artifacts proxied) for the
tracking tests, from its own environment (``./scripts/peer-mlflow`` makes .venv-mlflow;
``./scripts/check`` runs it) or ``$DVML_MLFLOW_SERVER``."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers.polling import poll_for

REPO = pathlib.Path(__file__).resolve().parents[2]

__all__ = ["running_mlflow_server"]


def _mlflow_executable() -> str:
    found = os.environ.get("DVML_MLFLOW_SERVER") or str(REPO / ".venv-mlflow" / "bin" / "mlflow")
    if not os.access(found, os.X_OK):
        raise RuntimeError(
            f"No MLflow server at {found}: run ./scripts/peer-mlflow (./scripts/check does), "
            "or set DVML_MLFLOW_SERVER to an `mlflow` executable."
        )
    return found


@contextmanager
def running_mlflow_server(directory: pathlib.Path) -> Iterator[str]:
    """``mlflow server`` on a free loopback port, its database and artifacts in
    ``directory``; yields its URI; stops it (its own process group, by its pid) on exit."""
    from dvml.cluster.processes import free_port

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = open(directory / "mlflow-server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [_mlflow_executable(), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{directory / 'mlflow.db'}",
         "--artifacts-destination", str(directory / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=directory,
        # No job runner: its huey consumers start seconds after the server answers, so a
        # test's leak check could see them as its own (the tests run no MLflow jobs).
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=1):
                    return True
            except (urllib.error.URLError, OSError):
                return proc.poll() is not None  # it exited: stop waiting, report below

        if not poll_for(up, 90, interval=0.3) or proc.poll() is not None:
            tail = (directory / "mlflow-server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mlflow server did not answer on {uri} within 90 s:\n{tail}")
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        log.close()
