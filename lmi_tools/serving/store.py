"""The model store: model directories in, ``ServedModel``s out, configured the way DJLServing does it.

Configuration sources (reference/djl-contract.md §1.7-1.8, §7):

* ``serving.properties``: ``option.<key>`` keys reach the handler as ``<key>``; other keys (``engine``,
  ``batch_size``, ``max_batch_delay``, ``job_queue_size``...) are server settings and reach it unchanged;
* ``OPTION_<KEY>`` environment variables (``OPTION_ENTRYPOINT`` -> ``entryPoint``) and ``ARGS_<KEY>``,
  applied only where serving.properties is silent;
* ``SERVING_<KEY>`` environment variables for server-wide defaults (``SERVING_JOB_QUEUE_SIZE``...), and
  ``MODEL_LOADING_TIMEOUT`` / ``PREDICT_TIMEOUT``;
* DJL's mode (``lmi_handlers/mode.py``): ``option.async_mode``, or what LMI's recommender decides for the image the
  model directory targets (``# lmi: image=``, else its ``# lmi: instance_type=``'s default image, or the
  ``SERVING_FEATURES`` this server runs with), with the recommender's writes to the init properties.
"""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from lmi_handlers.config import ConfigError, is_rolling, parse_float, parse_int
from lmi_handlers.mode import Image, Mode, serving_mode

from ..modeldir.image import model_architectures, served_image, target_image
from ..modeldir.properties import (init_properties, parse_directives, parse_properties, read_text,
                                   with_environment)
from .dispatcher import ModelSettings, ServedModel, Status
from .drain import DEFAULT_TIMEOUT, Drain
from .worker.client import WorkerSettings
from .worker.frontend import entry_points


def setting(source: Mapping[str, str], key: str, default: Any, where: str, parse: Callable = parse_int,
            **limits: Any) -> Any:
    """A number from serving.properties or the environment, read by the runtime's own parsers; a bad value is
    a ``ValueError`` naming the key, the value, where it came from and what is allowed."""
    try:
        return parse(source, key, default, **limits)
    except ConfigError as exc:
        raise ValueError(f"{key}={source[key]!r} {where} is invalid: {exc.allowed}") from None


def seconds(source: Mapping[str, str], key: str, default: float, where: str) -> float:
    return setting(source, key, default, where, parse_float, low=0, high=math.inf)


def model_mode(model_dir: Path, props: Mapping[str, str],
               environ: Mapping[str, str] = os.environ) -> tuple[Mode, Image | None]:
    """The mode DJL runs this model directory in, and the image that decides it (the server's SERVING_FEATURES,
    else the one the directory targets)."""
    path = model_dir / "serving.properties"
    directives = parse_directives(read_text(path)) if path.is_file() else {}
    instance = directives.get("instance_type", "").removeprefix("ml.")
    image = served_image(environ) or target_image(directives, instance.split(".")[0] or None, props)
    return serving_mode(props, image, model_architectures(model_dir, props)), image


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
    #: Longest wait for a request's headers, and for each next part of its body (408 after it);
    #: ``lmi serve --read-timeout``.
    read_timeout: float = 60.0
    #: Largest size of a request's headers (431 above it); ``lmi serve --max-header-bytes``.
    max_header_bytes: int = 16 * 1024
    #: Model URLs ``POST /models`` may load (a regular expression the resolved directory must match in full);
    #: None refuses loading by URL. ``lmi serve --model-url-pattern``.
    model_url_pattern: str | None = None
    #: Largest SageMaker PayloadPart in bytes (0: one part per chunk); small values test clients' reassembly.
    sagemaker_part_size: int = 0
    #: The SageMaker endpoint the Runtime paths play, its models being inference components (None: any name).
    sagemaker_endpoint: str | None = None
    #: Seconds the accepted requests get to finish after SIGTERM (``drain.py``); ``lmi serve --drain-timeout``.
    drain_timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ServerConfig":
        where = "in the environment"
        return cls(
            job_queue_size=setting(environ, "SERVING_JOB_QUEUE_SIZE", 1000, where),
            batch_size=setting(environ, "SERVING_BATCH_SIZE", 1, where),
            max_batch_delay=setting(environ, "SERVING_MAX_BATCH_DELAY", 100, where, minimum=0),
            max_request_size=setting(environ, "SERVING_MAX_REQUEST_SIZE", 64 * 1024 * 1024, where),
            chunked_read_timeout=seconds(environ, "SERVING_CHUNKED_READ_TIMEOUT", 120.0, where),
            model_loading_timeout=seconds(environ, "MODEL_LOADING_TIMEOUT", 240.0, where),
            predict_timeout=seconds(environ, "PREDICT_TIMEOUT", 120.0, where),
        )


