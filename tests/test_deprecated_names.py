"""Every deprecated spelling still works for one release and warns, naming the new one.

One test per alias (docs/architecture.md, "Verbs of the public API"): the Python names raise a
:class:`DeprecationWarning` that names the new spelling, the old CLI subcommands say so on
stderr, and each still does its job, checked on a real SQLite registry. No cluster.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import dvml
import dvml.registry
from dvml.cli import main as cli_main
from dvml.deprecation import renamed
from dvml.exceptions import RegistryNotFoundError
from dvml.registry import Registry

MLP = json.dumps(
    {
        "class_name": "Sequential",
        "config": {
            "name": "seq",
            "layers": [
                {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4]}},
                {"class_name": "Dense", "config": {"name": "out", "units": 3}},
            ],
        },
    }
)
WEIGHTS = [np.zeros((4, 3), "float32"), np.zeros(3, "float32")]
SOURCE = "def double(y_true, y_pred):\n    return (y_true - y_pred) * 2\n"


@pytest.fixture
def url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture
def reg(url: str) -> Iterator[Registry]:
    with Registry(url) as registry:
        yield registry


@pytest.fixture
def arch(reg: Registry) -> int:
    return reg.add_architecture(MLP, None, name="mlp")


@pytest.fixture
def model(reg: Registry, arch: int) -> str:
    reg.save_model("m", arch, WEIGHTS, {"v": 1})
    return "m"


@pytest.fixture
def table(reg: Registry, arch: int) -> str:
    dvml.model_selection_table(
        [arch], ["loss='mse', optimizer='SGD'"], ["batch_size=8, epochs=1"], name="t", registry=reg
    )
    return "t"


def test_the_helper_warns_at_the_callers_line_and_keeps_the_result() -> None:
    alias = renamed(lambda x, y=1: x + y, "dvml.old", "dvml.new")
    with pytest.warns(DeprecationWarning, match=r"dvml\.old is deprecated.*use dvml\.new") as w:
        assert alias(1, y=2) == 3
    assert w[0].filename == __file__
    assert alias.__name__ == "old" and "dvml.new" in (alias.__doc__ or "")


def test_old_names_resolve_but_are_not_public() -> None:
    for old in ("delete_model", "delete_architecture", "delete_model_configs",
                "load_model_configs", "show_model", "show_architecture"):  # fmt: skip
        assert callable(getattr(dvml, old)) and old not in dvml.__all__, old


def test_show_model(url: str, model: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"dvml\.describe_model\b"):
        assert dvml.show_model(model, registry=url)["summary"] == {"v": 1}


def test_show_architecture(url: str, arch: int) -> None:
    with pytest.warns(DeprecationWarning, match=r"dvml\.describe_architecture\b"):
        assert dvml.show_architecture(arch, registry=url)["name"] == "mlp"


def test_delete_model(url: str, reg: Registry, model: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"dvml\.drop_model\b"):
        dvml.delete_model(model, registry=url)
    assert not reg.model_exists(model)


def test_delete_architecture(url: str, reg: Registry, arch: int) -> None:
    with pytest.warns(DeprecationWarning, match=r"dvml\.drop_architecture\b"):
        dvml.delete_architecture(arch, registry=url)
    assert reg.list_architectures().empty


def test_load_model_configs(url: str, table: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"dvml\.describe_model_configs\b"):
        assert dvml.load_model_configs(table, registry=url)["mst_key"].tolist() == [1]


def test_delete_model_configs(url: str, table: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"dvml\.drop_model_configs\b"):
        dvml.delete_model_configs(table, registry=url)
    assert dvml.list_model_configs(registry=url).empty


def test_registry_delete_custom_function(url: str, reg: Registry) -> None:
    dvml.registry.register_custom_function("double", SOURCE, registry=url)
    with pytest.warns(DeprecationWarning, match=r"dvml\.registry\.drop_custom_function\b"):
        dvml.registry.delete_custom_function("double", registry=url)
    assert reg.list_custom_functions().empty


@pytest.mark.parametrize(
    "old",
    ["delete_architecture", "delete_custom_function", "delete_model", "delete_model_selection"],
)
def test_registry_delete_methods(
    reg: Registry, arch: int, model: str, table: str, old: str
) -> None:
    reg.register_custom_function("double", SOURCE)
    target = {"delete_architecture": arch, "delete_custom_function": "double",
              "delete_model": model, "delete_model_selection": table}[old]  # fmt: skip
    new = old.replace("delete_", "drop_")
    with pytest.warns(DeprecationWarning, match=rf"Registry\.{new}\b"):
        getattr(reg, old)(target)
    # gone: the new name now finds nothing to remove
    with pytest.raises(RegistryNotFoundError):
        getattr(reg, new)(target)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the CLI says it on stderr instead
        code = cli_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_models_show(capsys: pytest.CaptureFixture[str], url: str, model: str) -> None:
    code, out, err = _cli(capsys, "models", "show", model, "--registry", url, "--json")
    assert code == 0, err
    assert json.loads(out)["summary"] == {"v": 1}
    assert "`dvml models show` is deprecated" in err and "`dvml models describe`" in err


def test_cli_model_configs_show(capsys: pytest.CaptureFixture[str], url: str, table: str) -> None:
    code, out, err = _cli(capsys, "model-configs", "show", table, "--registry", url, "--json")
    assert code == 0, err
    assert [c["mst_key"] for c in json.loads(out)["configs"]] == [1]
    assert "use `dvml model-configs describe`" in err


def test_cli_model_configs_delete(capsys: pytest.CaptureFixture[str], url: str, table: str) -> None:
    code, _, err = _cli(capsys, "model-configs", "delete", table, "--registry", url)
    assert code == 0, err
    assert "use `dvml model-configs drop`" in err
    assert dvml.list_model_configs(registry=url).empty


def test_cli_aliases_are_left_out_of_the_reference() -> None:
    from dvml.cli import build_parser, reference_parser

    def commands(parser: Any, group: str) -> set[str]:
        groups = parser._subparsers._group_actions[0].choices
        return set(groups[group]._subparsers._group_actions[0].choices)

    assert {"show", "describe"} <= commands(build_parser(), "models")
    assert commands(reference_parser(), "models") == {"list", "describe", "lineage"}
    assert {"show", "delete"} & commands(reference_parser(), "model-configs") == set()


def test_cli_aliases_are_hidden_from_help(capsys: pytest.CaptureFixture[str]) -> None:
    for group, old in (("models", "show"), ("model-configs", "show"), ("model-configs", "delete")):
        with pytest.raises(SystemExit):
            cli_main([group, "--help"])
        listed = capsys.readouterr().out.split("commands:")[1]
        assert f"    {old} " not in listed and "describe" in listed, listed
