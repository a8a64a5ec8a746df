"""Data shipped with the tooling: Jinja2 templates, presets and reference ``config.json`` files.

In a wheel they live inside the package (``lmi_tools/model_templates``, ``lmi_tools/serving_properties``,
mapped from the repository's top-level folders in ``pyproject.toml``); in a source checkout they are
the top-level folders themselves. ``resource_dir`` looks inside the package first (``importlib.resources``).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from ..errors import ToolError, UsageError

TEMPLATES = "model_templates"
PRESETS = "serving_properties"
MODEL_CONFIGS = "model_configs"
PRESET_SPEC = "spec.toml"


def resource_dir(name: str) -> Path:
    # Relative to the lmi_tools actually imported: an installed wheel has the folder inside the package;
    # a checkout (or an editable install) has it beside the package, at the repository's top level.
    packaged = Path(str(files("lmi_tools") / name))
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / name
    if checkout.is_dir():
        return checkout
    raise ToolError(f"the {name} data folder is missing from this installation of lmi_tools",
                    hint="reinstall the lmi-handlers package")


def preset_names() -> list[str]:
    return sorted(p.parent.name for p in resource_dir(PRESETS).glob(f"*/{PRESET_SPEC}"))


def preset_spec(name: str) -> Path:
    path = resource_dir(PRESETS) / name / PRESET_SPEC
    if not path.is_file():
        raise UsageError(f"unknown preset {name!r}", hint=f"presets: {', '.join(preset_names())} (lmi presets)")
    return path


def config_file_name(model_id: str) -> str:
    """``org/name`` -> ``org--name.json`` (the Hugging Face cache's own separator)."""
    return model_id.strip("/").replace("/", "--") + ".json"


def known_model_config(model_id: str) -> Path | None:
    """The bundled ``config.json`` of a hub model the presets use, if we ship one."""
    path = resource_dir(PRESETS) / MODEL_CONFIGS / config_file_name(model_id)
    return path if path.is_file() else None
