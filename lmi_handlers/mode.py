"""Which of DJL's two Python engines an LMI image runs a model with: the synchronous one or the async one.

DJLServing's Java front end reads ``option.async_mode`` (``PyModel``) and starts the worker with ``--async-mode``,
whose ``PythonAsyncEngine`` awaits ``handle`` once per request; without it ``PythonSyncEngine`` calls ``handle``
(and Java's rolling batch steps it). The async engine exists from DJL 0.33.0 (LMI v15). From DJL 0.35.0 (LMI v17)
LMI's config recommender (``LmiConfigRecommender.setRollingBatch``) turns the mode on by itself on an image whose
``SERVING_FEATURES`` name vllm or trtllm, when ``option.rolling_batch`` is unset or ``auto``, ``batch_size`` is 1,
and the model's ``config.json`` names a text-generation architecture; it then also writes
``option.rolling_batch=disable``. The recommender runs only for a model whose ``config.json`` DJL finds (in the
model directory, or from ``option.model_id``).

``serving_mode`` states those rules once, for the handler's resolver, ``lmi validate``, ``lmi render`` and
``lmi serve``: a pure function of the properties, the image and the model's architectures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

#: The DJL release that brought ``PythonAsyncEngine`` (djl-serving commit 8752a0a1).
ASYNC_ENGINE_SINCE = (0, 33, 0)
#: The DJL release whose recommender turns async mode on (djl-serving commits fc651296, 28ac3588).
RECOMMENDER_SINCE = (0, 35, 0)
#: ``LmiConfigRecommender.OPTIMIZED_TASK_ARCHITECTURES``: the architecture names it treats as text generation.
TEXT_GENERATION = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
#: ``SERVING_FEATURES`` of each LMI image line (its Dockerfile's ``ENV``), as the recommender reads them.
FEATURES = {"djl-lmi": "vllm", "djl-tensorrtllm": "trtllm", "djl-neuronx": "vllm,lmi-dist,tnx"}


@dataclass(frozen=True)
class Image:
    """An LMI container image, as far as the mode depends on it: its line and its DJL version."""

    name: str
    version: str
    #: ``SERVING_FEATURES`` where it differs from the line's (a container started with its own).
    serving_features: str | None = None

    @property
    def features(self) -> str:
        return self.serving_features if self.serving_features is not None else FEATURES.get(self.name, "")

    @property
    def release(self) -> tuple[int, ...]:
        return _release(self.version)

    def __str__(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class Mode:
    """The engine the image runs the model with, and why. ``properties`` are what DJL's Java changes in the
    model's init properties on the way (the recommender's writes), in the init-property view (no ``option.``)."""

    asynchronous: bool
    reason: str
    properties: Mapping[str, str]

    @property
    def name(self) -> str:
        return "async" if self.asynchronous else "sync"


def serving_mode(properties: Mapping[str, Any], image: Image | None,
                 architectures: Sequence[str] | None = None) -> Mode:
    """The mode ``image`` runs a model with these init properties (``option.`` stripped); ``architectures`` is the
    model's ``config.json`` ``architectures`` list, or None where DJL would find no ``config.json``. ``image`` None
    is a server without LMI's recommender (``lmi serve`` given no target): only ``option.async_mode`` counts.

    Java's order: the recommender writes first (over an ``option.async_mode=false`` too), then ``PyModel`` reads
    ``option.async_mode``."""
    explicit = properties.get("async_mode")
    if image is not None and image.release < ASYNC_ENGINE_SINCE:
        ignored = ": option.async_mode is ignored" if explicit is not None and java_true(explicit) else ""
        return Mode(False, f"{image} (DJL {image.version}) has only the synchronous engine{ignored}", {})
    recommended = _recommender(properties, image, architectures)
    if recommended is None:
        over = " (over option.async_mode=false)" if explicit is not None and not java_true(explicit) else ""
        rolling = "is not set" if "rolling_batch" not in properties else "is auto"
        return Mode(True, f"option.rolling_batch {rolling} on {image}: LMI's recommender sets option.async_mode=true "
                    f"and option.rolling_batch=disable{over}", {"async_mode": "true", "rolling_batch": "disable"})
    if explicit is not None:
        return Mode(java_true(explicit), f"option.async_mode={str(explicit).strip()}", {})
    return Mode(False, f"option.async_mode is not set, and {recommended}", {})


def _recommender(properties: Mapping[str, Any], image: Image | None,
                 architectures: Sequence[str] | None) -> str | None:
    """None where LMI's recommender turns async mode on, else why it does not."""
    if image is None:
        return "no LMI image is targeted (whose recommender could set it)"
    if image.release < RECOMMENDER_SINCE:
        return f"{image}'s recommender sets it only from DJL 0.35.0"
    features = [f.strip() for f in image.features.split(",")]
    if "vllm" not in features and "trtllm" not in features:
        return f"{image} (SERVING_FEATURES={image.features or 'none'}) is no vLLM or TensorRT-LLM image"
    if architectures is None:
        return ("DJL finds no config.json (in the model directory or at option.model_id), so its recommender does "
                "not run")
    if _batch_size(properties) > 1:
        return "batch_size > 1 (dynamic batching) keeps the recommender off"
    rolling = str(properties.get("rolling_batch", "auto")).strip()
    if rolling != "auto":
        return f"option.rolling_batch={rolling} keeps the recommender off"
    if not any(arch.endswith(TEXT_GENERATION) for arch in architectures):
        return (f"the architecture {', '.join(architectures) or '(none)'} is no text generation, for which the "
                "recommender leaves it off")
    return None


def java_true(value: Any) -> bool:
    """``Boolean.parseBoolean``: "true" in any case is true, anything else false."""
    return str(value).strip().lower() == "true"


def _batch_size(properties: Mapping[str, Any]) -> int:
    try:
        return int(str(properties.get("batch_size", "1")).strip())
    except ValueError:
        return 1  # the handler's own parser names a bad value


def _release(version: str) -> tuple[int, ...]:
    """``"0.36.0"`` -> (0, 36, 0); a suffix such as ``-lmi17.0.0`` or ``-SNAPSHOT`` is ignored."""
    parts = []
    for piece in version.split("-", 1)[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)
