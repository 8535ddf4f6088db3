"""dvml's configuration: dvml.yaml against its schema, and ``config.get`` over dask.config."""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config
import jsonschema
import pytest
import yaml

from dvml import config
from dvml.exceptions import ConfigError

DVML = pathlib.Path(config.__file__).resolve().parent
ROOT = DVML.parent


def _load(path: pathlib.Path) -> Any:
    with open(path) as f:
        return yaml.safe_load(f)


def _schema() -> dict[str, Any]:
    return _load(DVML / "dvml-schema.yaml")


def test_schema() -> None:
    # As distributed's test_schema: the shipped defaults are valid, types included.
    schema = _schema()
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(_load(DVML / "dvml.yaml"), schema)


def test_schema_is_complete() -> None:
    """Every key of dvml.yaml is in the schema, and every key of the schema in dvml.yaml."""

    def walk(values: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
        props = schema.get("properties", {})
        problems = [f"{path}.{k}: not in the schema" for k in sorted(set(values) - set(props))]
        problems += [f"{path}.{k}: not in dvml.yaml" for k in sorted(set(props) - set(values))]
        for key in sorted(set(values) & set(props)):
            if "description" not in props[key] and props[key].get("type") != "object":
                problems.append(f"{path}.{key}: no description")
            if isinstance(values[key], dict):
                problems += walk(values[key], props[key], f"{path}.{key}")
        return problems

    problems = walk(_load(DVML / "dvml.yaml")["dvml"], _schema()["properties"]["dvml"], "dvml")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("cluster", "n-workers", "two"),
        ("cluster", "n-workers", 0),
        ("cluster", "start-timeout", "60s"),
        ("registry", "url", 5),
        ("preprocess", "seed", 1.5),
        ("train", "peer-timeout", -1),
        ("train", "client-timeout", 0),
    ],
)
def test_schema_refuses_a_wrong_value(section: str, key: str, value: Any) -> None:
    settings = _load(DVML / "dvml.yaml")
    settings["dvml"][section][key] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(settings, _schema())


def test_schema_refuses_an_unknown_key() -> None:
    settings = _load(DVML / "dvml.yaml")
    settings["dvml"]["cluster"]["n-worker"] = 2
    with pytest.raises(jsonschema.ValidationError, match="n-worker"):
        jsonschema.validate(settings, _schema())


def test_example_cluster_configuration_is_valid() -> None:
    # cluster/local.yaml is the file users copy: it must pass the schema too.
    jsonschema.validate(_load(ROOT / "cluster" / "local.yaml"), _schema())


def test_schema_ships_with_the_package() -> None:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["dvml"]
    assert {"dvml.yaml", "dvml-schema.yaml"} <= set(data)


def test_get_falls_back_to_config_when_the_keyword_is_none() -> None:
    assert config.get("cluster.n-workers") == config.defaults()["dvml"]["cluster"]["n-workers"]
    with dask.config.set({"dvml.cluster.n-workers": 7}):
        assert config.get("cluster.n-workers") == 7
        assert config.get("cluster.n-workers", None) == 7
        assert config.get("cluster.n-workers", 3) == 3
    assert config.get("registry.url") is None


def test_compact_storage_is_the_default_and_can_be_turned_off() -> None:
    # issue 38 item 4: packs store uint8 x and class indices unless told otherwise
    assert config.defaults()["dvml"]["preprocess"]["compact"] is True
    assert config.get("preprocess.compact") is True  # what compact=None resolves to
    assert config.get("preprocess.compact", False) is False  # compact=False wins
    with dask.config.set({"dvml.preprocess.compact": False}):
        assert config.get("preprocess.compact") is False
        assert config.get("preprocess.compact", True) is True
    # the environment's spelling, as dask.config reads it at import
    env = dask.config.collect_env({"DASK_DVML__PREPROCESS__COMPACT": "false"})
    assert env == {"dvml": {"preprocess": {"compact": False}}}


def test_get_reads_underscores_and_environment_style_keys() -> None:
    with dask.config.set({"dvml.cluster.start_timeout": 12}):
        assert config.get("cluster.start-timeout") == 12
    assert config.get("cluster.start_timeout") == config.get("cluster.start-timeout")


def test_get_refuses_an_unknown_key_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"dvml.cluster.n-worker\b") as info:
        config.get("cluster.n-worker")
    assert "n-workers" in str(info.value) and "vineyard-memory" in str(info.value)
    # A misspelt key fails even when the caller gives a value.
    with pytest.raises(ConfigError, match="Known keys under 'dvml'"):
        config.get("clutser.n-workers", 4)


def test_defaults_come_back_after_a_set_block_dropped_them() -> None:
    # Loaded first inside dask.config.set({"dvml.x": ...}), the defaults leave with the block.
    import dask

    from dvml import config

    saved = dask.config.config.pop("dvml")
    try:
        config.defaults()
        assert dask.config.get("dvml.train.peer-timeout") == 0
    finally:
        dask.config.config["dvml"] = saved
