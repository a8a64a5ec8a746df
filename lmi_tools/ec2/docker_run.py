"""The ``docker run`` line that serves a model directory on an EC2 inf2 (or trn1) or GPU host.

``plan_docker_run`` turns a model directory, its ``serving.properties`` and an instance type into
a ``DockerRun``: the argument vector plus notes for the user. Facts (``reference/neuron.md`` §2.2,
§4-5): each ``/dev/neuronN`` device is one chip with 2 NeuronCores, DJLServing counts the cores
of the devices a container gets and starts floor(cores / TP) model copies, each on its own cores;
``--device`` takes one device at a time.

Device choice (``copies``): by default the container gets every chip, so DJL runs as many copies
as fit (the instance is fully used, at the price of one load - and possibly one compile - per
copy). ``copies=N`` passes only the chips N copies need (devices 0..k-1), leaving the others for
other containers; with TP 1 a chip still has two cores, so DJL starts two copies on it.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from lmi_handlers.backends.registry import NAMES, for_instance
from lmi_handlers.config import ConfigError, parse_choice, parse_int

from ..errors import UsageError, ValidationFailed
from ..instances import INSTANCES, Instance, lookup
from ..modeldir.handler_config import CONTAINER_MODEL_DIR

IMAGES = {"neuron": "lmi-handlers:neuronx", "gpu": "lmi-handlers:gpu"}
STOCK_IMAGES = {"neuron": "deepjavalibrary/djl-serving:0.29.0-pytorch-inf2", "gpu": "deepjavalibrary/djl-serving:0.29.0-lmi"}
CONTAINER_CACHE = "/var/tmp/neuron-compile-cache"
#: Compiling on first start takes minutes to an hour (the image's own default is 1200 s).
LOADING_TIMEOUT = {"neuron": 3600, "gpu": 1800}
PREDICT_TIMEOUT = 240


@dataclass(frozen=True)
class DockerRun:
    argv: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class DockerOptions:
    """What the user chose on the command line (None: take it from serving.properties or defaults)."""

    instance: str
    image: str | None = None
    tp: int | None = None
    copies: int | None = None  # None: all chips / all GPUs
    port: int = 8080
    compile_cache: str = "/var/tmp/neuron-compile-cache"
    loading_timeout: int | None = None
    predict_timeout: int = PREDICT_TIMEOUT
    name: str | None = None


def plan_docker_run(model_dir: Path, properties: Mapping[str, str], options: DockerOptions) -> DockerRun:
    instance = lookup(options.instance)
    backend = _backend(properties, instance)
    tp = _tp_degree(properties, options, instance)
    _check_fit(instance, tp)
    copies = options.copies
    if copies is not None and copies * tp > instance.cores:
        raise ValidationFailed(f"{copies} copies of TP {tp} need {copies * tp} {_unit(instance)}; {instance.name} has "
                               f"{instance.cores}", hint=f"use at most {instance.cores // tp} copies")
    argv = ["docker", "run", "--rm", "--name", options.name or f"lmi-{_slug(model_dir.name)}",
            "-p", f"{options.port}:8080", "-v", f"{model_dir.resolve()}:{CONTAINER_MODEL_DIR}"]
    timeout = options.loading_timeout or LOADING_TIMEOUT[instance.kind]
    argv += ["-e", f"MODEL_LOADING_TIMEOUT={timeout}", "-e", f"PREDICT_TIMEOUT={options.predict_timeout}"]
    notes = [f"{instance.name}: {_describe(instance)}; backend {backend}, tensor parallel degree {tp}"]
    if instance.kind == "neuron":
        argv, more = _neuron_args(argv, instance, tp, copies, options.compile_cache)
    else:
        argv, more = _gpu_args(argv, instance, tp, copies)
    notes += more
    image = options.image or IMAGES[instance.kind]
    if options.image is None:
        notes.append(f"image {image}: build it first with `docker build -f docker/"
                     f"{'neuronx' if instance.kind == 'neuron' else 'gpu'}.Dockerfile -t {image} .`; with a stock "
                     f"image ({STOCK_IMAGES[instance.kind]}) the model directory must carry the runtime (`lmi package`)")
    return DockerRun(argv + [image], notes)


def _backend(properties: Mapping[str, str], instance: Instance) -> str:
    """The backend ``option.backend`` names (``auto``: the first that runs on the instance), refused where it does
    not run on the instance."""
    try:
        name = parse_choice({"backend": properties.get("option.backend", "")}, "backend", "auto", NAMES)
        backend = for_instance(name, instance.family)
    except ConfigError as exc:
        raise UsageError(f"{exc} (in serving.properties)") from None
    if not backend.runs_on(instance.family):
        raise ValidationFailed(backend.not_on(instance.name), hint=f"set option.backend=auto, or pick an instance "
                               f"of {', '.join(backend.instance_families)}")
    return backend.name


def _tp_degree(properties: Mapping[str, str], options: DockerOptions, instance: Instance) -> int:
    if options.tp is not None:
        return options.tp
    raw = properties.get("option.tensor_parallel_degree", "").strip()
    if raw == "max":
        return instance.cores
    if not raw:
        if instance.kind == "gpu":
            return 1  # the handler's own default
        raise UsageError("serving.properties sets no option.tensor_parallel_degree",
                         hint=f"add it (one of {_list(instance.tp_degrees)} on {instance.name}) or pass --tp")
    try:
        return parse_int({"tensor_parallel_degree": raw}, "tensor_parallel_degree", 1)  # the runtime's parser
    except ConfigError as exc:
        raise UsageError(f"{exc} (in serving.properties)", hint="use an integer or max") from None


def _check_fit(instance: Instance, tp: int) -> None:
    if tp in instance.tp_degrees:
        return
    bigger = sorted((i for i in INSTANCES.values() if i.family == instance.family and tp in i.tp_degrees),
                    key=lambda i: i.cores)
    suggestion = f"; or use {bigger[0].name}" if bigger else ""
    raise ValidationFailed(f"tensor parallel degree {tp} does not fit {instance.name} ({_describe(instance)})",
                           hint=f"use one of {_list(instance.tp_degrees)}{suggestion}")


def _neuron_args(argv: list[str], instance: Instance, tp: int, copies: int | None,
                 cache: str) -> tuple[list[str], list[str]]:
    chips = instance.chips if copies is None else math.ceil(copies * tp / instance.cores_per_chip)
    cores = chips * instance.cores_per_chip
    for device in instance.devices[:chips]:
        argv += ["--device", device]
    argv += ["-v", f"{cache}:{CONTAINER_CACHE}", "-e", f"NEURON_COMPILE_CACHE_URL={CONTAINER_CACHE}"]
    which = "all" if chips == instance.chips else f"{chips} of {instance.chips}"
    notes = [f"passing {which} chips ({_range(chips)}): {cores} NeuronCores, so DJL starts {cores // tp} "
             f"model {'copy' if cores // tp == 1 else 'copies'} of {tp} cores each",
             f"compiled graphs are cached in {cache} on the host and reused by later starts"]
    if cores % tp:
        notes.append(f"{cores % tp} NeuronCore(s) stay idle: {cores} is not a multiple of TP {tp}")
    return argv, notes


def _gpu_args(argv: list[str], instance: Instance, tp: int, copies: int | None) -> tuple[list[str], list[str]]:
    if copies is None:
        argv += ["--gpus", "all"]
        gpus = instance.cores
    else:
        gpus = copies * tp
        argv += ["--gpus", '"device=' + ",".join(str(i) for i in range(gpus)) + '"']
    return argv, [f"passing {gpus} of {instance.cores} GPUs: DJL starts {gpus // tp} model "
                  f"{'copy' if gpus // tp == 1 else 'copies'} of {tp} GPU(s) each"]


def _describe(instance: Instance) -> str:
    if instance.kind == "neuron":
        chip = "Trainium" if instance.name.startswith("trn") else "Inferentia2"
        return f"{instance.chips} {chip} chip{'s' if instance.chips > 1 else ''}, {instance.cores} NeuronCores"
    return f"{instance.cores} x {instance.gpu}"


def _unit(instance: Instance) -> str:
    return "NeuronCores" if instance.kind == "neuron" else "GPUs"


def _range(chips: int) -> str:
    return "/dev/neuron0" if chips == 1 else f"/dev/neuron0../dev/neuron{chips - 1}"


def _list(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values))


def _slug(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in name).strip("-.") or "model"
    return cleaned.lower()
