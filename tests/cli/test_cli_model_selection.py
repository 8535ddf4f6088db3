"""``dvml model-configs`` and ``dvml fit-multiple --config`` as a user runs them, without a
cluster: generating, listing, showing and deleting model selection tables in a real SQLite
registry, and the fit-multiple job file's schema and dry run. Every call is ``python -m dvml``;
the schema checks also run in-process."""

from __future__ import annotations

import json
import pathlib
import sqlite3
import textwrap
from typing import Any

import pytest

from dvml.exceptions import ConfigError
from dvml.jobs.schemas import FIT_MULTIPLE_SCHEMA, MODEL_CONFIGS_SCHEMA, planned_configs
from dvml.jobs.yaml_schema import validate
from tests.helpers import dvml_command, one_error_line, with_state_dir

MLP = {
    "class_name": "Sequential",
    "config": {
        "name": "mlp",
        "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 64]}},
            {"class_name": "Dense", "config": {"name": "out", "units": 10}},
        ],
    },
}

SELECTION = """\
model_selection:
  architectures: [mlp.json]
  compile_params_grid:
    loss: [categorical_crossentropy]
    optimizer_params_list:
      - optimizer: [Adam]
        lr: [0.001, 0.01]
    metrics: [accuracy]
  fit_params_grid: {batch_size: [8, 16], epochs: [1]}
"""


def dvml_cli(*args: str, tmp_path: pathlib.Path) -> Any:
    return dvml_command(*args, env=with_state_dir(tmp_path / "state"), timeout=120)


def setup_files(tmp_path: pathlib.Path) -> str:
    (tmp_path / "mlp.json").write_text(json.dumps(MLP))
    return f"sqlite:///{tmp_path / 'registry.db'}"


def table_count(tmp_path: pathlib.Path) -> int:
    path = tmp_path / "registry.db"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM model_selections").fetchone()[0])


