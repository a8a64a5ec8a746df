"""``lmi render`` / ``lmi new``: a spec through the Jinja2 templates into a model directory.

The templates (``model_templates/*.j2``) use ``StrictUndefined``, so a misspelt variable fails the
render instead of writing an empty value. Every rendered ``serving.properties`` is read back the way
DJLServing reads it and parsed by the runtime's own ``HandlerConfig.from_properties``; a file that
would not load is never written.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2

from lmi_handlers.config import ConfigError, HandlerConfig

from ..errors import ToolError, UsageError
from ..outputs import check_writable
from .handler_config import ignored_options, settings
from .properties import format_value, init_properties, parse_properties
from .resources import TEMPLATES, resource_dir
from .spec import DeploySpec

# Rendered file -> template.
OUTPUTS = {"serving.properties": "serving.properties.j2", "model.py": "model.py.j2",
           "requirements.txt": "requirements.txt.j2"}


def _one_line(value: object) -> str:
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"{text!r} must fit on one line")
    return text


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir(TEMPLATES))),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["prop"] = format_value
    env.filters["line"] = _one_line
    return env


def render_files(spec: DeploySpec, source: str, rerender: str = "") -> dict[str, str]:
    """File name -> text for ``spec``; ``source`` names the spec or preset in the header, ``rerender`` is the
    command line that renders the directory again from its spec file (none when there is no file)."""
    env = environment()
    context = {
        "spec": spec, "source": source, "rerender": rerender.encode("ascii", "backslashreplace").decode(),
        "backend": spec.resolved_backend, "positions_key": spec.positions_key, "image": str(spec.target_image),
        "async_mode": spec.resolved_async_mode,
        "options": sorted(spec.options.items()), "server": sorted(spec.server.items()),
    }
    try:
        return {name: env.get_template(template).render(**context) for name, template in OUTPUTS.items()}
    except ValueError as exc:
        raise UsageError(f"{source}: {exc}") from None


def parse_rendered(text: str, model_dir: Path) -> HandlerConfig:
    """The rendered properties as the handler will parse them; unknown keys are an error here."""
    props = init_properties(parse_properties(text))
    try:
        read = settings(props, str(model_dir))
    except ConfigError as exc:
        raise ToolError(f"the rendered serving.properties would not load: {exc}") from None
    unknown = ignored_options(props, read.requested)
    if unknown:
        raise ToolError(f"the rendered serving.properties has options the runtime ignores: {'; '.join(unknown)}")
    return read.config


def write_model_dir(spec: DeploySpec, out_dir: str | Path, source: str, force: bool = False,
                    spec_file: str | Path | None = None) -> list[Path]:
    """Render ``spec`` into ``out_dir``; existing files are only replaced with ``force``. ``spec_file``, where the
    spec lives, is named in serving.properties' header with the command that renders it again."""
    out = Path(out_dir)
    rerender = f"lmi render {shlex.quote(str(spec_file))} {shlex.quote(str(out))} --force" if spec_file else ""
    files = render_files(spec, source, rerender)
    parse_rendered(files["serving.properties"], out.resolve())
    existing = [name for name in files if (out / name).exists()]
    if existing and not force:
        raise UsageError(f"{out} already has {', '.join(existing)}", hint="pass --force to overwrite them")
    check_writable(out, folder=True)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="ascii" if name == "serving.properties" else "utf-8")
        written.append(path)
    return written
