"""A MADlib user's scripts run unchanged (issue 36): MADlib's deep-learning examples,
translated call for call, on one real 2-worker LocalCluster with iris.

Each test names the issue item it covers. Pure tests (no cluster) sit beside the cluster ones
where the logic is pure: the parameter parser, the custom-function check, the selection
table's duplicate rule.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pytest

import dvml
from dvml import configs as cs
from dvml import configs as p
from dvml.exceptions import RegistryError
from dvml.registry.custom import check_source, compile_function
from tests.helpers import iris_frame, iris_mlp, keras

pytestmark = [pytest.mark.cluster, pytest.mark.tf]

# MADlib's documentation's compile parameters (Keras 2 names, spaces as users write them)
SGD_DECAY = "loss='categorical_crossentropy',  optimizer='SGD(lr=0.01, decay=1e-6, momentum=0.9, nesterov=True)'"  # noqa: E501
FACTORY = """def mc_mse():
    def mse(y_true, y_pred):
        return tf.reduce_mean(tf.square(y_true - y_pred))
    return mse
"""


def _events(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(root.rglob("events.out.tfevents.*"))


@pytest.fixture(scope="module")
def env(cluster2: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    frame = iris_frame()
    tmp = tmp_path_factory.mktemp("madlib_scripts")
    client = cluster2.client
    model = iris_mlp()
    with dask.config.set({"dvml.cluster.state-dir": str(tmp / "state")}):
        dvml.training_preprocessor(
            frame.iloc[:120], y="label", x="x", name="mc_iris", overwrite=True, client=client
        )
        # Item 8: a validation set with fewer rows than workers (MADlib evaluates it).
        dvml.validation_preprocessor(
            frame.iloc[120:121], y="label", x="x", training="mc_iris", name="mc_iris_one",
            overwrite=True, client=client,
        )  # fmt: skip
        registry = dvml.Registry(f"sqlite:///{tmp / 'registry.db'}")
        arch = dvml.load_keras_model(model.to_json(), name="iris_mlp", registry=registry)
        yield {
            "client": client, "registry": registry, "arch": arch, "model_json": model.to_json(),
            "tmp": tmp, "test": frame.iloc[120:],
        }  # fmt: skip
        registry.close()
        for name in ("mc_iris", "mc_iris_one"):
            dvml.datasets.drop(name, client=client)


def test_fit_keeps_madlibs_text_and_fields_and_stands_alone(env: dict[str, Any]) -> None:
    """Items 1, 3, 4, 5, 7, 8: Keras 2 arguments and a TensorBoard callback in fit_params,
    a one-row validation set, the text as written, MADlib's summary values, a refused
    second fit, predict after the architecture is deleted, pred_type=None."""
    reg, client = env["registry"], env["client"]
    own_arch = dvml.load_keras_model(env["model_json"], name="standalone", registry=reg)
    tb = env["tmp"] / "tb_fit"
    fit_text = (
        f"batch_size=16,epochs=1, sample_weight_mode=None, callbacks=[TensorBoard(log_dir='{tb}')]"
    )
    common = {"registry": reg, "client": client, "progress": False}
    model = dvml.fit("mc_iris", "mc_fit", own_arch, SGD_DECAY, fit_text, num_iterations=2,
                     validation_set="mc_iris_one", **common)  # fmt: skip
    s = model.summary
    # item 4: the text as the user wrote it, the parsed form beside it
    assert s["compile_params"] == SGD_DECAY and s["fit_params"] == fit_text
    assert (
        "learning_rate=0.01" in s["compile_params_parsed"]
        and "decay=1e-06" in s["compile_params_parsed"]
    )
    # item 5: MADlib's values
    assert s["model_type"] == "madlib_keras"
    assert s["object_table"] is None
    assert s["metrics_type"] is None and s["training_metrics"] is None
    assert s["training_metrics_final"] is None and s["validation_metrics"] is None
    # item 8: the one-row validation set was evaluated
    assert s["validation_loss_final"] is not None and np.isfinite(s["validation_loss_final"])
    # item 3: TensorBoard event files, one directory per trainer
    assert {e.parent.parent.name for e in _events(tb)} == set(s["trainers"]), _events(tb)
    # item 1: a second fit to the same name is refused, naming the model and how to drop it
    with pytest.raises(RegistryError, match=r"mc_fit.*dvml\.drop_model\('mc_fit'\)"):
        dvml.fit("mc_iris", "mc_fit", own_arch, SGD_DECAY, fit_text, **common)
    assert dvml.Model("mc_fit", reg).summary["end_training_time"] == s["end_training_time"]
    # item 7: the model stands on its own once its architecture is deleted
    reg.drop_architecture(own_arch)
    # item 8: pred_type=None is MADlib's NULL, its default ('prob': every class)
    out = dvml.predict("mc_fit", env["test"].iloc[:5], "id", "x", pred_type=None,
                       registry=reg, client=client).compute(scheduler=client)  # fmt: skip
    assert len(out) == 5 * 3
    assert np.allclose(out.groupby("id")["prob"].sum().to_numpy(), 1.0, atol=1e-4)


def test_fit_multiple_tables_as_madlib_keeps_them(env: dict[str, Any]) -> None:
    """Items 1, 3, 4, 5, 6, 8: a user's selection table (key order duplicates removed, text
    kept, rows appended), a factory custom metric, TensorBoard per model, the info table
    joining the selection table, a refused rerun, warm start training a new mst_key from
    scratch, use_caching accepted."""
    reg, client = env["registry"], env["client"]
    reg.register_custom_function("mc_mse", FACTORY, kind="metric")
    tb = env["tmp"] / "tb_mop"
    compiles = [
        "loss='categorical_crossentropy', optimizer='Adam(epsilon=None)', metrics=['mc_mse']",
        "loss='categorical_crossentropy',optimizer='SGD(lr=0.05, decay=1e-4)', metrics=['mc_mse']",
    ]
    fits = [
        f"batch_size=16, epochs=1, callbacks=[TensorBoard(log_dir='{tb}')]",
        f"epochs=1, batch_size=16, callbacks=[TensorBoard(log_dir='{tb}')]",  # the same
    ]
    table = dvml.model_selection_table(env["arch"], compiles, fits, name="mc_mst",
                                       custom_objects=["mc_mse"], registry=reg)  # fmt: skip
    assert len(table) == 2 and set(table["compile_params"]) == set(compiles)
    assert set(table["fit_params"]) == {fits[0]}
    common = {"registry": reg, "client": client, "progress": False}
    run = dvml.fit_multiple("mc_iris", "mc_mop", "mc_mst", 1, **common)
    info = run.info
    # item 4: a MADlib user's join of the selection table and the info table finds every row
    joined = table.merge(info, on=["mst_key", "compile_params", "fit_params"])
    assert len(joined) == 2
    assert run.summary["object_table"] == "custom_functions"
    assert run.summary["label_class_values"] == [0, 1, 2]
    assert info["metrics_type"].tolist() == [["mc_mse"], ["mc_mse"]]
    assert {e.parent.parent.parent.name for e in _events(tb)} == {"mst_key_1", "mst_key_2"}
    # item 1: the rerun is refused, naming what exists
    with pytest.raises(RegistryError, match=r"the run 'mc_mop'.*the model 'mc_mop_1'"):
        dvml.fit_multiple("mc_iris", "mc_mop", "mc_mst", 1, **common)
    # item 6: rows are added to a selection table that exists
    more = dvml.model_selection_table(
        env["arch"], "loss='categorical_crossentropy', optimizer='adam'", "batch_size=8",
        name="mc_mst", registry=reg,
    )  # fmt: skip
    assert more["mst_key"].tolist() == [1, 2, 3]
    # item 6: warm start trains the new mst_key from scratch; item 8: use_caching accepted
    warm = dvml.fit_multiple("mc_iris", "mc_mop", "mc_mst", 1, warm_start=True,
                             use_caching=True, **common)  # fmt: skip
    assert warm.mst_keys == [1, 2, 3]
    assert warm.model(3).summary["training_loss_final"] is not None


def test_automl_refuses_existing_outputs_and_has_madlibs_summary(env: dict[str, Any]) -> None:
    """Items 1, 3, 5: a user's own ``<model_output>_best`` is not replaced; the summary has
    MADlib's object_table, use_gpus and class values; a TensorBoard callback in the grid."""
    reg, client = env["registry"], env["client"]
    tb = env["tmp"] / "tb_automl"
    compile_grid = {"loss": ["categorical_crossentropy"], "optimizer_params_list": [
        {"optimizer": ["SGD"], "lr": [0.01, 0.1], "decay": [1e-6]}]}  # fmt: skip
    fit_grid = {"batch_size": [16], "epochs": [1],
                "callbacks": [f'[TensorBoard(log_dir="{tb}")]']}  # fmt: skip
    mine = dvml.model_selection_table(env["arch"], "loss='mse', optimizer='adam'", None,
                                      name="mc_auto_best", registry=reg)  # fmt: skip
    args = ("mc_iris", "mc_auto", env["arch"], compile_grid, fit_grid)
    kwargs = {"method": "hyperopt", "params": "num_configs=2, num_iterations=1", "seed": 3,
              "registry": reg, "client": client, "progress": False}  # fmt: skip
    with pytest.raises(RegistryError, match=r"mc_auto_best.*drop_model_configs"):
        dvml.automl(*args, **kwargs)
    assert dvml.describe_model_configs("mc_auto_best", registry=reg)[list(cs.COLUMNS)].equals(
        mine[list(cs.COLUMNS)]
    )
    dvml.drop_model_configs("mc_auto_best", registry=reg)
    result = dvml.automl(*args, **kwargs)
    s = result.summary
    assert s["object_table"] is None and s["use_gpus"] is False
    assert s["label_class_values"] == [0, 1, 2]
    assert _events(tb), "no TensorBoard event files from the grid's callback"
    with pytest.raises(RegistryError, match=r"the run 'mc_auto'"):
        dvml.automl(*args, **kwargs)
    again = dvml.automl(*args, overwrite=True, **kwargs)
    assert again.mst_keys == result.mst_keys