@pytest.mark.parametrize(
    "args",
    [["model-configs", "--help"], ["model-configs", "generate", "--help"],
     ["model-configs", "list", "--help"], ["model-configs", "describe", "--help"],
     ["model-configs", "drop", "--help"], ["fit-multiple", "--help"]],
)  # fmt: skip
def test_help(args: list[str], tmp_path: pathlib.Path) -> None:
    result = dvml_cli(*args, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: dvml")


def test_generate_list_show_delete(tmp_path: pathlib.Path) -> None:
    registry = setup_files(tmp_path)
    config = tmp_path / "grid.yaml"
    config.write_text(f"name: digits-grid\nregistry: {registry}\n{SELECTION}")

    result = dvml_cli("model-configs", "generate", "--config", str(config), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Model selection table 'digits-grid': 4 configurations (grid search)." in result.stdout
    assert "optimizer='Adam(learning_rate=0.01)'" in result.stdout
    # the same file again finds the same table
    again = dvml_cli("model-configs", "generate", "--config", str(config), tmp_path=tmp_path)
    assert again.returncode == 0, again.stderr
    assert table_count(tmp_path) == 1

    listing = dvml_cli("model-configs", "list", "--registry", registry, "--json", tmp_path=tmp_path)
    rows = json.loads(listing.stdout)
    assert [(r["name"], r["n_configs"], r["search"]) for r in rows] == [("digits-grid", 4, "grid")]

    shown = dvml_cli("model-configs", "describe", "digits-grid", "--registry", registry, "--json",
                     tmp_path=tmp_path)  # fmt: skip
    table = json.loads(shown.stdout)
    assert [c["mst_key"] for c in table["configs"]] == [1, 2, 3, 4]
    assert table["configs"][1]["fit_params"] == "batch_size=16, epochs=1"

    deleted = dvml_cli(
        "model-configs", "drop", "digits-grid", "--registry", registry, tmp_path=tmp_path
    )
    assert deleted.returncode == 0, deleted.stderr
    assert table_count(tmp_path) == 0
    missing = dvml_cli("model-configs", "describe", "digits-grid", "--registry", registry,
                       tmp_path=tmp_path)  # fmt: skip
    assert "No model selection table named 'digits-grid'" in one_error_line(missing)


def test_generate_from_flags_with_a_seed(tmp_path: pathlib.Path) -> None:
    registry = setup_files(tmp_path)
    args = [
        "model-configs", "generate", "--architecture", str(tmp_path / "mlp.json"),
        "--compile-grid", "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
        "[{'optimizer': ['Adam', 'SGD'], 'lr': [0.0001, 0.1, 'log']}]}",
        "--fit-grid", "{'batch_size': [8, 64, 'linear'], 'epochs': [1]}",
        "--search", "random", "--num-configs", "5", "--seed", "11", "--registry", registry,
        "--json",
    ]  # fmt: skip
    first = dvml_cli(*args, "--name", "r1", tmp_path=tmp_path)
    second = dvml_cli(*args, "--name", "r2", tmp_path=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert one["seed"] == 11 and len(one["configs"]) == 5
    assert one["configs"] == two["configs"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--fit-grid", "{'batch_size': [0]}"],
         "A configuration from fit_params_grid is refused: Parameter 'batch_size' must be a "
         "positive integer"),
        (["--fit-grid", "{'batch_size': [8, 64, 'log']}"],
         "fit_params_grid['batch_size'] is a distribution, which only random search"),
        (["--fit-grid", "{'batch_size': 8}"], "must be a non-empty list of choices"),
    ],
)  # fmt: skip
def test_bad_grid_flags_store_nothing(
    flags: list[str], expected: str, tmp_path: pathlib.Path
) -> None:
    registry = setup_files(tmp_path)
    result = dvml_cli(
        "model-configs", "generate", "--architecture", "mlp.json",
        "--compile-grid", "{'loss': ['mse'], 'optimizer': ['adam']}", *flags,
        "--registry", registry, tmp_path=tmp_path,
    )  # fmt: skip
    assert expected in one_error_line(result)
    assert not (tmp_path / "registry.db").exists()  # refused before the registry was opened


def test_generate_needs_a_config_or_flags(tmp_path: pathlib.Path) -> None:
    line = one_error_line(dvml_cli("model-configs", "generate", tmp_path=tmp_path))
    assert "generate needs --config FILE, or --architecture and --compile-grid" in line


# --------------------------------------------------------------------------- fit-multiple

JOB = f"""\
name: digits-mop
registry: sqlite:///REGISTRY
data:
  source: sklearn:digits
  normalizing_const: 16.0
{SELECTION}fit_multiple:
  num_iterations: 3
"""


def test_fit_multiple_dry_run(tmp_path: pathlib.Path) -> None:
    setup_files(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(JOB.replace("REGISTRY", str(tmp_path / "registry.db")))
    result = dvml_cli("fit-multiple", "--config", str(path), "--dry-run", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "configurations: 4 (grid search) -> digits-mop-configs" in out
    assert "sklearn:digits -> digits-mop-train, digits-mop-val" in out
    assert "fit_multiple -> 'digits-mop': 3 iteration(s)" in out
    assert out.count("mlp.json") == 4  # one row per configuration, by architecture
    assert not (tmp_path / "registry.db").exists()  # nothing was started or written


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("fit_params_grid:", "fit_parms_grid:"),
         "unknown key 'model_selection.fit_parms_grid'. Did you mean 'fit_params_grid'?"),
        (("lr: [0.001, 0.01]", "momentum: [0.9]"),
         "model_selection is refused: A configuration from compile_params_grid is refused: "
         "Unknown optimizer argument 'momentum' for Adam"),
        (("  fit_params_grid:", "  table: mine\n  fit_params_grid:"),
         "give either 'model_selection.table' (a stored model selection table) or the grids"),
        (("num_iterations: 3", "num_iterations: 0"),
         "'fit_multiple.num_iterations' must be between 1 and 1000000"),
    ],
)  # fmt: skip
def test_bad_fit_multiple_job_file(
    edit: tuple[str, str], expected: str, tmp_path: pathlib.Path
) -> None:
    setup_files(tmp_path)
    path = tmp_path / "job.yaml"
    text = JOB.replace("REGISTRY", str(tmp_path / "registry.db"))
    assert edit[0] in text
    path.write_text(text.replace(*edit))
    line = one_error_line(dvml_cli("fit-multiple", "--config", str(path), tmp_path=tmp_path))
    assert f"dvml: error: {path}: " in line and expected in line
    assert not (tmp_path / "registry.db").exists()


