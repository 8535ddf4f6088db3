"""The public surface is pinned, and ``import dvml`` stays light and free of side effects."""

from __future__ import annotations

import json
import subprocess
import sys

import dvml

PUBLIC = [
    "Cluster",
    "Dataset",
    "DistributionRules",
    "DvmlError",
    "LocalCluster",
    "Model",
    "ModelSelection",
    "Registry",
    "RunResult",
    "WorkerInfo",
    "__version__",
    "automl",
    "connect",
    "datasets",
    "describe_architecture",
    "describe_model",
    "describe_model_configs",
    "drop_architecture",
    "drop_model",
    "drop_model_configs",
    "evaluate",
    "export_to_mlflow",
    "features",
    "fit",
    "fit_multiple",
    "gpu_configuration",
    "hyperband_schedule",
    "lineage",
    "list_architectures",
    "list_model_configs",
    "list_models",
    "load_keras_model",
    "model_configs",
    "model_selection_table",
    "plan",
    "plot_history",
    "predict",
    "predict_byom",
    "register_custom_function",
    "run",
    "tf_dataset",
    "training_preprocessor",
    "validation_preprocessor",
]


def test_all_is_pinned() -> None:
    assert sorted(dvml.__all__) == sorted(PUBLIC)


def test_every_public_name_resolves() -> None:
    for name in dvml.__all__:
        assert getattr(dvml, name) is not None, name


def test_import_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, json, dvml; "
        "print(json.dumps(sorted(m for m in ('tensorflow', 'tf_keras', 'dask', 'distributed', "
        "'vineyard', 'pandas', 'sqlalchemy') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        dvml.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("dvml.no_such_thing resolved")
