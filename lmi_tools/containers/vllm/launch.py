"""A model directory in AWS's vLLM container: its environment read from the directory, the local server
(``lmi serve --container vllm``) and the ``docker run`` line for an EC2 GPU host (``lmi docker-run --container vllm``).

Locally, vLLM's own OpenAI server starts as the container's entrypoint starts it, ``python -m
vllm.entrypoints.openai.api_server`` with the flags of the ``SM_VLLM_*`` variables, with ``SAGEMAKER_MODEL_PATH``
the directory itself and ``CUSTOM_SCRIPT_FILENAME=model.py``, so that model-hosting-container-standards loads the
directory's ``model.py`` as the container does. Only the port, the address and vLLM's device differ.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from lmi_handlers.adapters import FOLDER as ADAPTERS
from lmi_handlers.config import ConfigError

from ...errors import UsageError, ValidationFailed
from ...instances import lookup
from ...modeldir.properties import init_properties, read_serving_properties, with_environment
from ...sagemaker.calls import SECRET_NAME
from .environment import (MODEL_PATH, PREFIX, ContainerEnvironment, container_environment, entrypoint_args,
                          model_location)
from .images import public_image

SERVER = "vllm.entrypoints.openai.api_server"
SCRIPT = "model.py"


def directory_environment(model_dir: Path, *, served_name: str | None = None, gpus: int = 1,
                          model_path: str = MODEL_PATH) -> ContainerEnvironment:
    """The container's environment for ``model_dir`` (its ``serving.properties`` if it has one, DJL's ``OPTION_*``
    variables, the folders of ``adapters/``) mounted at ``model_path``."""
    props = read_serving_properties(model_dir, os.environ) if (model_dir / "serving.properties").is_file() else \
        init_properties(with_environment({}, os.environ))
    model_id = props.get("model_id", "").strip()
    local = bool(model_id) and not os.path.isabs(model_id) and (model_dir / model_id).is_dir()
    folder = model_dir / ADAPTERS
    adapters = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    return container_environment(props, model_location(model_id, local, model_path), adapters=adapters,
                                 served_name=served_name, gpus=gpus, model_path=model_path)


def checked_environment(model_dir: Path, **kwargs) -> ContainerEnvironment:
    """``directory_environment``, an option the container cannot honour being the command's ``UsageError``."""
    try:
        return directory_environment(model_dir, **kwargs)
    except ConfigError as exc:
        raise UsageError(f"{model_dir / 'serving.properties'}: {exc}",
                         hint="lmi validate --container vllm shows what maps to what (docs/vllm-container.md)") \
            from None


@dataclass(frozen=True)
class Launch:
    """A command with the environment it adds, and what was not carried."""

    argv: list[str]
    env: dict[str, str]
    notes: tuple[str, ...] = ()

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def shown(self) -> str:
        """The environment and command for a log, secrets (``SM_VLLM_HF_TOKEN``...) masked."""
        secret = {value for key, value in self.env.items() if SECRET_NAME.search(key)}
        env = " ".join(f"{k}={'****' if v in secret else v}" for k, v in sorted(self.env.items()) if k != "PYTHONPATH")
        return f"{env} {shlex.join('****' if arg in secret else arg for arg in self.argv)}"


def local_server(model_dir: Path, name: str, host: str, port: int) -> Launch:
    """vLLM's OpenAI server for ``model_dir``, served as ``name``, as the container's entrypoint starts it."""
    if importlib.util.find_spec("vllm") is None:  # the server runs in this Python
        raise UsageError("lmi serve --container vllm runs vLLM's own server, and vLLM is not installed in this "
                         "Python", hint="from a clone: scripts/setup.sh --vllm, then .venv-vllm/bin/lmi serve "
                                        "--container vllm DIR (docs/vllm-container.md)")
    root = model_dir.resolve()
    gpus = len(glob.glob("/dev/nvidia[0-9]*")) or 1
    environment = checked_environment(root, served_name=name, gpus=gpus, model_path=str(root))
    runtime = str(Path(__file__).resolve().parents[3])  # lmi_handlers for model.py, where the folder has none
    path = os.pathsep.join(p for p in (runtime, os.environ.get("PYTHONPATH", "")) if p)
    # The container's own SM_VLLM_* variables win over the directory's, as on a SageMaker model (lmi deploy --env).
    variables = {**environment.env, **{k: v for k, v in os.environ.items() if k.startswith(PREFIX)}}
    env = {**variables, "SAGEMAKER_MODEL_PATH": str(root), "CUSTOM_SCRIPT_FILENAME": SCRIPT, "PYTHONPATH": path}
    argv = [sys.executable, "-m", SERVER, "--host", host, "--port", str(port), *entrypoint_args(variables)]
    return Launch(argv, env, environment.notes)


def deploy_environment(model_dir: Path, instance: str, given: dict[str, str]) -> dict[str, str]:
    """The SageMaker model's environment for ``model_dir`` on ``instance`` (``ml.g5.12xlarge``), the variables
    ``given`` on the command line winning."""
    try:
        gpus = lookup(instance).cores
    except UsageError:
        gpus = 0  # a size we have no figures for: tensor_parallel_degree=max cannot be resolved
    if gpus == 0 and str(read_serving_properties(model_dir).get("tensor_parallel_degree", "")).strip() == "max":
        raise UsageError(f"option.tensor_parallel_degree=max: the GPUs of {instance} are not in lmi's instance table",
                         hint="write the degree in serving.properties, or pass --env SM_VLLM_TENSOR_PARALLEL_SIZE=N")
    return {**checked_environment(model_dir, gpus=gpus or 1).env, **given}


def docker_run(model_dir: Path, instance: str, image: str | None, port: int, name: str | None) -> Launch:
    """``docker run`` of the vLLM container for ``model_dir`` on an EC2 GPU host of type ``instance``."""
    host = lookup(instance)
    if host.kind != "gpu":
        raise ValidationFailed(f"{host.name} has no NVIDIA GPU: AWS's vLLM container runs on GPU instances",
                               hint="serve this directory on an inf2/trn1 host with LMI's Neuron image (lmi "
                                    "docker-run without --container)")
    environment = checked_environment(model_dir, gpus=host.cores)
    argv = ["docker", "run", "--rm", "--name", name or f"vllm-{model_dir.resolve().name}", "--gpus", "all",
            "--ipc", "host", "-p", f"{port}:8080", "-v", f"{model_dir.resolve()}:{MODEL_PATH}"]
    for key, value in environment.env.items():
        argv += ["-e", f"{key}={value}"]
    notes = (f"{host.name}: {host.cores} x {host.gpu or 'GPU'}; the SageMaker image of AWS's vLLM container reads "
             f"the SM_VLLM_* variables and loads {MODEL_PATH}/{SCRIPT}", *environment.notes)
    return Launch([*argv, image or public_image()], {}, notes)


def start(launch: Launch) -> None:
    """Replace this process with the server (as the container's entrypoint ``exec``s it)."""
    os.execve(launch.argv[0], launch.argv, {**os.environ, **launch.env})
