"""Which Python engine a worker runs: DJL's ``djl_python_engine.py`` or ours (``process.py``).

DJLServing never imports the engine from an installed package: its Java side extracts
``djl_python_engine.py`` and ``djl_python/`` from the python engine jar into
``<engine cache>/python/<version>/`` (``PyEnv.init``), runs ``python <that dir>/djl_python_engine.py``
(``Connection.getPythonStartCmd``) and puts that directory on ``PYTHONPATH``. The engine cache is
``ENGINE_CACHE_DIR``, else ``DJL_CACHE_DIR``, else ``~/.djl.ai`` (DJL's ``Utils.getEngineCacheDir``).
A ``djl_python`` wheel built with DJL's packaging (``find_packages``) has no ``djl_python_engine``
module, so we look where DJL puts the script, then beside the package (a source tree), then on
``sys.path``. ``auto`` takes DJL's engine when found and otherwise says why it runs ours.

Our engine's workers get the ``djl_python`` stand-ins (``standins/djl_python``) on their path where
no real ``djl_python`` is installed, as the container provides DJL's.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPT = "djl_python_engine.py"
OURS = "lmi_tools.serving.worker.process"
STANDINS = Path(__file__).resolve().parent / "standins"


class EngineNotFound(Exception):
    """``--engine djl`` was asked for and DJL's engine cannot run here; the message says what is missing."""


@dataclass(frozen=True)
class EngineChoice:
    name: str  # "djl" or "lmi"
    command: tuple[str, ...]  # the interpreter and the engine, before DJL's arguments
    pythonpath: tuple[str, ...]  # entries the worker's PYTHONPATH gets after the model directory
    why: str  # one line for the log


def engine_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("ENGINE_CACHE_DIR") or env.get("DJL_CACHE_DIR") or str(Path.home() / ".djl.ai")
    return Path(base) / "python"


def djl_python_version() -> str | None:
    """The installed ``djl_python`` distribution's version, or None where none is installed."""
    if importlib.util.find_spec("djl_python") is None:
        return None
    try:
        return importlib.metadata.version("djl_python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"  # importable from a source tree, not installed as a distribution


def script_candidates(version: str | None, env: dict[str, str] | None = None) -> list[Path]:
    """Where DJL's engine script may be, in the order we look."""
    cache = engine_cache_dir(env)
    places = [cache / version / SCRIPT] if version and version != "unknown" else []
    if cache.is_dir():
        places += sorted((p for p in cache.glob(f"*/{SCRIPT}") if p not in places), reverse=True)
    spec = importlib.util.find_spec("djl_python")
    if spec is not None and spec.submodule_search_locations:
        places += [Path(location).parent / SCRIPT for location in spec.submodule_search_locations]
    module = importlib.util.find_spec("djl_python_engine")
    if module is not None and module.origin:
        places.append(Path(module.origin))
    return places


def find_djl(env: dict[str, str] | None = None) -> tuple[EngineChoice | None, str]:
    """DJL's engine where it can run, else None and what is missing."""
    version = djl_python_version()
    if version is None:
        return None, ("djl_python is not installed in this Python (it is not on the package registries; "
                      "install it from djl-serving's engines/python/setup)")
    places = script_candidates(version, env)
    script = next((p for p in places if p.is_file()), None)
    if script is not None:
        return EngineChoice("djl", (sys.executable, str(script)), (str(script.parent),),
                            f"DJL's engine {script} (djl_python {version})"), ""
    cache = engine_cache_dir(env)
    return None, (f"djl_python {version} is installed but its engine script {SCRIPT} is not: looked in "
                  f"{', '.join(str(p) for p in places) or cache}. DJLServing extracts it from its python "
                  f"engine jar into {cache}/<version>/; copy it there from djl-serving's engines/python/setup "
                  "(or point ENGINE_CACHE_DIR or DJL_CACHE_DIR at the directory that holds python/<version>/)")


def choose(engine: str, env: dict[str, str] | None = None) -> EngineChoice:
    """The engine for ``--engine auto|djl|lmi``; raises ``EngineNotFound`` for ``djl`` that cannot run."""
    why = "ours (--engine lmi)"
    if engine != "lmi":
        djl, missing = find_djl(env)
        if djl is not None:
            return djl
        if engine == "djl":
            raise EngineNotFound(f"--engine djl cannot run: {missing}")
        why = f"ours, because {missing}"
    standins = () if importlib.util.find_spec("djl_python") is not None else (str(STANDINS),)
    return EngineChoice("lmi", (sys.executable, "-m", OURS), standins, why)
