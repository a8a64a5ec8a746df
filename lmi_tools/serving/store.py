"""The model store: model directories in, ``ServedModel``s out, configured the way DJLServing does it.

Configuration sources (reference/djl-contract.md §1.7-1.8, §7):

* ``serving.properties``: ``option.<key>`` keys reach the handler as ``<key>``; other keys (``engine``,
  ``batch_size``, ``max_batch_delay``, ``job_queue_size``...) are server settings and reach it unchanged;
* ``OPTION_<KEY>`` environment variables (``OPTION_ENTRYPOINT`` -> ``entryPoint``) and ``ARGS_<KEY>``,
  applied only where serving.properties is silent;
* ``SERVING_<KEY>`` environment variables for server-wide defaults (``SERVING_JOB_QUEUE_SIZE``...), and
  ``MODEL_LOADING_TIMEOUT`` / ``PREDICT_TIMEOUT``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..modeldir.properties import init_properties, parse_properties, read_text, with_environment
from .dispatcher import ModelSettings, ServedModel
from .worker.client import WorkerSettings

def model_properties(model_dir: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The init properties DJLServing sends for this model directory (options stripped of ``option.``)."""
    path = model_dir / "serving.properties"
    raw = parse_properties(read_text(path)) if path.is_file() else {}
    props = init_properties(with_environment(raw, environ))
    if "tensor_parallel_degree" not in props and environ.get("TENSOR_PARALLEL_DEGREE"):
        props["tensor_parallel_degree"] = environ["TENSOR_PARALLEL_DEGREE"]
    return props


@dataclass
class ServerConfig:
    """Server-wide defaults; a model's serving.properties overrides the per-model ones."""

    job_queue_size: int = 1000
    batch_size: int = 1
    max_batch_delay: int = 100
    max_request_size: int = 64 * 1024 * 1024
    chunked_read_timeout: float = 120.0
    model_loading_timeout: float = 240.0
    predict_timeout: float = 120.0
    engine: str = "auto"
    #: Largest SageMaker PayloadPart in bytes (0: one part per chunk); small values test clients' reassembly.
    sagemaker_part_size: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ServerConfig":
        def get(name: str, default: float, cast: type = int):
            value = environ.get(name)
            return cast(value) if value not in (None, "") else default

        return cls(
            job_queue_size=get("SERVING_JOB_QUEUE_SIZE", 1000), batch_size=get("SERVING_BATCH_SIZE", 1),
            max_batch_delay=get("SERVING_MAX_BATCH_DELAY", 100),
            max_request_size=get("SERVING_MAX_REQUEST_SIZE", 64 * 1024 * 1024),
            chunked_read_timeout=get("SERVING_CHUNKED_READ_TIMEOUT", 120.0, float),
            model_loading_timeout=get("MODEL_LOADING_TIMEOUT", 240.0, float),
            predict_timeout=get("PREDICT_TIMEOUT", 120.0, float),
        )


def model_settings(model_dir: Path, server: ServerConfig, overrides: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] = os.environ) -> ModelSettings:
    props = {**model_properties(model_dir, environ), **(overrides or {})}

    def number(key: str, default: float, cast: type = int):
        try:
            return cast(props[key]) if props.get(key) not in (None, "") else default
        except ValueError:
            raise ValueError(f"{key}={props[key]!r} in {model_dir}/serving.properties is not a number") from None

    env = dict(pair.split("=", 1) for pair in props.get("env", "").split(",") if "=" in pair)
    rolling = props.get("rolling_batch", "disable").strip().lower() not in ("", "disable")
    worker = WorkerSettings(
        model_dir=model_dir.resolve(), init_properties={k: v for k, v in props.items() if k != "env"},
        entry_point=props.get("entryPoint", ""),
        model_loading_timeout=number("model_loading_timeout", server.model_loading_timeout, float),
        predict_timeout=number("predict_timeout", server.predict_timeout, float),
        chunked_read_timeout=server.chunked_read_timeout, engine=server.engine, env=env)
    return ModelSettings(
        worker=worker,
        batch_size=number("batch_size", number("max_dynamic_batch_size", server.batch_size)),
        max_batch_delay_ms=number("max_batch_delay", server.max_batch_delay),
        job_queue_size=number("job_queue_size", server.job_queue_size),
        rolling=rolling, max_rolling_batch_size=number("max_rolling_batch_size", 32))


class ModelExists(Exception):
    pass


class ModelStore:
    """The models this server holds, by name."""

    def __init__(self, server: ServerConfig):
        self.server = server
        self.models: dict[str, ServedModel] = {}
        self._lock = threading.Lock()

    def register(self, name: str, url: str, overrides: Mapping[str, str] | None = None) -> ServedModel:
        model_dir = Path(url.removeprefix("file://")).expanduser()
        if not model_dir.is_dir():
            raise FileNotFoundError(f"model directory {model_dir} does not exist")
        settings = model_settings(model_dir, self.server, overrides)
        with self._lock:
            if name in self.models:
                raise ModelExists(f"model {name} is already registered")
            model = ServedModel(name, str(model_dir.resolve()), settings)
            self.models[name] = model
        model.start()
        return model

    def unregister(self, name: str) -> bool:
        with self._lock:
            model = self.models.pop(name, None)
        if model is None:
            return False
        model.stop()
        return True

    def get(self, name: str) -> ServedModel | None:
        return self.models.get(name)

    def close(self) -> None:
        for name in list(self.models):
            self.unregister(name)


def model_name_for(path: str) -> str:
    """``name=path`` names a model explicitly; otherwise DJL takes the last path segment."""
    if "=" in path and not path.startswith(("/", ".")):
        return path.split("=", 1)[0]
    return Path(path.rstrip("/")).name or "model"


def model_path_for(path: str) -> str:
    return path.split("=", 1)[1] if "=" in path and not path.startswith(("/", ".")) else path
