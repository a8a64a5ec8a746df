"""A model directory's properties as the handler reads them at its init call in the container: ``HandlerConfig``
and the options no code reads.

The tooling never re-states the runtime's rules: this calls ``HandlerConfig.from_properties`` and
``check_unknown_keys`` with what the container would give them, and the backend registry for the options each
backend reads. ``lmi render``, ``lmi validate`` and ``lmi inspect`` all come through here.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Mapping

from lmi_handlers.backends.registry import BACKENDS, for_instance
from lmi_handlers.config import HandlerConfig, check_unknown_keys

#: Where SageMaker and `docker run -v` put the model directory inside the container.
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
        return HandlerConfig.from_properties(props)


def backend_option_keys(backend: str, family: str | None = None) -> frozenset[str]:
    """Options only ``backend`` reads (beyond the handler's own) on an instance of ``family``; ``auto`` with no
    family: what any backend ``auto`` may pick reads."""
    if backend == "auto" and family is None:
        return frozenset().union(*(e.keys for e in BACKENDS.values() if e.auto))
    return BACKENDS[backend].keys if family is None else for_instance(backend, family).keys


def ignored_options(props: Mapping[str, str], backend: str, family: str | None = None) -> list[str]:
    """One message per option nobody reads (the runtime's own did-you-mean warnings)."""
    with quiet("lmi_handlers.config"):
        return check_unknown_keys(props, backend_option_keys(backend, family))


@contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    """Silence a runtime logger whose warnings we report ourselves."""
    logger = logging.getLogger(logger_name)
    previous, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = previous
