"""dvml: Dask + Vineyard as one in-memory data and compute system for deep learning.

Dask graphs preprocess and pack data into vineyard objects placed on chosen workers;
TensorFlow MultiWorkerMirroredStrategy trainers read their local partitions zero-copy.

``import dvml`` is fast and has no side effects: every public name is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dvml._version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Cluster": "dvml.cluster",
    "LocalCluster": "dvml.cluster",
    "WorkerInfo": "dvml.cluster",
    "connect": "dvml.cluster",
    "gpu_configuration": "dvml.cluster",
    "DvmlError": "dvml.exceptions",
    "DistributionRules": "dvml.placement",
    "Dataset": "dvml.store.datasets",
    "training_preprocessor": "dvml.preprocess.api",
    "validation_preprocessor": "dvml.preprocess.api",
    "fit": "dvml.train.fit",
    "fit_multiple": "dvml.train.fit_multiple",
    "run": "dvml.train.run",
    "RunResult": "dvml.train.run",
    "tf_dataset": "dvml.resolve.local_dataset",
    "ModelSelection": "dvml.train.fit_multiple",
    "evaluate": "dvml.train.predict",
    "predict": "dvml.train.predict",
    "predict_byom": "dvml.train.predict",
    "export_to_mlflow": "dvml.tracking.export",
    "Model": "dvml.train.model",
    "hyperband_schedule": "dvml.search.hyperband",
    "automl": "dvml.search.driver",
    "plot_history": "dvml.train.model",
    "model_configs": "dvml.train.model_selection",
    "model_selection_table": "dvml.train.model_selection",
    "describe_model_configs": "dvml.train.model_selection",
    "list_model_configs": "dvml.train.model_selection",
    "drop_model_configs": "dvml.train.model_selection",
    "load_keras_model": "dvml.registry",
    "list_architectures": "dvml.registry",
    "describe_architecture": "dvml.registry",
    "drop_architecture": "dvml.registry",
    "list_models": "dvml.registry",
    "lineage": "dvml.registry",
    "describe_model": "dvml.registry",
    "drop_model": "dvml.registry",
    "register_custom_function": "dvml.registry",
    "Registry": "dvml.registry",
}

# Deprecated spellings (docs/architecture.md, "Verbs of the public API"): they resolve for one
# release, warn when called, and are left out of __all__ and the reference.
_DEPRECATED: dict[str, str] = {
    "load_model_configs": "dvml.train.model_selection",
    "delete_model_configs": "dvml.train.model_selection",
    "show_architecture": "dvml.registry",
    "delete_architecture": "dvml.registry",
    "show_model": "dvml.registry",
    "delete_model": "dvml.registry",
}

# public sub-namespaces, imported on first use: dvml.datasets.list(), ...
_MODULES: dict[str, str] = {
    "datasets": "dvml.preprocess.datasets_api",
    "features": "dvml.features",
    "plan": "dvml.memory_plans",
}

__all__ = [
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

if TYPE_CHECKING:
    from dvml import features
    from dvml import memory_plans as plan
    from dvml.cluster import Cluster, LocalCluster, WorkerInfo, connect, gpu_configuration
    from dvml.exceptions import DvmlError
    from dvml.placement import DistributionRules
    from dvml.preprocess import datasets_api as datasets
    from dvml.preprocess.api import training_preprocessor, validation_preprocessor
    from dvml.registry import (
        Registry,
        describe_architecture,
        describe_model,
        drop_architecture,
        drop_model,
        lineage,
        list_architectures,
        list_models,
        load_keras_model,
        register_custom_function,
    )
    from dvml.resolve.local_dataset import tf_dataset
    from dvml.search.driver import automl
    from dvml.search.hyperband import hyperband_schedule
    from dvml.store.datasets import Dataset
    from dvml.tracking.export import export_to_mlflow
    from dvml.train.fit import fit
    from dvml.train.fit_multiple import ModelSelection, fit_multiple
    from dvml.train.model import Model, plot_history
    from dvml.train.model_selection import (
        describe_model_configs,
        drop_model_configs,
        list_model_configs,
        model_configs,
        model_selection_table,
    )
    from dvml.train.predict import evaluate, predict, predict_byom
    from dvml.train.run import RunResult, run


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _DEPRECATED:
        value = getattr(importlib.import_module(_DEPRECATED[name]), name)
    else:
        raise AttributeError(f"module 'dvml' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