# ----------------------------------------------------------------------------- pure


def test_keras2_optimizer_arguments_keep_their_meaning() -> None:
    """Item 3: ``decay`` is Keras 2's inverse-time schedule, ``epsilon=None`` the default."""
    parsed = p.parse_compile_params(SGD_DECAY)
    optimizer = p.build_optimizer(parsed["optimizer"])
    config = optimizer.get_config()["learning_rate"]
    assert config["class_name"] == "InverseTimeDecay", config
    lr = keras().optimizers.schedules.deserialize(config)
    for step in (0, 1000, 10**6):
        assert float(lr(step)) == pytest.approx(0.01 / (1 + 1e-6 * step), rel=1e-5)
    adam = p.build_optimizer(p.parse_compile_params("optimizer='Adam(epsilon=None)'")["optimizer"])
    assert adam.get_config()["epsilon"] == pytest.approx(1e-7)
    fit = p.parse_fit_params("sample_weight_mode=None, callbacks=[TensorBoard(log_dir='/t')]")
    assert p.parse_fit_params(p.format_params(fit)) == fit


def test_custom_functions_take_any_keras_valid_signature() -> None:
    """Item 8: ``(y_true, y_pred, sample_weight=None)``, ``*args`` and a factory."""
    for source in (
        "def f(y_true, y_pred, sample_weight=None):\n    return y_pred\n",
        "def f(*args):\n    return args[1]\n",
    ):
        check_source("f", source)
        assert compile_function("f", source)(1, 2) == 2
    made = compile_function("mc_mse", FACTORY, {"tf": None})
    assert made.__name__ == "mc_mse" and made.__code__.co_varnames[:2] == ("y_true", "y_pred")
    with pytest.raises(ValueError, match="neither as"):
        check_source("f", "def f(a):\n    return a\n")
    with pytest.raises(ValueError, match="literal constant"):
        check_source("f", "def f(y_true, y_pred, x=print('x')):\n    return 1\n")


def test_selection_rows_equal_in_any_key_order_are_one() -> None:
    """Item 6 (pure): MADlib removes duplicates whatever the key order."""
    fits = ["epochs=1, batch_size=5", "batch_size=5, epochs=1"]
    configs = cs.cross_configs(1, "loss='mse'", fits)
    assert [c.fit_params for c in configs] == [fits[0]]
    rows = [
        {"model_id": 1, "compile_params": "loss='mse'", "fit_params": fits[0]},
        {"model_id": 1, "compile_params": "loss = 'mse'", "fit_params": "batch_size=5,epochs=1"},
    ]
    with pytest.raises(ValueError, match="same configuration as row 0"):
        cs.check_config_rows(rows)
