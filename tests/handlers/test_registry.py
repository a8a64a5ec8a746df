"""The backend registry: one table, each line read from a package with the agreed exports."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from lmi_handlers.backends import hf, neuronx, scripted
from lmi_handlers.backends.registry import BACKENDS, NAMES, choose, for_instance, load_backend
from lmi_handlers.config import HandlerConfig
from lmi_handlers.errors import ConfigError


@pytest.mark.parametrize("package", [hf, neuronx, scripted])
def test_every_package_exports_the_agreed_surface(package):
    options = package.Options.from_properties({})
    assert dataclasses.is_dataclass(options) and type(options).__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, dataclasses.fields(options)[0].name, None)
    assert package.KEYS and all(isinstance(key, str) for key in package.KEYS)
    assert package.INSTANCE_FAMILIES
    assert package.available() is None or isinstance(package.available(), str)
    assert callable(package.load)


def test_option_backend_allows_what_the_table_has():
    assert NAMES == ("auto", "vllm", "neuronx", "hf", "scripted")
    assert set(BACKENDS) == {"vllm", "hf", "neuronx", "scripted"}
    with pytest.raises(ConfigError, match="allowed values are auto, vllm, neuronx, hf, scripted"):
        HandlerConfig.from_properties({"backend": "lmi-dist"})


def test_auto_is_the_first_available_backend_in_the_tables_order():
    assert importlib.util.find_spec("transformers_neuronx") is None  # as on this machine
    assert choose("auto").name == "hf"
    assert choose("scripted").name == "scripted"  # never picked by auto, but chosen by name


def test_auto_on_an_instance_is_the_first_backend_that_runs_there():
    assert for_instance("auto", "inf2").name == "neuronx"
    assert for_instance("auto", "g5").name == "vllm"  # LMI's GPU images ship vLLM
    assert for_instance("auto", "cpu").name == "hf"
    assert for_instance("hf", "inf2").name == "hf"  # a named backend is what it is: validate says it does not fit
    assert not BACKENDS["neuronx"].runs_on("g5") and BACKENDS["scripted"].runs_on("inf2")


def test_only_vllm_brings_its_own_step_loop():
    assert [name for name, entry in BACKENDS.items() if entry.step_loop is not None] == ["vllm"]


def test_a_backend_that_cannot_run_here_is_refused_naming_the_ones_that_can(tmp_path):
    config = HandlerConfig.from_properties({"backend": "neuronx", "model_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="needs transformers-neuronx.*option.backend=hf \\(or auto\\)"):
        load_backend(config)
