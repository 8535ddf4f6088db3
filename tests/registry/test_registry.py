"""Tests of dvml.registry on real SQLite files: architectures, models, custom functions,
concurrent writers and writers killed mid-transaction."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from typing import Any

import dask.config
import numpy as np
import pandas as pd
import pytest

import dvml.config
import dvml.registry
from dvml import tf_runtime
from dvml.exceptions import RegistryError, RegistryNotFoundError
from dvml.registry import Registry, database, keras_json
from dvml.registry.custom import check_source, compile_function
from tests.helpers import poll_for

# ----------------------------------------------------------------------------- helpers


def _dense(units: int, name: str = "dense", **config: Any) -> dict[str, Any]:
    return {"class_name": "Dense", "config": {"name": name, "units": units, **config}}


def sequential_json(input_dim: int = 4, units: int = 3) -> str:
    layers = [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, input_dim]}},
        _dense(8, "hidden"),
        _dense(units, "out"),
        {"class_name": "Activation", "config": {"activation": "softmax"}},
    ]
    return json.dumps({"class_name": "Sequential", "config": {"name": "seq", "layers": layers}})


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture
def reg(url):
    with Registry(url) as registry:
        yield registry


@pytest.fixture
def arch_id(reg) -> int:
    return reg.add_architecture(sequential_json(), None, name="mlp", description="a small MLP")


def _weights(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(4, 8)).astype("float32"), np.zeros(8, "float32")]


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _raw(url: str, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(_sqlite_path(url), timeout=30) as conn:
        return conn.execute(sql).fetchall()


# ----------------------------------------------------------------------------- opening


def test_default_url_comes_from_config(tmp_path):
    dvml.config.defaults()
    state = tmp_path / "state" / "nested"
    with dask.config.set({"dvml.cluster.state-dir": str(state), "dvml.registry.url": None}):
        assert dvml.config.registry_url() == f"sqlite:///{state / 'registry.db'}"
        with Registry() as registry:
            assert registry.url == f"sqlite:///{state / 'registry.db'}"
            assert registry.list_models().empty
    assert (state / "registry.db").exists()


def test_configured_url_is_used(tmp_path):
    dvml.config.defaults()
    path = tmp_path / "configured.db"
    with dask.config.set({"dvml.registry.url": f"sqlite:///{path}"}), Registry() as registry:
        registry.add_architecture(sequential_json())
    assert path.exists()


def test_sqlite_runs_in_wal_mode_with_busy_timeout(reg, url):
    with reg.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    assert _raw(url, "PRAGMA journal_mode") == [("wal",)]


def test_tables_exist(reg, url):
    tables = {row[0] for row in _raw(url, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"model_arch", "models", "model_iterations", "custom_functions"} <= tables


def test_reopening_keeps_data(url):
    with Registry(url) as first:
        arch = first.add_architecture(sequential_json())
    with Registry(url) as second:
        assert second.get_architecture(arch)["id"] == arch


def test_in_memory_url_works():
    with Registry("sqlite://") as registry:
        arch = registry.add_architecture(sequential_json())
        registry.save_model("m", arch, _weights())
        assert registry.model_exists("m")


@pytest.mark.parametrize(
    ("bad", "error"), [(42, TypeError), ("", TypeError), ("::nope", ValueError)]
)
def test_bad_url(bad, error):
    with pytest.raises(error, match="url"):
        Registry(bad)


def test_repr_hides_password():
    registry = Registry.__new__(Registry)
    import sqlalchemy as sa

    registry._url = sa.make_url("postgresql://user:secret@host/db")
    assert "secret" not in repr(registry)
    assert "secret" not in registry.url


def test_unusable_path_is_a_registry_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RegistryError, match="directory"):
        Registry(f"sqlite:///{blocker / 'sub' / 'registry.db'}")
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(RegistryError, match="failed"):
        Registry(f"sqlite:///{tmp_path / 'dir.db'}")


# ----------------------------------------------------------------------------- architectures


def test_add_list_get_delete_architecture(reg):
    weights = _weights()
    first = reg.add_architecture(sequential_json(), weights, name="mlp", description="d")
    second = reg.add_architecture(sequential_json(input_dim=10, units=2))
    assert second > first

    table = reg.list_architectures()
    assert list(table.columns) == [
        "id",
        "name",
        "description",
        "input_shapes",
        "output_shape",
        "has_weights",
        "created_at",
    ]
    assert table["id"].tolist() == [first, second]
    assert table["has_weights"].tolist() == [True, False]
    assert table["input_shapes"].tolist() == [[[4]], [[10]]]
    assert table["output_shape"].tolist() == [[3], [2]]
    assert str(table["created_at"].dt.tz) == "UTC"

    arch = reg.get_architecture(first)
    assert arch["name"] == "mlp" and arch["description"] == "d"
    assert arch["model_json"] == sequential_json()
    assert arch["weights_format"] == "npz"
    for got, expected in zip(arch["weights"], weights, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert reg.get_architecture(second)["weights"] is None
    assert reg.get_architecture(np.int64(second))["id"] == second

    reg.drop_architecture(first)
    assert reg.list_architectures()["id"].tolist() == [second]
    with pytest.raises(RegistryNotFoundError, match=rf"id {first}.*list_architectures"):
        reg.get_architecture(first)
    with pytest.raises(RegistryNotFoundError, match=rf"arch_id={first}"):
        reg.drop_architecture(first)


def test_list_is_empty_frame_with_columns(reg):
    assert reg.list_architectures().empty
    assert "input_shapes" in reg.list_architectures().columns
    assert list(reg.list_models().columns)[:3] == ["id", "name", "arch_id"]
    assert list(reg.list_custom_functions().columns)[:3] == ["id", "name", "kind"]


def test_architecture_ids_are_never_reused(reg):
    first = reg.add_architecture(sequential_json())
    reg.drop_architecture(first)
    assert reg.add_architecture(sequential_json()) > first


@pytest.mark.parametrize(
    ("model_json", "error", "match"),
    [
        ("{not json", ValueError, "not valid JSON"),
        ("[1, 2]", ValueError, "'config' key"),
        ('{"class_name": "Sequential"}', ValueError, "'config' key"),
        (b'{"config": {}}', TypeError, "JSON string"),
        (None, TypeError, "JSON string"),
    ],
)
def test_bad_model_json(reg, model_json, error, match):
    with pytest.raises(error, match=match):
        reg.add_architecture(model_json)
    assert reg.list_architectures().empty


def test_bad_architecture_arguments(reg):
    with pytest.raises(TypeError, match="arch_id"):
        reg.get_architecture("1")
    with pytest.raises(TypeError, match="arch_id"):
        reg.get_architecture(True)
    with pytest.raises(TypeError, match="name"):
        reg.add_architecture(sequential_json(), name=3)
    with pytest.raises(TypeError, match="pickle"):
        reg.add_architecture(sequential_json(), [np.array([None], dtype=object)])
    assert reg.list_architectures().empty


# ----------------------------------------------------------------------------- Keras JSON


def _functional(
    inputs: list[tuple[str, list[Any]]], layers: list[dict], outputs: list[str]
) -> dict:
    input_layers = [
        {"class_name": "InputLayer", "name": n, "config": {"name": n, "batch_input_shape": s}}
        for n, s in inputs
    ]
    return {
        "class_name": "Functional",
        "config": {
            "layers": input_layers + layers,
            "input_layers": [[n, 0, 0] for n, _ in inputs],
            "output_layers": [[n, 0, 0] for n in outputs],
        },
    }


@pytest.mark.parametrize(
    ("model", "inputs", "output"),
    [
        (json.loads(sequential_json(5, 7)), [[5]], [7]),
        # first layer carries the shape (older Keras 2)
        (
            {
                "class_name": "Sequential",
                "config": {"layers": [_dense(2, batch_input_shape=[None, 3])]},
            },
            [[3]],
            [2],
        ),
        # Keras 3: batch_shape
        (
            {
                "class_name": "Sequential",
                "config": {
                    "layers": [
                        {"class_name": "InputLayer", "config": {"batch_shape": [None, 28, 28, 1]}},
                        {"class_name": "Flatten", "config": {}},
                        _dense(10),
                    ]
                },
            },
            [[28, 28, 1]],
            [10],
        ),
        # very old Keras: config is the list of layers
        (
            {"class_name": "Sequential", "config": [_dense(4, batch_input_shape=[None, 6])]},
            [[6]],
            [4],
        ),
        # build_input_shape only
        (
            {
                "class_name": "Sequential",
                "config": {"layers": [_dense(1)], "build_input_shape": [None, 9]},
            },
            [[9]],
            [1],
        ),
        # unbuilt: nothing known
        ({"class_name": "Sequential", "config": {"layers": [_dense(1)]}}, None, [1]),
        # ends in a layer that changes the shape
        (
            {
                "class_name": "Sequential",
                "config": {
                    "layers": [
                        _dense(4, batch_input_shape=[None, 2]),
                        {"class_name": "Reshape", "config": {}},
                    ]
                },
            },
            [[2]],
            None,
        ),
        ({"class_name": "Sequential", "config": {"layers": []}}, None, None),
        ({"config": {}}, None, None),
        # variable-length input dimension
        (
            {
                "class_name": "Sequential",
                "config": {"layers": [_dense(3, batch_input_shape=[None, None, 8])]},
            },
            [[None, 8]],
            [3],
        ),
    ],
)
def test_shapes_from_sequential_json(model, inputs, output):
    assert keras_json.input_shapes(model) == inputs
    assert keras_json.output_shape(model) == output


def test_shapes_from_functional_json():
    dense = {**_dense(5, "head"), "name": "head", "inbound_nodes": [[["in", 0, 0, {}]]]}
    act = {
        "class_name": "Softmax",
        "name": "prob",
        "config": {"name": "prob"},
        "inbound_nodes": [[["head", 0, 0, {}]]],
    }
    model = _functional([("in", [None, 12])], [dense, act], ["prob"])
    assert keras_json.input_shapes(model) == [[12]]
    assert keras_json.output_shape(model) == [5]


def test_shapes_from_multi_input_functional_json():
    dense = {**_dense(2, "out"), "name": "out"}
    model = _functional([("a", [None, 3]), ("b", [None, 4, 4])], [dense], ["out"])
    assert keras_json.input_shapes(model) == [[3], [4, 4]]
    assert keras_json.output_shape(model) == [2]
    two_outputs = _functional([("a", [None, 3])], [dense], ["out", "a"])
    assert keras_json.output_shape(two_outputs) is None


def test_shapes_from_keras3_functional_json():
    history = {"class_name": "__keras_tensor__", "config": {"keras_history": ["head", 0, 0]}}
    model = {
        "class_name": "Functional",
        "config": {
            "layers": [
                {
                    "class_name": "InputLayer",
                    "name": "x",
                    "config": {"name": "x", "batch_shape": [None, 6]},
                },
                {**_dense(3, "head"), "name": "head"},
                {
                    "class_name": "Activation",
                    "name": "act",
                    "config": {"name": "act"},
                    "inbound_nodes": [{"args": [history], "kwargs": {}}],
                },
            ],
            "input_layers": ["x", 0, 0],
            "output_layers": ["act", 0, 0],
        },
    }
    assert keras_json.input_shapes(model) == [[6]]
    assert keras_json.output_shape(model) == [3]


def test_functional_without_input_layers_key_uses_input_layer_class():
    model = _functional([("in", [None, 2])], [{**_dense(1, "o"), "name": "o"}], ["o"])
    del model["config"]["input_layers"]
    assert keras_json.input_shapes(model) == [[2]]


@pytest.mark.tf
def test_shapes_from_real_tf_keras_json():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    seq = keras.Sequential(
        [keras.layers.Dense(8, input_shape=(4,)), keras.layers.Dense(3), keras.layers.Softmax()]
    )
    a, b = keras.Input((5,), name="a"), keras.Input((2, 2), name="b")
    merged = keras.layers.Concatenate()([a, keras.layers.Flatten()(b)])
    out = keras.layers.Dropout(0.1)(keras.layers.Dense(6)(merged))
    functional = keras.Model([a, b], out)
    for model, inputs, output in ((seq, [[4]], [3]), (functional, [[5], [2, 2]], [6])):
        parsed = keras_json.parse_model_json(model.to_json())
        assert keras_json.input_shapes(parsed) == inputs
        assert keras_json.output_shape(parsed) == output


# ----------------------------------------------------------------------------- models


ITERATIONS = [
    {
        "iteration": 1,
        "training_loss": 0.9,
        "training_metrics": {"accuracy": 0.5},
        "validation_loss": 1.0,
        "validation_metrics": {"accuracy": 0.4},
        "elapsed_s": 1.5,
    },
    {
        "iteration": 2,
        "training_loss": np.float32(0.5),
        "training_metrics": {"accuracy": np.float64(0.8)},
    },
]


def test_save_get_list_model(reg, arch_id):
    weights = _weights()
    summary = {"loss": np.float32(0.25), "class_values": np.array([0, 1, 2]), "epochs": 2}
    model_id = reg.save_model("iris", arch_id, weights, summary, ITERATIONS)
    assert isinstance(model_id, int)
    assert reg.model_exists("iris") and not reg.model_exists("other")

    model = reg.get_model("iris")
    assert model["id"] == model_id and model["arch_id"] == arch_id
    assert model["version"] == 1
    assert model["summary"] == {"loss": 0.25, "class_values": [0, 1, 2], "epochs": 2}
    assert model["created_at"].tzinfo is not None
    for got, expected in zip(model["weights"], weights, strict=True):
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == expected.dtype

    assert reg.model_summary("iris") == model["summary"]
    table = reg.list_models()
    assert table.loc[0, "name"] == "iris" and table.loc[0, "n_iterations"] == 2
    assert "weights" not in table.columns

    iterations = reg.model_iterations("iris")
    assert iterations["iteration"].tolist() == [1, 2]
    assert iterations.loc[0, "training_metrics"] == {"accuracy": 0.5}
    assert iterations.loc[1, "training_metrics"] == {"accuracy": 0.8}
    assert iterations.loc[0, "elapsed_s"] == 1.5
    assert iterations.loc[1, "training_loss"] == pytest.approx(0.5)
    assert pd.isna(iterations.loc[1, "validation_loss"])


def test_iteration_defaults_to_position(reg, arch_id):
    reg.save_model("m", arch_id, _weights(), iterations=[{"training_loss": 1.0}, {}])
    assert reg.model_iterations("m")["iteration"].tolist() == [1, 2]


def test_existing_name_needs_replace(reg, arch_id, url):
    reg.save_model("m", arch_id, _weights(0), {"v": 1}, ITERATIONS)
    with pytest.raises(RegistryError, match=r"exists.*replace=True"):
        reg.save_model("m", arch_id, _weights(1), {"v": 2})
    assert reg.get_model("m")["summary"] == {"v": 1}


def test_replace_bumps_version_and_replaces_iterations(reg, arch_id):
    first = reg.save_model("m", arch_id, _weights(0), {"v": 1}, ITERATIONS)
    created = reg.get_model("m")["created_at"]
    second = reg.save_model("m", arch_id, _weights(1), {"v": 2}, [{"iteration": 7}], replace=True)
    assert second == first
    model = reg.get_model("m")
    assert model["version"] == 2 and model["summary"] == {"v": 2}
    assert model["created_at"] == created and model["updated_at"] >= created
    np.testing.assert_array_equal(model["weights"][0], _weights(1)[0])
    assert reg.model_iterations("m")["iteration"].tolist() == [7]
    reg.save_model("m", arch_id, _weights(2), replace=True)
    assert reg.get_model("m")["version"] == 3
    assert reg.model_iterations("m").empty


def test_replace_false_on_new_name_and_replace_true_on_new_name(reg, arch_id):
    assert reg.save_model("a", arch_id, _weights(), replace=True) != reg.save_model(
        "b", arch_id, _weights()
    )


def test_save_needs_an_existing_architecture(reg, url):
    with pytest.raises(RegistryNotFoundError, match=r"id 99.*list_architectures"):
        reg.save_model("m", 99, _weights(), iterations=ITERATIONS)
    assert _raw(url, "SELECT COUNT(*) FROM models") == [(0,)]
    assert _raw(url, "SELECT COUNT(*) FROM model_iterations") == [(0,)]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": ""}, ValueError, "name"),
        ({"name": "x" * 256}, ValueError, "name"),
        ({"name": 5}, TypeError, "name"),
        ({"arch_id": "1"}, TypeError, "arch_id"),
        ({"weights": None}, TypeError, "weights"),
        ({"weights": [np.array([object()])]}, TypeError, "pickle"),
        ({"summary": [1]}, TypeError, "summary"),
        ({"summary": {"f": print}}, TypeError, "summary"),
        ({"iterations": "x"}, TypeError, "iterations"),
        ({"iterations": [1]}, TypeError, r"iterations\[0\]"),
        ({"iterations": [{"loss": 1}]}, ValueError, "unknown keys"),
        ({"iterations": [{"iteration": 1}, {"iteration": 1}]}, ValueError, "iteration"),
        ({"iterations": [{"iteration": -1}]}, ValueError, "iteration"),
        ({"iterations": [{"training_loss": "low"}]}, TypeError, "training_loss"),
        ({"iterations": [{"training_metrics": [1]}]}, TypeError, "training_metrics"),
        ({"iterations": [{"elapsed_s": -1.0}]}, ValueError, "elapsed_s"),
    ],
)
def test_bad_save_arguments_write_nothing(reg, arch_id, url, kwargs, error, match):
    arguments = {"name": "m", "arch_id": arch_id, "weights": _weights(), **kwargs}
    with pytest.raises(error, match=match):
        reg.save_model(**arguments)
    assert _raw(url, "SELECT COUNT(*) FROM models") == [(0,)]


def test_failure_inside_the_transaction_rolls_back(reg, arch_id, url, monkeypatch):
    reg.save_model("keep", arch_id, _weights(0), {"v": 1}, ITERATIONS)

    def broken(conn, model_id, rows):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(database, "_insert_iterations", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        reg.save_model("new", arch_id, _weights(), iterations=ITERATIONS)
    with pytest.raises(RuntimeError, match="disk on fire"):
        reg.save_model("keep", arch_id, _weights(1), {"v": 2}, ITERATIONS, replace=True)
    monkeypatch.undo()
    assert not reg.model_exists("new")
    kept = reg.get_model("keep")
    assert kept["version"] == 1 and kept["summary"] == {"v": 1}
    assert reg.model_iterations("keep")["iteration"].tolist() == [1, 2]


def test_not_found_model_errors_name_it_and_say_how_to_list(reg):
    for call in (reg.get_model, reg.model_summary, reg.model_iterations, reg.drop_model):
        with pytest.raises(RegistryNotFoundError, match=r"'ghost'.*list_models"):
            call("ghost")
    with pytest.raises(LookupError):
        reg.get_model("ghost")


def test_delete_model_removes_iterations(reg, arch_id, url):
    reg.save_model("m", arch_id, _weights(), iterations=ITERATIONS)
    reg.save_model("other", arch_id, _weights(), iterations=ITERATIONS[:1])
    reg.drop_model("m")
    assert not reg.model_exists("m")
    assert _raw(url, "SELECT COUNT(*) FROM model_iterations") == [(1,)]


def test_deleting_an_architecture_keeps_its_models(reg, arch_id):
    reg.save_model("m", arch_id, _weights())
    reg.drop_architecture(arch_id)
    model = reg.get_model("m")
    assert model["arch_id"] == arch_id
    assert len(model["weights"]) == 2
    with pytest.raises(RegistryNotFoundError):
        reg.get_architecture(model["arch_id"])


def test_corrupt_weights_blob_is_a_registry_error(reg, arch_id, url):
    reg.save_model("m", arch_id, _weights())
    with sqlite3.connect(_sqlite_path(url)) as conn:
        conn.execute("UPDATE models SET weights = X'00010203'")
    with pytest.raises(RegistryError, match="cannot be read"):
        reg.get_model("m")
    with sqlite3.connect(_sqlite_path(url)) as conn:
        conn.execute("UPDATE models SET weights_format = 'pickle'")
    with pytest.raises(RegistryError, match="format 'pickle'"):
        reg.get_model("m")


# ----------------------------------------------------------------------------- custom functions


GOOD_SOURCE = textwrap.dedent(
    """
    import tensorflow as tf
    import numpy as np


    def scaled_mae(y_true, y_pred):
        \"\"\"Mean absolute error times two.\"\"\"
        def helper(x):
            return x * 2
        return helper(tf.reduce_mean(tf.abs(y_true - y_pred)))
    """
)


class FakeTf:
    """Stands in for TensorFlow in tests that only check the plumbing."""

    @staticmethod
    def reduce_mean(x):
        return np.mean(x)

    @staticmethod
    def abs(x):
        return np.abs(x)


def test_register_list_load_delete_custom_function(reg, url, monkeypatch):
    function_id = reg.register_custom_function("scaled_mae", GOOD_SOURCE, "metric", "2 x MAE")
    assert isinstance(function_id, int)
    table = reg.list_custom_functions()
    assert table.loc[0, "name"] == "scaled_mae" and table.loc[0, "kind"] == "metric"
    assert table.loc[0, "source"] == GOOD_SOURCE
    # stored as text, never as pickled bytes
    assert _raw(url, "SELECT typeof(source), source FROM custom_functions") == [
        ("text", GOOD_SOURCE)
    ]

    monkeypatch.setattr(tf_runtime, "tensorflow", lambda: FakeTf)
    functions = reg.load_custom_objects(["scaled_mae"])
    assert list(functions) == ["scaled_mae"]
    assert functions["scaled_mae"](np.array([1.0, 2.0]), np.array([2.0, 4.0])) == 3.0
    assert reg.load_custom_objects("scaled_mae")["scaled_mae"].__name__ == "scaled_mae"
    assert reg.load_custom_objects([]) == {}

    reg.drop_custom_function("scaled_mae")
    assert reg.list_custom_functions().empty
    with pytest.raises(RegistryNotFoundError, match=r"'scaled_mae'.*list_custom_functions"):
        reg.drop_custom_function("scaled_mae")


def test_custom_function_sources(reg):
    reg.register_custom_function("scaled_mae", GOOD_SOURCE)
    assert reg.custom_function_sources(["scaled_mae"]) == {"scaled_mae": GOOD_SOURCE}
    assert reg.custom_function_sources("scaled_mae") == {"scaled_mae": GOOD_SOURCE}
    assert reg.custom_function_sources([]) == {}
    with pytest.raises(RegistryNotFoundError, match="'other'"):
        reg.custom_function_sources(["other"])
    with pytest.raises(ValueError, match="identifier"):
        reg.custom_function_sources(["no such"])


def test_load_missing_custom_functions_names_them(reg, monkeypatch):
    reg.register_custom_function("scaled_mae", GOOD_SOURCE)
    monkeypatch.setattr(tf_runtime, "tensorflow", lambda: pytest.fail("TF must not load"))
    with pytest.raises(RegistryNotFoundError, match=r"'nope', 'gone'.*list_custom_functions"):
        reg.load_custom_objects(["scaled_mae", "nope", "gone"])


def test_custom_function_replace(reg):
    other = GOOD_SOURCE.replace("x * 2", "x * 3")
    first = reg.register_custom_function("scaled_mae", GOOD_SOURCE)
    with pytest.raises(RegistryError, match="replace=True"):
        reg.register_custom_function("scaled_mae", other)
    assert reg.register_custom_function("scaled_mae", other, replace=True) == first
    assert reg.list_custom_functions().loc[0, "source"] == other


def test_bad_kind(reg):
    with pytest.raises(ValueError, match="kind"):
        reg.register_custom_function("scaled_mae", GOOD_SOURCE, kind="optimizer")


BAD_SOURCES = [
    ("import os\ndef f(y_true, y_pred):\n    return 0\n", "imports 'os'"),
    ("import tensorflow\ndef f(y_true, y_pred):\n    return 0\n", "imports 'tensorflow'"),
    ("import numpy as tf\ndef f(y_true, y_pred):\n    return 0\n", "imports 'numpy'"),
    ("from tensorflow import math\ndef f(y_true, y_pred):\n    return 0\n", "ImportFrom"),
    ("__import__('os').system('touch {m}')\ndef f(y_true, y_pred):\n    return 0\n", "Expr"),
    ("def f(y_true, y_pred):\n    return 0\nf(1, 2)\n", "Expr"),
    ("x = 1\ndef f(y_true, y_pred):\n    return x\n", "Assign"),
    ('"""doc"""\ndef f(y_true, y_pred):\n    return 0\n', "Expr"),
    ("@__import__('os').system\ndef f(y_true, y_pred):\n    return 0\n", "decorator"),
    ("def f(y_true, y_pred=__import__('os')):\n    return 0\n", "literal constant"),
    ("def f(y_true: __import__('os').getcwd(), y_pred):\n    return 0\n", "annotations"),
    ("def f(y_true, y_pred) -> open('{m}', 'w'):\n    return 0\n", "annotations"),
    ("def f(y_true, y_pred, z):\n    return 0\n", "neither as"),
    ("def f(y_true, y_pred, *, k=open('{m}', 'w')):\n    return 0\n", "literal constant"),
    ("def f(y_true, y_pred, *, k):\n    return 0\n", "neither as"),
    ("def f(x):\n    return 0\n", "neither as"),
    ("def g(y_true, y_pred):\n    return 0\n", "defines 'g'"),
    ("def f(y_true, y_pred):\n    return 0\ndef f(y_true, y_pred):\n    return 1\n", "2 times"),
    ("async def f(y_true, y_pred):\n    return 0\n", "defines 'f' at top level"),
    ("class f:\n    pass\n", "defines 'f' at top level"),
    ("", "0 times"),
    ("def f(y_true, y_pred)\n    return 0\n", "does not parse"),
    ("if True:\n    def f(y_true, y_pred):\n        return 0\n", "If"),
    ("try:\n    import os\nexcept Exception:\n    pass\n", "Try"),
    ("(" * 1000 + ")" * 1000, "parse"),
    ("x" * 100_001, "characters long"),
]


@pytest.mark.parametrize(("source", "match"), BAD_SOURCES)
def test_bad_custom_sources_are_refused_and_never_run(reg, tmp_path, source, match):
    marker = tmp_path / "pwned"
    text = source.replace("{m}", str(marker))
    with pytest.raises(ValueError, match=match):
        reg.register_custom_function("f", text)
    assert reg.list_custom_functions().empty
    assert not marker.exists()


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "class", "a b"])
def test_bad_custom_names(reg, name):
    with pytest.raises(ValueError, match="identifier"):
        reg.register_custom_function(name, GOOD_SOURCE)


def test_non_string_source_and_name(reg):
    with pytest.raises(TypeError, match="source"):
        reg.register_custom_function("f", b"def f(y_true, y_pred): return 0")
    with pytest.raises(TypeError, match="name"):
        reg.register_custom_function(None, GOOD_SOURCE)


def test_source_edited_in_the_database_is_checked_again(reg, url, tmp_path, monkeypatch):
    reg.register_custom_function("scaled_mae", GOOD_SOURCE)
    marker = tmp_path / "pwned"
    evil = f"__import__('os').system('touch {marker}')\n" + GOOD_SOURCE
    with sqlite3.connect(_sqlite_path(url)) as conn:
        conn.execute("UPDATE custom_functions SET source = ?", (evil,))
    monkeypatch.setattr(tf_runtime, "tensorflow", lambda: FakeTf)
    with pytest.raises(ValueError, match="Expr"):
        reg.load_custom_objects(["scaled_mae"])
    assert not marker.exists()


def test_compile_function_uses_a_fresh_namespace():
    check_source("scaled_mae", GOOD_SOURCE)
    namespace = {"tf": FakeTf, "np": np}
    first = compile_function("scaled_mae", GOOD_SOURCE, namespace)
    second = compile_function("scaled_mae", GOOD_SOURCE, namespace)
    assert first is not second
    assert first.__globals__ is not second.__globals__
    # The caller's namespace is copied, never written to: the function's name does not leak.
    assert namespace == {"tf": FakeTf, "np": np}


@pytest.mark.tf
def test_load_custom_objects_with_real_tensorflow(reg):
    reg.register_custom_function("scaled_mae", GOOD_SOURCE, "loss")
    function = reg.load_custom_objects(["scaled_mae"])["scaled_mae"]
    value = function(np.array([1.0, 2.0], "float32"), np.array([2.0, 4.0], "float32"))
    assert float(value) == pytest.approx(3.0)


# ----------------------------------------------------------------------------- module functions


class FakeKerasModel:
    """Duck-typed like a tf-keras model: to_json and get_weights, no TensorFlow needed."""

    def to_json(self) -> str:
        return sequential_json(6, 2)

    def get_weights(self) -> list[np.ndarray]:
        return [np.ones((6, 2), "float32"), np.zeros(2, "float32")]


def test_module_functions_with_a_url_string(url):
    arch = dvml.registry.load_keras_model(sequential_json(), name="mlp", registry=url)
    table = dvml.registry.list_architectures(registry=url)
    assert table["name"].tolist() == ["mlp"]
    assert dvml.registry.describe_architecture(arch, registry=url)["weights"] is None
    with Registry(url) as registry:
        registry.save_model("m", arch, _weights())
    assert dvml.registry.list_models(registry=url)["name"].tolist() == ["m"]
    assert dvml.registry.describe_model("m", registry=url)["version"] == 1
    dvml.registry.drop_model("m", registry=url)
    dvml.registry.drop_architecture(arch, registry=url)
    assert dvml.registry.list_models(registry=url).empty
    dvml.registry.register_custom_function("scaled_mae", GOOD_SOURCE, registry=url)
    assert dvml.registry.list_custom_functions(registry=url)["name"].tolist() == ["scaled_mae"]
    dvml.registry.drop_custom_function("scaled_mae", registry=url)


def test_load_keras_model_takes_a_model_object(reg):
    arch = dvml.registry.load_keras_model(FakeKerasModel(), description="fake", registry=reg)
    stored = reg.get_architecture(arch)
    assert stored["model_json"] == sequential_json(6, 2)
    assert stored["input_shapes"] == [[6]] and stored["output_shape"] == [2]
    assert [w.shape for w in stored["weights"]] == [(6, 2), (2,)]
    explicit = dvml.registry.load_keras_model(FakeKerasModel(), weights=[np.ones(1)], registry=reg)
    assert [w.shape for w in reg.get_architecture(explicit)["weights"]] == [(1,)]


def test_module_functions_refuse_a_bad_registry():
    with pytest.raises(TypeError, match="registry"):
        dvml.registry.list_models(registry=3)  # type: ignore[arg-type]


def test_public_names():
    assert set(dvml.registry.__all__) == {
        "Registry",
        "drop_architecture",
        "drop_custom_function",
        "drop_model",
        "lineage",
        "list_architectures",
        "list_custom_functions",
        "list_models",
        "load_keras_model",
        "register_custom_function",
        "describe_architecture",
        "describe_model",
        "weights_from_bytes",
        "weights_to_bytes",
    }


def test_importing_the_registry_does_not_import_tensorflow():
    code = (
        "import sys, dvml.registry\n"
        "bad = [m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ----------------------------------------------------------------------------- processes


def _write_models(url: str, prefix: str, count: int, ready: Any, go: Any) -> None:
    """Child process: save ``count`` models with iterations, one transaction each."""
    with Registry(url) as registry:
        arch = registry.add_architecture(sequential_json(), name=prefix)
        ready.release()
        go.wait(timeout=120)  # both writers start writing together
        for i in range(count):
            registry.save_model(
                f"{prefix}-{i}",
                arch,
                _weights(i),
                {"writer": prefix, "i": i},
                [{"iteration": k, "training_loss": float(k)} for k in range(1, 4)],
            )


def test_two_processes_write_at_once(url):
    Registry(url).close()  # create the file and tables first, as a deployment would
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    writers = [
        context.Process(target=_write_models, args=(url, f"p{n}", 30, ready, go)) for n in range(2)
    ]
    for writer in writers:
        writer.start()
    for _ in writers:
        assert ready.acquire(timeout=120)
    go.set()
    for writer in writers:
        writer.join(timeout=240)
    assert [writer.exitcode for writer in writers] == [0, 0]

    with Registry(url) as registry:
        names = set(registry.list_models()["name"])
        assert names == {f"p{n}-{i}" for n in range(2) for i in range(30)}
        assert registry.model_summary("p1-29") == {"writer": "p1", "i": 29}
        np.testing.assert_array_equal(registry.get_model("p0-7")["weights"][0], _weights(7)[0])
    assert _raw(url, "SELECT COUNT(*) FROM model_iterations") == [(180,)]
    assert _raw(url, "PRAGMA integrity_check") == [("ok",)]


_KILLED_WRITER = textwrap.dedent(
    """
    import pathlib, sys, time
    import numpy as np
    from dvml.registry import Registry, database

    url, marker, arch_id, replace = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    real_insert = database._insert_iterations

    def insert_then_hang(conn, model_id, rows):
        real_insert(conn, model_id, rows)  # every row of the save is written, not committed
        pathlib.Path(marker).write_text("in transaction")
        time.sleep(600)

    database._insert_iterations = insert_then_hang
    registry = Registry(url)
    iterations = [{"iteration": k, "training_loss": 9.0} for k in range(1, 6)]
    registry.save_model(
        "victim", arch_id, [np.full(3, 9.0)], {"v": 9}, iterations, replace=replace == "1"
    )
    """
)


@pytest.mark.parametrize("replace", [False, True])
def test_writer_killed_mid_transaction_leaves_no_half_entry(url, tmp_path, replace):
    with Registry(url) as registry:
        arch = registry.add_architecture(sequential_json())
        if replace:
            registry.save_model("victim", arch, [np.zeros(3)], {"v": 1}, ITERATIONS)
    marker = tmp_path / "in-transaction"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, url, str(marker), str(arch), str(int(replace))]
    )
    try:
        assert poll_for(lambda: marker.exists() or child.poll() is not None, 120), (
            "the writer neither reached its transaction nor exited within 120 s"
        )
        assert child.poll() is None, "the writer exited before reaching its transaction"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)

    assert _raw(url, "PRAGMA integrity_check") == [("ok",)]
    with Registry(url) as registry:
        if replace:
            model = registry.get_model("victim")
            assert model["version"] == 1 and model["summary"] == {"v": 1}
            np.testing.assert_array_equal(model["weights"][0], np.zeros(3))
            assert registry.model_iterations("victim")["iteration"].tolist() == [1, 2]
            assert _raw(url, "SELECT COUNT(*) FROM model_iterations") == [(2,)]
        else:
            assert not registry.model_exists("victim")
            assert registry.list_models().empty
            assert _raw(url, "SELECT COUNT(*) FROM model_iterations") == [(0,)]
        # the write lock died with the writer: writing works at once
        start = time.monotonic()
        registry.save_model("after", arch, _weights(), replace=True)
        assert time.monotonic() - start < 5
        assert registry.model_exists("after")


def _selection_models(arch_id: int, names: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "name": n,
            "arch_id": arch_id,
            "weights": _weights(i),
            "summary": {"mst_key": i},
            "iterations": [{"iteration": 1, "training_loss": 0.5, "elapsed_s": 1.0}],
        }
        for i, n in enumerate(names)
    ]


def test_model_selection_is_saved_in_one_transaction(reg, arch_id):
    ids = reg.save_model_selection_run(
        "grid", _selection_models(arch_id, ["grid_1", "grid_2"]), [{"mst_key": 1}], {"n": 2}
    )
    assert len(ids) == 2 and reg.model_exists("grid_2")
    assert reg.model_selection_run("grid") == {"info": [{"mst_key": 1}], "summary": {"n": 2}}
    # a second run replaces the models (new versions) and the run's tables
    reg.save_model_selection_run("grid", _selection_models(arch_id, ["grid_1"]), [], {"n": 1})
    assert reg.get_model("grid_1")["version"] == 2
    assert reg.model_selection_run("grid")["summary"] == {"n": 1}
    # a model that cannot be written (unknown architecture) leaves NOTHING of its run behind
    broken = _selection_models(arch_id, ["other_1"]) + _selection_models(arch_id + 99, ["other_2"])
    with pytest.raises(RegistryNotFoundError):
        reg.save_model_selection_run("other", broken, [], {})
    assert not reg.model_exists("other_1")
    with pytest.raises(RegistryNotFoundError, match="fit_multiple run named 'other'"):
        reg.model_selection_run("other")
