"""The backend registry: one table, each line read from a package with the agreed exports."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from lmi_handlers.backends import hf, neuronx, scripted, vllm
from lmi_handlers.backends.registry import BACKENDS, NAMES, choose, for_instance
from lmi_handlers.deployment import resolve
from lmi_handlers.errors import ConfigError


@pytest.mark.parametrize("package", [hf, neuronx, scripted, vllm])
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
        resolve({"backend": "lmi-dist"})


def test_auto_is_the_first_available_backend_in_the_tables_order():
    assert importlib.util.find_spec("transformers_neuronx") is None  # as on this machine
    assert choose("auto")[0].name == "hf"
    assert choose("scripted")[0].name == "scripted"  # never picked by auto, but chosen by name


def test_auto_on_an_instance_is_the_first_backend_that_runs_there():
    assert for_instance("auto", "inf2").name == "neuronx"
    assert for_instance("auto", "g5").name == "vllm"  # LMI's GPU images ship vLLM
    assert for_instance("auto", "cpu").name == "hf"
    assert for_instance("hf", "inf2").name == "hf"  # a named backend is what it is: validate says it does not fit
    assert not BACKENDS["neuronx"].runs_on("g5") and BACKENDS["scripted"].runs_on("inf2")


def test_only_vllm_brings_its_own_step_loop():
    assert [name for name, entry in BACKENDS.items() if entry.step_loop is not None] == ["vllm"]


def test_a_backend_that_cannot_run_here_is_refused_naming_the_ones_that_can(tmp_path):
    with pytest.raises(ConfigError, match="needs transformers-neuronx.*option.backend=hf \\(or auto\\)"):
        resolve({"backend": "neuronx", "model_dir": str(tmp_path)})


def test_each_backend_owns_its_names_adapters_and_head_layout():
    assert {name: entry.rolling_batch for name, entry in BACKENDS.items() if entry.rolling_batch} == {
        "vllm": ("vllm",)}
    # The handler registers adapters with a backend that loads them; the rule says what it refuses.
    assert {name for name, entry in BACKENDS.items() if entry.adapters} == {"hf", "vllm"}
    assert BACKENDS["vllm"].adapters.max_rank == 512 and "lm_head" in BACKENDS["hf"].adapters.refused_modules
    assert BACKENDS["hf"].head_layout == {"gpu": "layers"} and BACKENDS["vllm"].head_layout["gpu"] == "heads"
    assert BACKENDS["neuronx"].head_layout == {"neuron": "padded"}
