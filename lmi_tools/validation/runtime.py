"""What the runtime itself makes of a model directory: ``HandlerConfig`` and, on Neuron, the compile plan.

The tooling never re-states the runtime's rules. It calls the code the handler runs at its init call
(``HandlerConfig.from_properties``, then ``NeuronxOptions.from_properties`` and ``plan_compile`` for the
neuronx backend) with what the container would give it, and reports their ``ConfigError`` and warnings.
``lmi render``, ``lmi validate`` and ``lmi inspect`` all come through here.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from lmi_handlers.backends.neuronx.options import CompileSettings, NeuronxOptions, plan_compile
from lmi_handlers.config import NEURONX_KEYS, ConfigError, HandlerConfig, check_unknown_keys
from lmi_handlers.structured.tools import ToolOptions


# Where SageMaker and `docker run -v` put the model directory inside the container.
CONTAINER_MODEL_DIR = "/opt/ml/model"


def handler_config(props: Mapping[str, str], model_dir: str) -> HandlerConfig:
    """``HandlerConfig`` as the handler builds it in the container; raises ``ConfigError``."""
    props = {**props, "model_dir": model_dir}
    model_id = props.get("model_id", "")
    if model_id.startswith("s3://"):
        props["model_id"] = model_dir  # DJLServing downloads it and hands the handler the local directory
    elif model_id == CONTAINER_MODEL_DIR or model_id.startswith(CONTAINER_MODEL_DIR + "/"):
        # the container's own path to the model directory: here, that directory is model_dir
        props["model_id"] = model_dir + model_id[len(CONTAINER_MODEL_DIR):]
    with quiet("lmi_handlers.config"):
        config = HandlerConfig.from_properties(props)
    ToolOptions.from_properties(props)  # the handler reads these at load too
    return config


def neuronx_plan(config: HandlerConfig, model: Mapping[str, Any], tp: int) -> CompileSettings:
    """The compile plan ``NeuronxBackend`` makes at load for this model (its ``config.json``) over ``tp``
    NeuronCores (what ``tensor_parallel_degree=max`` becomes in a worker that has them); raises ``ConfigError``."""
    options = NeuronxOptions.from_properties(config.properties)
    return plan_compile(replace(config, tensor_parallel_degree=tp), options, model)


def backend_option_keys(backend: str) -> frozenset[str]:
    """Options only ``backend`` reads (beyond the handler's own), as ``check_unknown_keys`` wants them."""
    if backend == "neuronx":
        return NEURONX_KEYS
    if backend == "scripted":
        from lmi_handlers.backends.scripted import ScriptedBackend  # standard library only

        return frozenset(ScriptedBackend.option_keys)
    from lmi_handlers.backends.hf.backend import HFBackend  # torch and transformers are imported only at load

    return frozenset(HFBackend.option_keys)


def hf_quantize(props: Mapping[str, str]) -> str | None:
    """The hf backend's weight quantization method for ``option.quantize``, as it reads it; raises ``ConfigError``."""
    from lmi_handlers.backends.hf.quantize import parse_method

    return parse_method(props.get("quantize"))


def hf_speculation(props: Mapping[str, str], model_id: str) -> None:
    """The hf backend's speculative-decoding options as it reads them before load, and, where the target and the
    draft are directories here, its tokenizer comparison; raises ``ConfigError``."""
    from lmi_handlers.backends.hf.speculative import check_draft_tokenizer, load_draft_tokenizer, parse_options

    options = parse_options(props)
    if options is None or options.draft is None or not Path(model_id).is_dir() or not Path(options.draft).is_dir():
        return
    try:
        target = load_draft_tokenizer(model_id)
    except ConfigError:
        return  # no tokenizer beside the target's config: nothing to compare here
    check_draft_tokenizer(model_id, options.draft, target, load_draft_tokenizer(options.draft))


def ignored_options(props: Mapping[str, str], backend: str) -> list[str]:
    """One message per option nobody reads (the runtime's own did-you-mean warnings)."""
    with quiet("lmi_handlers.config"):
        return check_unknown_keys(props, backend_option_keys(backend))


@contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    """Silence a runtime logger whose warnings we report ourselves."""
    logger = logging.getLogger(logger_name)
    previous, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = previous
