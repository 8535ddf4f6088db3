"""A real S3-compatible server for the tests: moto's server on 127.0.0.1, a free port.

:func:`running_s3_server` starts ``moto_server`` with authentication enforced (its first three
requests create an IAM user with an access key and a read-write policy; every later request
must be signed with that key), so that a wrong key is refused as a real store refuses it. The
server is stopped by its pid.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.helpers.polling import poll_for

__all__ = ["S3Server", "running_s3_server"]

_SETUP_REQUESTS = 3  # create_user, put_user_policy, create_access_key


@dataclasses.dataclass
class S3Server:
    """A running server: its endpoint, a valid key and the storage options that use it."""

    endpoint: str
    key: str
    secret: str
    pid: int

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": self.key, "secret": self.secret,
                "client_kwargs": {"endpoint_url": self.endpoint}}  # fmt: skip

    def filesystem(self) -> Any:
        """An s3fs file system of its own (no instance cache shared with the code tested)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (if needed) and return ``s3://name``."""
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)
        return f"s3://{name}"

    def upload(self, local: str | os.PathLike[str], url: str) -> None:
        """Copy a local file or folder to ``url`` (``s3://bucket/prefix``)."""
        self.filesystem().put(os.fspath(local), url.removeprefix("s3://"), recursive=True)


def _moto_server() -> str:
    found = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if found is None:
        raise RuntimeError("moto_server is not installed: pip install 'moto[server]'")
    return found


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on a free loopback port; stop it (by pid) on exit."""
    import urllib.error
    import urllib.request

    import boto3

    from dvml.cluster.processes import free_port

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS)}
    proc = subprocess.Popen(
        [_moto_server(), "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                    return True
            except urllib.error.HTTPError:
                return True  # it answers
            except OSError:
                return False

        if not poll_for(up, 30, interval=0.1):
            raise RuntimeError(f"moto_server did not answer on {endpoint} within 30 s")
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")  # fmt: skip
        iam.create_user(UserName="dvml")
        policy = {"Version": "2012-10-17",
                  "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}  # fmt: skip
        iam.put_user_policy(UserName="dvml", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="dvml")["AccessKey"]
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
