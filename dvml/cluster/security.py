"""Dask TLS for the clusters dvml starts: who may talk to the scheduler and the workers.

A Dask scheduler runs any function a connected client sends, as the user who started it. On
loopback TCP every user of the machine can connect, so :class:`~dvml.LocalCluster` and
``dvml cluster up`` serve Dask over TLS with client certificates by default (config
``dvml.cluster.tls``): one key and a self-signed certificate, generated with ``openssl`` into
the cluster's 0700 directory, serve as the CA and as the certificate of the scheduler, the
workers and the clients. A peer without the key is refused; only the owner can read it.

``dvml cluster up`` records the certificate paths in its state file; :func:`dvml.connect` and
the CLI find them there (:func:`recorded_security`). Everything else (jobs, workflows, the
LocalCluster's own client, trainers, which never open a client) connects through those two.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dvml import config
from dvml.cluster.state import read_state, same_process
from dvml.exceptions import ArgumentTypeError, ClusterStartError

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = [
    "cluster_security",
    "create_certificates",
    "recorded_security",
    "resolve_security",
    "tls_enabled",
]

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"


def tls_enabled(tls: bool | None = None) -> bool:
    """``tls`` when given, else config ``dvml.cluster.tls`` (default True)."""
    value = config.get("cluster.tls", tls)
    if not isinstance(value, bool):
        raise ArgumentTypeError(
            f"tls must be True or False (config dvml.cluster.tls). Received: {value!r}."
        )
    return value


def create_certificates(directory: str | os.PathLike[str]) -> dict[str, str]:
    """Write a private key (0600) and a self-signed certificate into ``directory`` (0700).

    The certificate is its own CA, as in ``distributed.security.Security.temporary()`` (which
    needs the ``cryptography`` package): Dask checks that a peer's certificate is signed by
    the CA, not its host name, so one certificate serves every role of one cluster.

    Returns
    -------
    dict
        ``{"ca": path, "cert": path, "key": path}`` (``ca`` and ``cert`` are one file).
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ClusterStartError(
            "Dask TLS (config dvml.cluster.tls: true, the default) needs the `openssl` command "
            "to create the cluster's certificate, and it is not on PATH. Install OpenSSL, or "
            "turn TLS off with dvml.cluster.tls: false (then every local user can run code as "
            "you through the scheduler)."
        )
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    cert = os.path.join(directory, CERT_FILE)
    key = os.path.join(directory, KEY_FILE)
    argv = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "3650", "-subj", "/CN=dvml-cluster",
        "-addext", "subjectAltName=DNS:dvml-cluster", "-keyout", key, "-out", cert,
    ]  # fmt: skip
    # The key file exists (0600) before openssl writes into it: never readable by others.
    os.close(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise ClusterStartError(
            f"openssl could not create the cluster's TLS certificate (exit code "
            f"{out.returncode}): {out.stderr.strip()[-500:]}. Check the OpenSSL installation, "
            "or turn TLS off with dvml.cluster.tls: false."
        )
    os.chmod(key, 0o600)
    return {"ca": cert, "cert": cert, "key": key}


def cluster_security(paths: Mapping[str, str]) -> Security:
    """The :class:`distributed.security.Security` of every role, from certificate paths."""
    from distributed.security import Security

    ca, cert, key = paths["ca"], paths["cert"], paths["key"]
    return Security(
        require_encryption=True,
        tls_ca_file=ca,
        tls_client_cert=cert,
        tls_client_key=key,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
    )


def recorded_security(
    address: str | None = None, state_dir: str | os.PathLike[str] | None = None
) -> Security | None:
    """The Security of the running cluster recorded by ``dvml cluster up``, if any.

    With ``address``, only when the recorded cluster serves that scheduler address.
    """
    import pathlib

    directory = pathlib.Path(state_dir).expanduser() if state_dir else config.state_dir()
    try:
        state = read_state(directory)
    except Exception:  # an unreadable state file: the caller reports the connection error
        return None
    if state is None or not state.get("tls"):
        return None
    if address is not None and state.get("scheduler_address") != address:
        return None
    if not same_process(int(state["pid"]), state.get("start_time")):
        return None
    return cluster_security(state["tls"])


def resolve_security(security: Any, address: str) -> Any:
    """What :func:`dvml.connect` passes to ``distributed.Client`` as ``security``.

    A Security object is used as given; a mapping of certificate paths (``ca``, ``cert``,
    ``key``) becomes one; None looks up the cluster recorded by ``dvml cluster up`` for
    ``address``, else leaves it to Dask's configuration (``distributed.comm.tls.*``).
    """
    from distributed.security import Security

    if security is None:
        return recorded_security(address)
    if isinstance(security, Security):
        return security
    if isinstance(security, Mapping) and {"ca", "cert", "key"} <= set(security):
        return cluster_security({k: str(security[k]) for k in ("ca", "cert", "key")})
    raise ArgumentTypeError(
        "security must be a distributed.security.Security, a mapping with the paths 'ca', "
        f"'cert' and 'key', or None. Received: {type(security).__name__} {security!r}."
    )
