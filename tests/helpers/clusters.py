"""Clusters a test starts for itself, and running one function on one chosen worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tests.helpers.processes import assert_no_new_processes, child_processes

if TYPE_CHECKING:
    import dvml

__all__ = ["digits_elastic_env", "on_worker", "running_cluster"]


@contextmanager
def running_cluster(**kwargs: Any) -> Iterator[dvml.LocalCluster]:
    """A ``dvml.LocalCluster(**kwargs)`` that is always closed, then checked for leaks.

    ``set_as_default`` is False unless given, so that the cluster never becomes the default
    client of other tests. After ``close()``, every process the cluster started must be gone
    (:func:`assert_no_new_processes`); the check is skipped when the body raised, so that the
    test's own failure is the one reported. The ``local_cluster`` fixture of conftest is this,
    for a test's duration.
    """
    import dvml

    kwargs.setdefault("set_as_default", False)
    before = child_processes()
    cluster = dvml.LocalCluster(**kwargs)
    try:
        yield cluster
    finally:
        cluster.close()
    assert_no_new_processes(before)


def on_worker(
    cluster: dvml.LocalCluster,
    worker: dvml.WorkerInfo,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 60,
) -> Any:
    """Run ``fn(*args)`` on exactly ``worker`` (never elsewhere) and return its result."""
    future = cluster.client.submit(
        fn, *args, workers=[worker.address], allow_other_workers=False, pure=False
    )
    return future.result(timeout=timeout)


def tls_environment(cluster: Any) -> dict[str, str]:
    """Environment variables that give a ``python -m dvml`` subprocess this cluster's TLS
    certificate through Dask's configuration (``distributed.comm.tls.*``); empty without TLS."""
    files = getattr(cluster, "tls_files", None)
    if not files:
        return {}
    return {
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": files["ca"],
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": files["cert"],
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": files["key"],
    }


@contextmanager
def digits_elastic_env(
    cluster: Any, tmp: Any, prefix: str, rows: int, buffer_size: int, model_json: str
) -> Iterator[dict[str, Any]]:
    """What the elastic fit tests share: on ``cluster`` (a test's own, which a killed or added
    worker changes), the first ``rows`` digits packed as ``<prefix>_digits`` in buffers of
    ``buffer_size`` and the rest as ``<prefix>_val``, a registry in ``tmp`` holding
    ``model_json``; the ``settings`` give the cluster's state directory under ``tmp``."""
    import dask

    import dvml
    from dvml.examples import digits_frame

    frame = digits_frame()
    settings = {"dvml.cluster.state-dir": str(tmp / "state")}
    client = cluster.client
    with dask.config.set(settings):
        train = dvml.training_preprocessor(
            frame.iloc[:rows], y="label", x="pixels", normalizing_const=16.0,
            buffer_size=buffer_size, name=f"{prefix}_digits", client=client,
        )  # fmt: skip
        dvml.validation_preprocessor(
            frame.iloc[rows:], y="label", x="pixels", training=f"{prefix}_digits",
            name=f"{prefix}_val", client=client,
        )  # fmt: skip
    registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
    arch = dvml.load_keras_model(model_json, name="model", registry=registry)
    try:
        yield {"cluster": cluster, "client": client, "registry": registry, "arch": arch,
               "state": tmp / "state", "settings": settings, "rows": train.rows}  # fmt: skip
    finally:
        registry.close()
