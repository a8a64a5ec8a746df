"""Which engine a worker runs, found as DJLServing finds it (worker/engines.py)."""

import importlib
import sys

import pytest

from lmi_tools.serving.worker import engines


@pytest.fixture
def no_djl(monkeypatch):
    if importlib.util.find_spec("djl_python") is not None:
        pytest.skip("a real djl_python is installed here")


@pytest.fixture
def wheel_djl(tmp_path, monkeypatch):
    """A djl_python installed as DJL's wheel installs it: the package and its dist-info, no engine script."""
    site = tmp_path / "site"
    (site / "djl_python").mkdir(parents=True)
    (site / "djl_python" / "__init__.py").write_text("")
    (site / "djl_python-0.29.0.dist-info").mkdir()
    (site / "djl_python-0.29.0.dist-info" / "METADATA").write_text("Name: djl_python\nVersion: 0.29.0\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "djl_python", raising=False)
    importlib.invalidate_caches()
    return site


def test_without_djl_python_auto_runs_ours_with_the_stand_ins_and_says_why(no_djl, tmp_path):
    choice = engines.choose("auto", {"DJL_CACHE_DIR": str(tmp_path)})
    assert choice.name == "lmi" and choice.command[1:] == ("-m", engines.OURS)
    assert choice.pythonpath == (str(engines.STANDINS),)
    assert "djl_python is not installed" in choice.why
    with pytest.raises(engines.EngineNotFound, match="--engine djl cannot run: djl_python is not installed"):
        engines.choose("djl", {"DJL_CACHE_DIR": str(tmp_path)})


def test_a_wheel_without_the_engine_script_is_reported_with_every_place_looked(wheel_djl, tmp_path):
    env = {"DJL_CACHE_DIR": str(tmp_path / "cache")}
    with pytest.raises(engines.EngineNotFound) as error:
        engines.choose("djl", env)
    message = str(error.value)
    assert "djl_python 0.29.0 is installed but its engine script djl_python_engine.py is not" in message
    assert str(tmp_path / "cache" / "python" / "0.29.0" / "djl_python_engine.py") in message
    assert str(wheel_djl / "djl_python_engine.py") in message
    auto = engines.choose("auto", env)
    assert auto.name == "lmi" and auto.why.startswith("ours, because djl_python 0.29.0 is installed")
    assert auto.pythonpath == ()  # the real djl_python is there: no stand-ins over it


@pytest.mark.parametrize("variable", ["ENGINE_CACHE_DIR", "DJL_CACHE_DIR"])
def test_the_script_is_found_where_djlserving_extracts_it(wheel_djl, tmp_path, variable):
    script = tmp_path / "cache" / "python" / "0.29.0" / "djl_python_engine.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    choice = engines.choose("auto", {variable: str(tmp_path / "cache")})
    assert choice.name == "djl" and choice.command[1:] == (str(script),)
    assert choice.pythonpath == (str(script.parent),)  # Java puts the engine directory on PYTHONPATH
    assert "0.29.0" in choice.why


def test_engine_cache_defaults_to_home_djl_ai(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert engines.engine_cache_dir({}) == tmp_path / ".djl.ai" / "python"
    assert engines.engine_cache_dir({"ENGINE_CACHE_DIR": "/e", "DJL_CACHE_DIR": "/d"}) == engines.Path("/e/python")


def test_a_source_tree_script_beside_the_package_is_used(wheel_djl, tmp_path):
    (wheel_djl / "djl_python_engine.py").write_text("")
    choice = engines.choose("djl", {"DJL_CACHE_DIR": str(tmp_path / "empty")})
    assert choice.command[1:] == (str(wheel_djl / "djl_python_engine.py"),)


def test_lmi_never_looks_for_djl(tmp_path):
    assert engines.choose("lmi").why == "ours (--engine lmi)"