def model_env(props: Mapping[str, str]) -> dict[str, str]:
    """The worker's extra environment: ``env=KEY=VALUE,KEY=VALUE`` in serving.properties."""
    return dict(pair.split("=", 1) for pair in props.get("env", "").split(",") if "=" in pair)


def model_settings(model_dir: Path, server: ServerConfig, overrides: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] = os.environ) -> ModelSettings:
    overrides = overrides or {}
    for key in overrides:  # checked on their own, so that an error names where they came from
        setting(overrides, key, None, "in the request's query", minimum=0 if key == "max_batch_delay" else 1)
    props = {**model_properties(model_dir, environ), **overrides}
    where = f"in {model_dir}/serving.properties"
    env = model_env(props)
    mode, image = model_mode(model_dir, props, environ)
    props.update(mode.properties)  # the recommender's writes, as Java passes them on
    entry, recommended = entry_points(model_dir, props, image.features if image else "", mode.asynchronous, environ)
    worker = WorkerSettings(
        model_dir=model_dir.resolve(), init_properties={k: v for k, v in props.items() if k != "env"},
        entry_point=entry, recommended_entry_point=recommended, async_mode=mode.asynchronous,
        model_loading_timeout=seconds(props, "model_loading_timeout", server.model_loading_timeout, where),
        predict_timeout=seconds(props, "predict_timeout", server.predict_timeout, where),
        chunked_read_timeout=server.chunked_read_timeout, engine=server.engine, env=env)
    return ModelSettings(
        worker=worker,
        batch_size=setting(props, "batch_size", setting(props, "max_dynamic_batch_size", server.batch_size, where),
                           where),
        max_batch_delay_ms=setting(props, "max_batch_delay", server.max_batch_delay, where, minimum=0),
        job_queue_size=setting(props, "job_queue_size", server.job_queue_size, where),
        rolling=is_rolling(props.get("rolling_batch")),
        max_rolling_batch_size=setting(props, "max_rolling_batch_size", 32, where), mode_reason=mode.reason)


#: Environment variables that make a worker load code from elsewhere (a model's ``env`` may not set them).
CODE_PATH_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH")


def code_outside(model_dir: Path) -> str | None:
    """How this model directory's configuration runs code from outside it, or None: an entry point (a file, a
    ``model.py`` link, or a dotted module found in the directory) that resolves elsewhere, or an ``env`` that
    sets where Python or the loader finds code."""
    props = model_properties(model_dir)
    entry = props.get("entryPoint") or "model.py"
    if entry.endswith(".py") and (model_dir / entry).exists():
        path = (model_dir / entry).resolve()
        if not path.is_relative_to(model_dir):
            return f"its entry point {entry} resolves to {path}, outside the model directory"
    elif not entry.endswith(".py"):
        path = module_outside(model_dir, entry)
        if path is not None:
            return f"its entry point {entry} is imported from {path}, outside the model directory"
    env = model_env(props)
    for key in CODE_PATH_VARIABLES:
        if key in env:
            return f"its env sets {key}={env[key]}, which loads code from wherever it names"
    return None


def module_outside(model_dir: Path, dotted: str) -> Path | None:
    """The first file or folder outside ``model_dir`` that importing the module ``dotted`` would read, when Python
    finds its first part in ``model_dir`` (first on the worker's ``sys.path``), or None. Found as the import
    system finds it (``PathFinder``, each package's search locations in turn) without running any of it: a
    package ``sub`` that is a link out of the directory makes ``sub.model`` outside code. A name not in the
    directory is the server's own installed code (``lmi_handlers.entrypoint``)."""
    from importlib.machinery import PathFinder

    root, search = model_dir.resolve(), [str(model_dir)]
    for part in dotted.split("."):
        spec = PathFinder.find_spec(part, search) if part.isidentifier() else None
        if spec is None:
            return None  # not in the directory (the first part) or not importable at all: nothing of it runs
        search = list(spec.submodule_search_locations or [])
        places = [spec.origin] if spec.has_location and spec.origin else []
        for place in (*places, *search):
            path = Path(place).resolve()
            if not path.is_relative_to(root):
                return path
    return None


class ModelExists(Exception):
    pass


class NotAllowed(Exception):
    """The management API may not load this URL (``--model-url-pattern``)."""


