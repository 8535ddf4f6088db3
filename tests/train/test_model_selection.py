"""Model selection tables stored in a real SQLite registry: dvml.model_configs,
dvml.model_selection_table, load/list/delete, and the resolver fit_multiple uses."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from typing import Any

import pandas as pd
import pytest

import dvml
from dvml.configs import check_config_rows
from dvml.exceptions import ArgumentError, ArgumentTypeError, RegistryNotFoundError
from dvml.registry import Registry
from dvml.train.model_selection import resolve_model_configs

COMPILE = {
    "loss": ["categorical_crossentropy"],
    "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.01]}],
    "metrics": ["accuracy"],
}
FIT = {"batch_size": [8, 16], "epochs": [1]}
COLUMNS = ["mst_key", "model_id", "compile_params", "fit_params"]


def mlp_json(units: int = 3) -> str:
    layers = [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4]}},
        {"class_name": "Dense", "config": {"name": "hidden", "units": 8}},
        {"class_name": "Dense", "config": {"name": "out", "units": units}},
    ]
    return json.dumps({"class_name": "Sequential", "config": {"name": "mlp", "layers": layers}})


@pytest.fixture
def reg(tmp_path: Any) -> Any:
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        yield registry


@pytest.fixture
def arch_ids(reg: Registry) -> list[int]:
    return [reg.add_architecture(mlp_json(3)), reg.add_architecture(mlp_json(5))]


def stored_rows(reg: Registry) -> int:
    path = reg.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM model_selection_rows").fetchone()[0])


def test_grid_round_trip(reg: Registry, arch_ids: list[int]) -> None:
    table = dvml.model_configs(arch_ids, COMPILE, FIT, name="grid", registry=reg)
    assert list(table.columns) == COLUMNS
    assert len(table) == 2 * 2 * 2
    assert table["mst_key"].tolist() == list(range(1, 9))
    assert str(table["mst_key"].dtype) == "int64" and str(table["model_id"].dtype) == "int64"
    assert table["compile_params"][0] == (
        "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', "
        "metrics=['accuracy']"
    )
    assert table.attrs["name"] == "grid" and table.attrs["search"] == "grid"
    assert table.attrs["source"]["fit_params_grid"] == FIT

    # read back by name, through a second connection to the same file
    with Registry(reg.url) as other:
        loaded = dvml.describe_model_configs("grid", registry=other)
    pd.testing.assert_frame_equal(loaded, table)
    listing = dvml.list_model_configs(registry=reg)
    assert listing[["name", "n_configs", "search"]].to_dict("records") == [
        {"name": "grid", "n_configs": 8, "search": "grid"}
    ]
    dvml.drop_model_configs("grid", registry=reg)
    assert dvml.list_model_configs(registry=reg).empty
    assert stored_rows(reg) == 0
    with pytest.raises(RegistryNotFoundError, match="No model selection table named 'grid'"):
        dvml.describe_model_configs("grid", registry=reg)


def test_madlib_strings_give_the_same_table(reg: Registry, arch_ids: list[int]) -> None:
    as_dicts = dvml.model_configs(arch_ids, COMPILE, FIT, name="a", registry=reg)
    as_text = dvml.model_configs(arch_ids, repr(COMPILE), repr(FIT), name="b", registry=reg)
    pd.testing.assert_frame_equal(as_dicts, as_text, check_like=False, check_names=True)


def test_random_search_records_its_seed(reg: Registry, arch_ids: list[int]) -> None:
    compile_grid = {
        "loss": ["categorical_crossentropy"],
        "optimizer_params_list": [{"optimizer": ["Adam", "SGD"], "lr": [0.0001, 0.1, "log"]}],
    }
    first = dvml.model_configs(arch_ids, compile_grid, FIT, "random", 5, name="r1", registry=reg)
    seed = first.attrs["seed"]
    assert isinstance(seed, int) and len(first) == 5
    again = dvml.model_configs(
        arch_ids, compile_grid, FIT, "random", 5, seed=seed, name="r2", registry=reg
    )
    assert again[COLUMNS].equals(first[COLUMNS])


def test_default_name_is_the_content(reg: Registry, arch_ids: list[int]) -> None:
    first = dvml.model_configs(arch_ids[:1], COMPILE, FIT, registry=reg)
    second = dvml.model_configs(arch_ids[:1], COMPILE, FIT, registry=reg)
    assert first.attrs["name"] == second.attrs["name"]
    assert first.attrs["name"].startswith("configs-")
    assert len(dvml.list_model_configs(registry=reg)) == 1  # built twice, stored once
    assert stored_rows(reg) == 4


def test_a_name_in_use_gets_the_new_rows(reg: Registry, arch_ids: list[int]) -> None:
    first = dvml.model_configs(arch_ids, COMPILE, FIT, name="t", registry=reg)
    again = dvml.model_configs(arch_ids, COMPILE, FIT, name="t", registry=reg)  # nothing new
    assert again[COLUMNS].equals(first[COLUMNS])
    # MADlib appends to a table that exists: the new rows only, mst_key going on.
    grown = dvml.model_configs(arch_ids, COMPILE, {"epochs": [1]}, name="t", registry=reg)
    assert len(grown) == len(first) + 4
    assert grown["mst_key"].tolist() == list(range(1, len(first) + 5))
    assert grown[COLUMNS].head(len(first)).equals(first[COLUMNS])
    replaced = dvml.model_configs(
        arch_ids, COMPILE, {"epochs": [1]}, name="t", replace=True, registry=reg
    )
    assert len(replaced) == 4 and len(dvml.describe_model_configs("t", registry=reg)) == 4
    assert stored_rows(reg) == 4


def test_unknown_architecture_stores_nothing(reg: Registry, arch_ids: list[int]) -> None:
    with pytest.raises(RegistryNotFoundError, match="No architecture with id 999"):
        dvml.model_configs([arch_ids[0], 999], COMPILE, FIT, name="x", registry=reg)
    assert dvml.list_model_configs(registry=reg).empty and stored_rows(reg) == 0


def test_invalid_params_store_nothing(reg: Registry, arch_ids: list[int]) -> None:
    bad = {"loss": ["mse"], "optimizer_params_list": [{"optimizer": ["SGD"], "lr": [0.1, -1]}]}
    with pytest.raises(ArgumentError, match="must be a finite positive number") as info:
        dvml.model_configs(arch_ids, bad, FIT, name="x", registry=reg)
    assert "Fix that entry of compile_params_grid" in str(info.value)
    with pytest.raises(ArgumentError, match="name must be 1 to 128 characters"):
        dvml.model_configs(arch_ids, COMPILE, FIT, name="no/slash", registry=reg)
    assert dvml.list_model_configs(registry=reg).empty and stored_rows(reg) == 0


def test_model_selection_table_from_lists(reg: Registry, arch_ids: list[int]) -> None:
    table = dvml.model_selection_table(
        arch_ids,
        ["loss='mse', optimizer='SGD(lr=0.1)'", "loss='mse',optimizer='SGD(learning_rate=0.1)'"],
        ["batch_size=8, epochs=1", "batch_size=16, epochs=1"],
        name="lists",
        registry=reg,
    )
    assert len(table) == 2 * 1 * 2  # the two compile strings are one parameter set
    assert table.attrs["search"] is None
    # kept as the user wrote it (the first of the two), as MADlib keeps the text
    assert set(table["compile_params"]) == {"loss='mse', optimizer='SGD(lr=0.1)'"}


def test_model_selection_table_from_rows(reg: Registry, arch_ids: list[int]) -> None:
    rows = pd.DataFrame(
        {
            "mst_key": [3, 7],
            "model_id": arch_ids,
            "compile_params": ["loss='mse', optimizer='adam'", "loss='mae', optimizer='adam'"],
            "fit_params": ["batch_size=8", "batch_size=4"],
        }
    )
    table = dvml.model_selection_table(rows, name="rows", registry=reg)
    assert table["mst_key"].tolist() == [3, 7]
    listed = dvml.model_selection_table(
        [{k: v for k, v in r.items() if k != "mst_key"} for r in rows.to_dict("records")],
        name="listed",
        registry=reg,
    )
    assert listed["mst_key"].tolist() == [1, 2]
    with pytest.raises(ArgumentTypeError, match="not both"):
        dvml.model_selection_table(rows, ["loss='mse'"], registry=reg)
    with pytest.raises(ArgumentTypeError, match="compile_params_list is required"):
        dvml.model_selection_table(arch_ids, registry=reg)
    with pytest.raises(ArgumentError, match="row 2 is the same configuration as row 0"):
        dvml.model_selection_table(pd.concat([rows, rows]).drop(columns="mst_key"), registry=reg)


def test_custom_objects(reg: Registry, arch_ids: list[int]) -> None:
    grid = {"loss": ["my_loss"], "optimizer": ["adam"]}
    with pytest.raises(ArgumentError, match="Unknown loss 'my_loss'"):
        dvml.model_configs(arch_ids, grid, None, registry=reg)
    with pytest.raises(RegistryNotFoundError, match="custom function named 'my_loss'"):
        dvml.model_configs(arch_ids, grid, None, custom_objects=["my_loss"], registry=reg)
    reg.register_custom_function(
        "my_loss", "def my_loss(y_true, y_pred):\n    return tf.reduce_mean(y_pred)\n"
    )
    table = dvml.model_configs(arch_ids, grid, None, custom_objects=["my_loss"], registry=reg)
    assert table.attrs["custom_objects"] == ["my_loss"]
    resolved = resolve_model_configs(table.attrs["name"], registry=reg)
    assert resolved.attrs["custom_objects"] == ["my_loss"]


def test_resolve_model_configs(reg: Registry, arch_ids: list[int]) -> None:
    stored = dvml.model_configs(arch_ids, COMPILE, FIT, name="grid", registry=reg)
    by_name = resolve_model_configs("grid", registry=reg)
    assert by_name[COLUMNS].equals(stored[COLUMNS]) and by_name.attrs["name"] == "grid"
    by_frame = resolve_model_configs(stored.drop(columns="mst_key"), registry=reg)
    assert by_frame[COLUMNS].equals(stored[COLUMNS]) and by_frame.attrs["name"] is None
    by_rows = resolve_model_configs(stored.to_dict("records"), registry=reg)
    assert by_rows[COLUMNS].equals(stored[COLUMNS])
    assert len(dvml.list_model_configs(registry=reg)) == 1  # resolving stores nothing
    with pytest.raises(RegistryNotFoundError, match="No architecture with id 999"):
        resolve_model_configs(
            [{"model_id": 999, "compile_params": "loss='mse'", "fit_params": ""}], registry=reg
        )
    with pytest.raises(ArgumentTypeError, match="configs must be the name of a model selection"):
        resolve_model_configs(42, registry=reg)  # type: ignore[arg-type]
    with pytest.raises(RegistryNotFoundError, match="No model selection table named 'nope'"):
        resolve_model_configs("nope", registry=reg)


def test_registry_stores_checked_rows_only(reg: Registry, arch_ids: list[int]) -> None:
    """Rows are checked once, in dvml.configs; the registry stores the ModelConfig rows it is
    handed and refuses anything else (dicts included) by type, storing nothing."""
    row = {"mst_key": 1, "model_id": arch_ids[0], "compile_params": "loss='mse'", "fit_params": ""}
    with pytest.raises(ArgumentError, match="repeats mst_key=1"):
        check_config_rows([row, {**row, "fit_params": "epochs=2"}])
    with pytest.raises(ArgumentError, match="unknown \\['extra'\\]"):
        check_config_rows([{**row, "extra": 1}])
    with pytest.raises(ArgumentTypeError, match="list of ModelConfig rows"):
        reg.save_model_selection("t", [row])  # type: ignore[list-item]
    with pytest.raises(ArgumentTypeError, match="non-empty list"):
        reg.save_model_selection("t", [])
    assert stored_rows(reg) == 0
    reg.save_model_selection("t", check_config_rows([row]))
    assert stored_rows(reg) == 1
    assert reg.model_selection("t")[COLUMNS].to_dict("records") == [row]


def test_processes_building_the_same_table_store_it_once(
    reg: Registry, arch_ids: list[int]
) -> None:
    code = (
        "import sys, dvml; t = dvml.model_configs("
        f"{arch_ids!r}, {COMPILE!r}, {FIT!r}, registry=sys.argv[1]); print(t.attrs['name'])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, reg.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]  # fmt: skip
    try:
        outputs = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1
    assert len(dvml.list_model_configs(registry=reg)) == 1 and stored_rows(reg) == 8
