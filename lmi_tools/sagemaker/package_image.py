"""What a packaged model directory (``lmi deploy --model-dir``) asks of the LMI image it is deployed on.

- Its image: ``lmi render`` writes ``# lmi: image=<line>:<DJL version>`` into serving.properties, and ``lmi deploy``
  takes that DJL version as its default (``--image`` and ``--lmi-version`` still win).
- DJL's async engine, where the handler needs it: a ``model.py`` with its own ``async def handle`` (the sync engine
  cannot await it), or ``option.async_mode=true`` (the handler batches in its own engine; DJL's sync engine would hand
  it one request at a time). The mode on the deployed image is the resolver's (``deployment.read_settings`` with the
  image and the model's architectures), as ``lmi validate`` states it; an image whose DJL has only the synchronous
  engine (before 0.33.0) is refused, naming the image, its version and what is allowed. An ``--image`` URI is read
  as DJL's ``djl-inference:<version>-lmi...`` or ``-neuronx...`` tags; another image is not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from lmi_handlers.config import ConfigError
from lmi_handlers.deployment import read_settings
from lmi_handlers.mode import ASYNC_ENGINE_SINCE, Image, java_true

from ..errors import UsageError
from ..modeldir.image import model_architectures, parse_image
from ..modeldir.properties import init_properties, parse_directives, parse_properties, read_text
from ..validation.checks import entry_point_of
from .images import ImageChoice

#: DJL's tags in the ``djl-inference`` repository: ``0.33.0-lmi15.0.0-cu128``, ``0.29.0-neuronx-sdk2.19.1``.
DJL_TAG = re.compile(r"/djl-inference:(?P<version>\d+\.\d+\.\d+)-(?P<line>lmi|neuronx)")
LINES = {"lmi": "djl-lmi", "neuronx": "djl-neuronx"}
SINCE = ".".join(map(str, ASYNC_ENGINE_SINCE))


@dataclass(frozen=True)
class Package:
    """A packaged model directory's serving.properties, as far as the image it runs on matters."""

    #: ``<dir>/serving.properties``, for messages.
    source: str
    properties: Mapping[str, str]
    #: Its ``# lmi: image=`` line; None without one.
    image: Image | None
    #: Its model's ``config.json`` architectures where DJL finds one (the recommender reads them).
    architectures: Sequence[str] | None
    #: Why its handler needs DJL's async engine; None where the sync engine serves it too.
    needs_async: str | None

    def check_image(self, choice: ImageChoice) -> None:
        """A ``UsageError`` where the handler needs DJL's async engine and ``choice`` runs it with the sync one."""
        image = deployed_image(choice)
        if self.needs_async is None or image is None:
            return
        try:
            mode = read_settings(self.properties, image, self.architectures).mode
        except ConfigError:
            return  # a bad option: lmi validate names it, and the handler refuses it at load
        if not mode.asynchronous:
            raise UsageError(f"{self.source}: {self.needs_async}, but {mode.reason}",
                             hint=f"allowed: an LMI image from DJL {SINCE} (LMI v15) on, with option.async_mode=true "
                                  f"(--lmi-version {SINCE} or later, or its --image); or the sync engine: "
                                  "option.async_mode=false and a plain 'def handle'")


def read_package(model_dir: Path) -> Package | None:
    """``model_dir``'s package; None where it has no serving.properties (nothing to read)."""
    path = model_dir / "serving.properties"
    if not path.is_file():
        return None
    text = read_text(path)
    props = init_properties(parse_properties(text))
    line = parse_directives(text).get("image")
    entry = entry_point_of(model_dir, props)
    needs = None
    if entry.own_handle and entry.async_handle:
        needs = f"its {props.get('entryPoint', 'model.py')} defines an async def handle(), which only DJL's async " \
                "engine awaits"
    elif java_true(props.get("async_mode", "false")):
        needs = "option.async_mode=true asks for DJL's async engine (the handler batches in its own engine; the sync " \
                "engine would hand it one request at a time)"
    return Package(str(path), props, parse_image(line) if line else None, model_architectures(model_dir, props),
                   needs)


def deployed_image(choice: ImageChoice) -> Image | None:
    """The LMI image ``choice`` is, for its mode: from the image table's line and version, else from an ``--image``
    URI's DJL tag; None for an image it cannot tell."""
    if choice.framework in LINES.values() and choice.version:
        return Image(choice.framework, choice.version)
    match = DJL_TAG.search(choice.uri)
    return Image(LINES[match.group("line")], match.group("version")) if match else None