class ModelStore:
    """The models this server holds, by name."""

    def __init__(self, server: ServerConfig):
        self.server = server
        self.models: dict[str, ServedModel] = {}
        #: The model directories the operator named at start (name -> directory): the chat page may switch
        #: among these only, never load a directory it names itself.
        self.catalog: dict[str, str] = {}
        #: One model loaded at a time (one accelerator's memory): activating one unloads the others.
        self.one_at_a_time = False
        self._lock = threading.Lock()
        self._switching = threading.Lock()
        #: Requests in flight, and whether new ones are refused (a drain after SIGTERM).
        self.drain = Drain(server.drain_timeout)

    def offer(self, name: str, url: str, load: bool = True) -> None:
        """Add an operator's model to the catalog, and load it unless ``load`` is False."""
        self.catalog[name] = url
        if load:
            self.register(name, url)

    def activate(self, name: str) -> ServedModel:
        """Load a catalog model (again, if it failed); with ``one_at_a_time``, unload the others first."""
        url = self.catalog[name]
        with self._switching:
            model = self.models.get(name)
            if model is not None and model.status is not Status.FAILED:
                return model
            if model is not None:
                self.unregister(name)
            if self.one_at_a_time:
                for other in [n for n in self.models if n != name]:
                    self.unregister(other, f"model {other} was unloaded: the server switched to model {name} "
                                           "(--one-at-a-time)")
            return self.register(name, url)

    def statuses(self) -> dict[str, str]:
        """Every catalog and loaded model: READY, PENDING, FAILED, or UNLOADED for a catalog model not loaded."""
        names = list(self.catalog) + [n for n in self.models if n not in self.catalog]
        return {n: self.models[n].status.value if n in self.models else "UNLOADED" for n in names}

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

    def register_url(self, name: str, url: str, overrides: Mapping[str, str] | None = None) -> ServedModel:
        """``register`` for the management API: loading a directory runs its code, so only a directory whose
        resolved path matches ``model_url_pattern`` may be loaded."""
        resolved = self.allowed(url, "model")
        outside = code_outside(Path(resolved))
        if outside:
            raise NotAllowed(f"model URL {url}: {outside}; --model-url-pattern bounds the code a model runs as well "
                             "as its directory")
        return self.register(name, url, overrides)

    def allowed(self, url: str, what: str) -> str:
        """``url``'s resolved path when ``model_url_pattern`` lets the management API load it (a model directory, an
        adapter's folder), else ``NotAllowed`` (a ``ValueError`` for a URL that is no path at all)."""
        pattern = self.server.model_url_pattern
        if "\x00" in url:  # no path holds one; Path.resolve would raise
            raise ValueError(f"{what} URL {url!r} holds a NUL byte: send a directory's path")
        resolved = str(Path(url.removeprefix("file://")).expanduser().resolve())
        if pattern is None:
            raise NotAllowed(f"loading {what}s by URL is off: start lmi serve with --model-url-pattern REGEX to "
                             "allow the directories that match it")
        if re.fullmatch(pattern, resolved) is None:
            raise NotAllowed(f"{what} URL {url} (resolved to {resolved}) does not match --model-url-pattern {pattern}")
        return resolved

    def unregister(self, name: str, reason: str | None = None) -> bool:
        """Unload a model; its queued and running requests end at once with a 503 that says ``reason``."""
        with self._lock:
            model = self.models.pop(name, None)
        if model is None:
            return False
        model.stop(reason)
        return True

    def remove(self, name: str) -> bool:
        """Unload a model and forget it (the management API's DELETE): its name is then unknown (404), as in
        DJLServing, rather than a model of the catalog that is not loaded (503)."""
        self.catalog.pop(name, None)
        return self.unregister(name)

    def get(self, name: str) -> ServedModel | None:
        return self.models.get(name)

    def close(self, reason: str | None = None) -> None:
        """Unload every model; their queued and running requests end with a 503 that says ``reason``."""
        for name in list(self.models):
            self.unregister(name, reason)

    def halt(self) -> None:
        """Kill every model's worker now, without waiting for a step to end (a second signal); ``close`` follows."""
        for model in list(self.models.values()):
            model.halt("the server was stopped at once (a second SIGTERM or SIGINT)")


def model_name_for(path: str) -> str:
    """``name=path`` names a model explicitly; otherwise DJL takes the last path segment."""
    if "=" in path and not path.startswith(("/", ".")):
        return path.split("=", 1)[0]
    return Path(path.rstrip("/")).name or "model"


def model_path_for(path: str) -> str:
    return path.split("=", 1)[1] if "=" in path and not path.startswith(("/", ".")) else path
