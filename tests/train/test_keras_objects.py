"""The client-side tables of tf-keras losses and metrics match the installed tf-keras."""

from __future__ import annotations

import inspect
import os

import pytest

from dvml.train import keras_objects as ko

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
