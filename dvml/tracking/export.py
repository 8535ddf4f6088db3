"""A registered model exported to MLflow's model registry (:func:`export_to_mlflow`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dvml._version import __version__
from dvml.exceptions import ArgumentError, ConfigError
from dvml.registry.database import Registry, open_registry
from dvml.tracking.mlflow_client import bounded_http, import_mlflow, tracking_uri


def export_to_mlflow(
    model: str,
    registered_model_name: str | None = None,
    registry: Registry | str | None = None,
    mlflow_uri: str | None = None,
) -> str:
    """Put a registered dvml model in MLflow's model registry, as a pyfunc model.

    The MLflow model predicts class values like ``dvml.predict(..., pred_type="response")``
    (:class:`dvml.tracking.pyfunc.ClassifierModel`): load it with
    ``mlflow.pyfunc.load_model(uri)`` and call ``.predict`` on an array of raw rows. Its
    signature names the input's shape; the class values and ``normalizing_const`` travel with
    it. It is logged in a run named ``export <model>`` of the configured experiment.

    Parameters
    ----------
    model : str
        The dvml model (a single-input, single-output classifier without custom functions).
    registered_model_name : str, optional
        Its name in MLflow's model registry (default: ``model``); a new version when it exists.
    registry : Registry or str, optional
        dvml's registry (default: the configured one).
    mlflow_uri : str, optional
        The tracking server (default: the config key ``tracking.mlflow-uri``).

    Returns
    -------
    str
        The MLflow model URI, ``models:/<name>/<version>``.
    """
    uri = mlflow_uri or tracking_uri()
    if uri is None:
        raise ConfigError(
            "export_to_mlflow needs an MLflow tracking server. Received: mlflow_uri=None and "
            "no tracking.mlflow-uri in the config. Pass mlflow_uri='http://host:5000' or set "
            "the key."
        )
    mlflow = import_mlflow()
    reg = open_registry(registry)
    record = reg.get_model(model, require=("model_arch", "class_values", "x_shapes"))
    summary = record["summary"]
    _check_exportable(model, summary)
    name = registered_model_name or model
    with tempfile.TemporaryDirectory(prefix="dvml-export-") as tmp, bounded_http():
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({
            "model_json": summary["model_arch"], "class_values": summary["class_values"],
            "normalizing_const": summary.get("normalizing_const"), "dvml_model": model,
        }))  # fmt: skip
        weights = Path(tmp) / "weights.npz"
        np.savez(weights, **{f"w{i}": w for i, w in enumerate(record["weights"])})
        before = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(uri)
        try:
            from mlflow.models import ModelSignature
            from mlflow.types import ColSpec, Schema, TensorSpec

            from dvml.tracking.pyfunc import ClassifierModel

            shape = (-1, *summary["x_shapes"][0])
            signature = ModelSignature(
                inputs=Schema([TensorSpec(np.dtype(np.float32), shape)]),
                outputs=Schema([ColSpec("string", "class_value"), ColSpec("double", "prob")]),
            )
            experiment = mlflow.set_experiment(_experiment())
            run = mlflow.start_run(
                experiment_id=experiment.experiment_id, run_name=f"export {model}",
                tags={"dvml.kind": "export"},
            )  # fmt: skip
            with run:
                info = mlflow.pyfunc.log_model(
                    name="model", python_model=ClassifierModel(),
                    artifacts={"spec": str(spec), "weights": str(weights)},
                    signature=signature, registered_model_name=name,
                    pip_requirements=[f"dvml=={__version__}"],
                )  # fmt: skip
        finally:
            mlflow.set_tracking_uri(before)
    return f"models:/{name}/{info.registered_model_version}"


def _experiment() -> str:
    from dvml import config

    return str(config.get("tracking.mlflow-experiment"))


def _check_exportable(model: str, summary: dict[str, Any]) -> None:
    problems = []
    if len(summary.get("x_shapes") or []) != 1:
        problems.append(f"it has {len(summary.get('x_shapes') or [])} inputs")
    if int(summary.get("dependent_count") or 1) != 1:
        problems.append(f"it has {summary.get('dependent_count')} outputs")
    if summary.get("object_table"):
        problems.append("it uses custom functions")
    if problems:
        raise ArgumentError(
            f"Model {model!r} cannot be exported to MLflow yet: {', '.join(problems)}. "
            "Received: a model that is not a single-input, single-output classifier without "
            "custom functions. Serve it with dvml.predict instead."
        )