def test_the_example_job_file_is_valid() -> None:
    from dvml.jobs.yaml_schema import load
    from tests.helpers import REPO

    job = load(REPO / "workflows/configs/fit-multiple-digits.yaml", FIT_MULTIPLE_SCHEMA)
    assert len(planned_configs(job["model_selection"])) == 4
    assert job["fit_multiple"]["num_iterations"] == 3


def _job(text: str) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(textwrap.dedent(text)))


def test_fit_multiple_schema_defaults_and_stored_table() -> None:
    job = validate(_job(JOB.replace("REGISTRY", "x.db")), FIT_MULTIPLE_SCHEMA, "job.yaml")
    assert job["fit_multiple"] == {
        "model_output": None, "num_iterations": 3, "use_gpus": False,
        "metrics_compute_frequency": None, "warm_start": False,
    }  # fmt: skip
    assert len(planned_configs(job["model_selection"])) == 4
    stored = validate(
        _job("name: j\ndata: {source: sklearn:digits}\nmodel_selection: {table: mine}\n"),
        FIT_MULTIPLE_SCHEMA,
        "job.yaml",
    )
    assert stored["model_selection"]["table"] == "mine"
    with pytest.raises(ConfigError, match=r"needs 'table' .* or 'architectures' and"):
        validate(_job("name: j\ndata: {source: sklearn:digits}\nmodel_selection: {}\n"),
                 FIT_MULTIPLE_SCHEMA, "job.yaml")  # fmt: skip


def test_model_configs_schema_random_search() -> None:
    text = SELECTION + "  search: random\n  num_configs: 3\n  seed: 5\n"
    spec = validate(_job(text), MODEL_CONFIGS_SCHEMA, "grid.yaml")["model_selection"]
    assert planned_configs(spec) == planned_configs(spec)  # seeded: the same every time
    with pytest.raises(ConfigError, match="cannot draw 5 distinct configurations from 4"):
        validate(_job(text.replace("num_configs: 3", "num_configs: 5")),
                 MODEL_CONFIGS_SCHEMA, "grid.yaml")  # fmt: skip
    with pytest.raises(ConfigError, match="missing required section 'model_selection'"):
        validate({"name": "x"}, MODEL_CONFIGS_SCHEMA, "grid.yaml")


def test_fit_multiple_stores_its_configurations_before_training(tmp_path: pathlib.Path) -> None:
    # What `dvml fit-multiple` does before it calls dvml.fit_multiple: the architectures are
    # registered and the grid is stored as <name>-configs (replaced on a re-run).
    from dvml.cli.fit_multiple_cmd import _configs
    from dvml.registry import Registry

    setup_files(tmp_path)
    job = validate(
        _job(JOB.replace("REGISTRY", str(tmp_path / "registry.db"))), FIT_MULTIPLE_SCHEMA, "j"
    )
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        configs = _configs(job, registry, tmp_path)
        assert configs.attrs["name"] == "digits-mop-configs" and len(configs) == 4
        assert set(configs["model_id"]) == set(registry.list_architectures()["id"])
        job["model_selection"]["fit_params_grid"] = {"batch_size": [32]}
        again = _configs(job, registry, tmp_path)
        assert len(again) == 2 and len(registry.list_architectures()) == 1
        by_table = {
            **job,
            "model_selection": {**job["model_selection"], "table": "digits-mop-configs"},
        }
        assert _configs(by_table, registry, tmp_path)[list(again.columns)].equals(again)
