"""The client-side tables of tf-keras losses and metrics match the installed tf-keras."""

from __future__ import annotations

import inspect
import os

import pytest

from dvml.configs import keras_objects as ko

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras

    return tf_keras


@pytest.mark.parametrize(
    ("module", "table"), [("losses", ko.LOSS_CLASSES), ("metrics", ko.METRIC_CLASSES)]
)
def test_tables_match_the_signatures(keras, module, table):
    for name, (kwargs, required, _default_name) in table.items():
        cls = getattr(getattr(keras, module), name)
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert tuple(p.name for p in params) == kwargs, name
        assert tuple(p.name for p in params if p.default is p.empty) == required, name
        for arg in kwargs:
            assert arg in ko.ARGUMENT_KINDS, (name, arg)


def test_plain_names_resolve(keras):
    for name in ko.LOSS_NAMES:
        assert keras.losses.get(name) is not None, name
    for name in ko.METRIC_NAMES - {"accuracy", "acc", "crossentropy", "ce"}:
        assert keras.metrics.get(name) is not None, name


def test_optimizer_table_matches_the_signatures(keras):
    for name, kwargs in ko.OPTIMIZER_CLASSES.items():
        cls = getattr(keras.optimizers, name)
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        named = tuple(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
        assert named == kwargs, name


def test_every_optimizer_argument_the_client_accepts_builds(keras):
    from dvml.configs.optimizers import OPTIMIZER_CONFIG, build_optimizer

    samples = {
        "learning_rate": 0.01,
        "epsilon_1": 1e-30,
        "epsilon_2": 1e-3,
        "clip_threshold": 1.0,
        "learning_rate_power": -0.5,
        "beta_2_decay": -0.8,
    }
    for name, kwargs in ko.OPTIMIZER_CLASSES.items():
        for arg in kwargs:
            if arg not in OPTIMIZER_CONFIG:
                continue
            value = samples.get(
                arg,
                True
                if arg in {"nesterov", "amsgrad", "centered", "use_ema", "relative_step"}
                else 0.5,
            )
            if arg == "ema_overwrite_frequency":
                value = 2
            optimizer = build_optimizer({"class_name": name, "config": {arg: value}})
            assert type(optimizer).__name__ == name


_SAMPLES = {
    "str": "custom_name",
    "dtype": "float64",
    "reduction": "sum",
    "bool": True,
    "unit": 0.3,
    "unit_or_none": 0.3,
    "thresholds": [0.2, 0.6],
    "nonnegative": 1.5,
    "positive": 2.0,
    "int": -1,
    "positive_int": 3,
    "threshold_count": 50,
    "positive_int_or_none": 2,
    "nonnegative_int_or_none": 1,
    "int_or_none": 0,
    "nonnegative_int": 1,
    "int_list": [0, 1],
    "real_list_or_none": [1.0, 2.0, 3.0],
    "curve": "PR",
    "summation_method": "minoring",
    "average": "macro",
    "class_aggregation": "variance_weighted_average",
}
_REQUIRED = {
    "num_classes": 3,
    "target_class_ids": [0, 1],
    "recall": 0.5,
    "precision": 0.5,
    "specificity": 0.5,
    "sensitivity": 0.5,
}


@pytest.mark.parametrize("kind", ["loss", "metric"])
def test_every_argument_kind_the_client_accepts_builds(keras, kind):
    from dvml.configs import compile_kwargs

    table = ko.LOSS_CLASSES if kind == "loss" else ko.METRIC_CLASSES
    for name, (kwargs, required, _) in table.items():
        if name in ko.SPARSE_REPLACEMENTS:
            continue
        for arg in kwargs:
            config = {r: _REQUIRED[r] for r in required}
            config[arg] = _SAMPLES[ko.ARGUMENT_KINDS[arg]]
            if name == "AUC" and arg in ("label_weights", "num_labels"):
                config["multi_label"] = True
                config["num_labels"] = 3
            spec = {"class_name": name, "config": config}
            params = {"loss": spec} if kind == "loss" else {"metrics": [spec]}
            built = compile_kwargs(params)
            obj = built["loss"] if kind == "loss" else built["metrics"][0]
            assert type(obj).__name__ == name, (name, arg)
