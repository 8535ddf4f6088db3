"""The registry accepts the model names the rest of dvml accepts, and says what a model lacks."""

from __future__ import annotations

import numpy as np
import pytest

from dvml.exceptions import ArgumentError, RegistryError
from dvml.names import MAX_NAME_LENGTH, check_suffixed_name
from dvml.registry import Registry
from dvml.registry.database import TRAINED_SUMMARY_KEYS
from tests.registry.test_registry import sequential_json


@pytest.fixture
def reg(tmp_path):
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        yield registry


@pytest.mark.parametrize(
    "name", ["../../x", "/etc/passwd", "a\0b", "a\nb", "x" * (MAX_NAME_LENGTH + 1), " m", ".m"]
)
def test_save_model_refuses_names_dvml_refuses(reg, name):
    arch = reg.add_architecture(sequential_json())
    with pytest.raises(ArgumentError, match="must be 1 to 128 characters"):
        reg.save_model(name, arch, [np.zeros(3)])
    assert reg.list_models().empty


def test_a_model_without_a_fit_summary_is_a_clear_error(reg):
    arch = reg.add_architecture(sequential_json())
    reg.save_model("handmade", arch, [np.zeros(3)], {"note": "saved by hand"})
    with pytest.raises(RegistryError, match=r"'handmade'.*lacks compile_params") as info:
        reg.get_model("handmade", require=TRAINED_SUMMARY_KEYS)
    assert not isinstance(info.value, KeyError)
    assert reg.get_model("handmade")["summary"] == {"note": "saved by hand"}


def test_suffixed_names_stay_within_the_limit():
    ok = "m" * (MAX_NAME_LENGTH - 3)
    assert check_suffixed_name(ok, ["_1", "_12"], "model_output") == ok
    with pytest.raises(ArgumentError, match=r"model_output is too long.*at most 124"):
        check_suffixed_name("m" * MAX_NAME_LENGTH, ["_1", "_12", "_123"], "model_output")
    with pytest.raises(ArgumentError, match="model_output"):
        check_suffixed_name("../x", ["_1"], "model_output")
