"""The LMI image a model directory targets, and what DJL reads of the model, for the mode it runs in
(``lmi_handlers/mode.py``: DJL's sync or async Python engine).

``# lmi: image=<line>:<version>`` in serving.properties (``lmi render`` writes it) names the image. Without it, the
instance's default: on Inferentia2/Trainium with the neuronx backend the last transformers-neuronx image
(djl-neuronx 0.30.0), anywhere else the current LMI image (djl-lmi; its recommender's rules are those of djl-serving
0.36.0). ``lmi serve`` also reads ``SERVING_FEATURES`` from its environment, as the container's Java does.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from lmi_handlers.backends.registry import for_instance
from lmi_handlers.config import ConfigError
from lmi_handlers.deployment import read_settings
from lmi_handlers.mode import FEATURES, Image

from ..errors import UsageError
from ..instances import kind_of

LAST_NEURONX = Image("djl-neuronx", "0.30.0")
CURRENT_LMI = Image("djl-lmi", "0.36.0")
IMAGE = re.compile(r"(?P<name>[a-z][a-z0-9-]*):(?P<version>\d+\.\d+\.\d+)\S*")


def parse_image(text: str) -> Image:
    """``djl-lmi:0.36.0`` (an image line of ``mode.FEATURES`` and its DJL version); ``UsageError`` otherwise."""
    match = IMAGE.fullmatch(text.strip())
    if match is None or match.group("name") not in FEATURES:
        raise UsageError(f"image {text!r} is not <line>:<DJL version> of a known LMI image line",
                         hint=f"e.g. {CURRENT_LMI} or {LAST_NEURONX}; lines: {', '.join(FEATURES)}")
    return Image(match.group("name"), match.group("version"))


def default_image(family: str, properties: Mapping[str, str]) -> Image:
    """The image a model with these init properties runs in on an instance of ``family`` by default."""
    try:
        backend = for_instance(read_settings(properties).requested, family).name
    except ConfigError:
        backend = ""
    return LAST_NEURONX if kind_of(family) == "neuron" and backend == "neuronx" else CURRENT_LMI


def target_image(directives: Mapping[str, str], family: str | None, properties: Mapping[str, str]) -> Image | None:
    """The ``# lmi: image=`` directive, else the default for ``family``; None with neither (no LMI image)."""
    if directives.get("image"):
        return parse_image(directives["image"])
    return default_image(family, properties) if family else None


def served_image(environ: Mapping[str, str] = os.environ) -> Image | None:
    """What ``lmi serve`` plays from its environment: ``SERVING_FEATURES`` as the container sets it."""
    features = environ.get("SERVING_FEATURES")
    return Image("djl-serving", CURRENT_LMI.version, serving_features=features) if features is not None else None


def model_architectures(model_dir: Path, properties: Mapping[str, str]) -> Sequence[str] | None:
    """The ``architectures`` of the model's ``config.json`` where DJL finds one (option.model_id's directory, else
    the model directory); a hub id it would download is taken as text generation; None: DJL finds none."""
    model_id = str(properties.get("model_id", "")).strip()
    local = model_dir / model_id if model_id and not os.path.isabs(model_id) else Path(model_id or model_dir)
    for path in (local / "config.json", model_dir / "config.json"):
        if path.is_file():
            try:
                found = json.loads(path.read_text(encoding="utf-8")).get("architectures")
            except (OSError, ValueError, AttributeError):
                return []
            return [str(a) for a in found] if isinstance(found, list) else []
    if model_id and not local.exists() and not model_id.startswith(("/", ".", "s3://")):
        return ["ForCausalLM"]  # a hub id: assumed to be text generation, what LMI serves
    return None
