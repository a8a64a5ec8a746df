"""A model directory's properties as the handler reads them at its init call in the container: its settings and the
options no code reads.

The tooling never re-states the runtime's rules: this calls the runtime's own resolver (``deployment.read_settings``:
``HandlerConfig``, the tool-call and LoRA options, the backend asked for) and ``check_unknown_keys`` with what the
container would give them, and the backend registry for the options each backend reads. ``lmi render``,
``lmi validate`` and ``lmi inspect`` all come through here.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from lmi_handlers.backends.registry import BACKENDS, for_instance
from lmi_handlers.config import check_unknown_keys
from lmi_handlers.deployment import Settings, read_settings
from lmi_handlers.mode import Image

#: Where SageMaker and `docker run -v` put the model directory inside the container.
CONTAINER_MODEL_DIR = "/opt/ml/model"


def settings(props: Mapping[str, str], model_dir: str, image: Image | None = None,
             architectures: Sequence[str] | None = None) -> Settings:
    """The handler's settings as it reads them in the container, under the mode ``image`` runs the model in
    (``deployment.read_settings``); raises ``ConfigError``."""
    return read_settings(container_properties(props, model_dir), image, architectures)


def container_properties(props: Mapping[str, str], model_dir: str) -> dict[str, str]:
    """The init properties the container gives the handler for a model directory at ``model_dir``."""
    props = {**props, "model_dir": model_dir}
    model_id = props.get("model_id", "")
    if model_id.startswith("s3://"):
        props["model_id"] = model_dir  # DJLServing downloads it and hands the handler the local directory
    elif model_id == CONTAINER_MODEL_DIR or model_id.startswith(CONTAINER_MODEL_DIR + "/"):
        # the container's own path to the model directory: here, that directory is model_dir
        props["model_id"] = model_dir + model_id[len(CONTAINER_MODEL_DIR):]
    return props


def backend_option_keys(backend: str, family: str | None = None) -> frozenset[str]:
    """Options only ``backend`` reads (beyond the handler's own) on an instance of ``family``; ``auto`` with no
    family: what any backend ``auto`` may pick reads."""
    if backend == "auto" and family is None:
        return frozenset().union(*(e.keys for e in BACKENDS.values() if e.auto))
    return BACKENDS[backend].keys if family is None else for_instance(backend, family).keys


def ignored_options(props: Mapping[str, str], backend: str, family: str | None = None) -> list[str]:
    """One message per option nobody reads (the runtime's own did-you-mean warnings)."""
    return check_unknown_keys(props, backend_option_keys(backend, family))
