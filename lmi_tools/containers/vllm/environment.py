"""A model directory's ``serving.properties`` as the environment of AWS's vLLM container, and that container's command.

The container takes its engine settings as ``SM_VLLM_*`` variables, which its entrypoint
(``sagemaker_entrypoint.sh`` and ``sagemaker_args.py`` in aws/deep-learning-containers) turns into the flags of
``python3 -m vllm.entrypoints.openai.api_server``: ``SM_VLLM_MAX_NUM_SEQS=8`` is ``--max-num-seqs 8``; ``true`` is
the bare flag and ``false`` leaves it out (so a flag that is on by default is turned off with its ``--no-`` form:
``SM_VLLM_NO_ENABLE_PREFIX_CACHING=true``); a JSON list gives one argument per element; anything else is passed as
written; ``--port 8080`` comes first.

``container_environment`` is a pure function of the init properties, which it resolves as the handler does in the
container (``vllm_container/service.py``'s ``container_deployment``: the runtime's resolver, the vllm backend named):
LMI's option names become vLLM's engine arguments exactly as the vllm backend maps them on DJLServing
(``backends/vllm/options.py``, LoRA in ``backends/vllm/adapters.py``), every other ``option.<engine argument>``
passes through, as LMI's vLLM handler passes it, and the tool-call options are the server's flags of the same names.
What the handler itself reads (``max_new_tokens``, ``output_formatter``, ``tgi_compat``, the request limits) stays
in ``serving.properties``, which the handler reads beside ``model.py`` in the container (``vllm_container/``).
DJLServing's own settings (workers, queues, timeouts, its batching) are not carried, and each is named in a note;
an option with no vLLM equivalent (another backend's, a CPU device, an ``s3://`` model, a name neither vLLM nor the
handler reads) is refused, naming it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from lmi_handlers.backends.hf.paged_cache import POOL_KEYS
from lmi_handlers.backends.registry import BACKENDS
from lmi_handlers.backends.vllm import KEYS as VLLM_KEYS
from lmi_handlers.backends.vllm.adapters import vllm_engine_args
from lmi_handlers.config import HANDLER_KEYS, SERVER_KEYS, ConfigError, check_unknown_keys
from lmi_handlers.deployment import Host
from lmi_handlers.structured.reasoning import KEYS as REASONING_KEYS
from lmi_handlers.vllm_container.service import container_deployment

PREFIX = "SM_VLLM_"
#: Where SageMaker puts the model directory; the container loads ``model.py`` from there (``SAGEMAKER_MODEL_PATH``).
MODEL_PATH = "/opt/ml/model"
#: The container as the resolver's target: a GPU host, whatever its instance (the backend is named: vllm).
GPU_HOST = Host(family="gpu", kind="gpu")
#: Read by the handler in the container from serving.properties, or turned into engine arguments by the options
#: (LoRA's); the reasoning parser is both the handler's and vLLM's (its structured outputs wait for the reasoning).
NOT_FLAGS = (HANDLER_KEYS - frozenset(REASONING_KEYS)) | SERVER_KEYS | {"model_dir", "tokenizer"}
#: vLLM's own defaults of engine arguments every mapping has: left out unless serving.properties sets them.
VLLM_DEFAULTS = {"dtype": "auto", "trust_remote_code": False, "pipeline_parallel_size": 1}
#: DJLServing's batching settings: vLLM's server batches continuously, as DJL's ``rolling_batch=vllm``.
BATCHING = ("rolling_batch", "async_mode", "batch_size", "max_batch_delay")


@dataclass(frozen=True)
class ContainerEnvironment:
    """The container's ``SM_VLLM_*`` variables, the option key each came from, and what was not carried, with why."""

    env: dict[str, str]
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def container_environment(props: Mapping[str, str], model: str, *, adapters: Iterable[str] = (),
                          served_name: str | None = None, gpus: int = 1,
                          model_path: str = MODEL_PATH) -> ContainerEnvironment:
    """The environment for init properties ``props`` (``option.`` stripped) serving ``model`` (``model_location``)
    with the adapter folders ``adapters/<name>`` beside serving.properties, under ``served_name``, on ``gpus``
    GPUs (``tensor_parallel_degree=max``); ``ConfigError`` names an option the container cannot honour."""
    _refuse(props)
    deployment = container_deployment(props, model, model_path, GPU_HOST)
    options, lora, tools = deployment.options, deployment.lora, deployment.tools
    args: dict[str, Any] = options.engine_args(model)
    del args["tokenizer"]  # vLLM's default: the model's own
    if options.tensor_parallel_size is None:
        args["tensor_parallel_size"] = gpus
    args.update(vllm_engine_args(lora))
    chosen = [(name, value, "model_id" if name == "model" else options.source(name)) for name, value in args.items()
              if options.source(name) in props or name not in VLLM_DEFAULTS or VLLM_DEFAULTS[name] != value]
    chosen += [(key, text, key) for key, text in options.passthrough if key not in NOT_FLAGS]
    chosen += [(key, value, key) for key, value in (("enable_auto_tool_choice", tools.auto),
                                                    ("tool_call_parser", tools.parser)) if key in props]
    env: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name, value, source in chosen:
        variable = _put(env, name, value, explicit=source in props)
        if variable is not None:
            sources[variable] = source
    if served_name and "served_model_name" not in props:
        env[PREFIX + "SERVED_MODEL_NAME"] = served_name
    names = sorted(adapters)
    if names:
        if not lora.enabled:
            raise ConfigError("enable_lora", props.get("enable_lora", "false"), f"the adapters folder holds "
                              f"{', '.join(names)}; the container serves them only with option.enable_lora=true")
        env[PREFIX + "LORA_MODULES"] = json.dumps([{"name": n, "path": f"{model_path}/adapters/{n}"} for n in names])
    return ContainerEnvironment(dict(sorted(env.items())), sources, _notes(props))


def model_location(model_id: str, local_folder: bool, model_path: str = MODEL_PATH) -> str:
    """What the container serves for ``option.model_id``: the model directory itself when unset (the weights
    beside serving.properties), a folder inside it (``local_folder``) under ``model_path``, else the id as given
    (a Hugging Face hub id)."""
    if not model_id or model_id in (".", "./"):
        return model_path
    if model_id == MODEL_PATH or model_id.startswith(MODEL_PATH + "/"):
        return model_path + model_id[len(MODEL_PATH):]
    return f"{model_path}/{model_id.strip('/')}" if local_folder else model_id


def entrypoint_args(env: Mapping[str, str]) -> list[str]:
    """The server's arguments from the ``SM_VLLM_*`` variables of ``env``, as the container's entrypoint builds
    them (without its leading ``--port 8080``)."""
    argv: list[str] = []
    for key in sorted(k for k in env if k.startswith(PREFIX)):
        flag, value = "--" + key[len(PREFIX):].lower().replace("_", "-"), env[key]
        if value.strip().lower() == "false":
            continue
        if value.strip().lower() == "true" or not value:
            argv.append(flag)
            continue
        elements = _json_list(value)
        if elements is None:
            argv += [flag, value]
        elif elements:
            argv += [flag, *elements]
    return argv


def check_with_vllm(environment: ContainerEnvironment) -> bool:
    """The server's arguments through the installed vLLM's own parser (that of ``vllm serve``), as the container
    would start it: False where vLLM is not installed (nothing checked); a ``ConfigError`` names the option behind
    a flag vLLM refuses (an engine argument it does not have, a value of the wrong type or out of its choices)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            make_arg_parser(FlexibleArgumentParser()).parse_args(["--port", "8080",
                                                                  *entrypoint_args(environment.env)])
    except SystemExit:
        message = (said.getvalue().strip().splitlines() or ["refused"])[-1]
        refused = [k for k in environment.env if "--" + k[len(PREFIX):].lower().replace("_", "-") in message]
        name = max(refused, key=len) if refused else PREFIX + "MODEL"
        key = environment.sources.get(name, name[len(PREFIX):].lower())
        raise ConfigError(key, environment.env.get(name, ""), f"vLLM's server refuses {name}: {message}") from None
    return True


def _refuse(props: Mapping[str, str]) -> None:
    """A ``ConfigError`` for the first option the vLLM container has no equivalent of."""
    rules = {"backend": ("", "auto", "vllm"), "rolling_batch": ("", "auto", "vllm", "disable"),
             "device": ("", "auto", "cuda")}
    for key, allowed in rules.items():
        if str(props.get(key, "")).strip().lower() not in allowed:
            raise ConfigError(key, props[key], f"AWS's vLLM container runs vLLM's engine on NVIDIA GPUs; allowed "
                              f"values there are {', '.join(a for a in allowed if a)}")
    if str(props.get("model_id", "")).startswith("s3://"):
        raise ConfigError("model_id", props["model_id"], "the vLLM container does not download s3:// models as "
                          "DJLServing does: put the weights in the artifact (model_id unset) or give a hub id")
    if props.get("override_neuron_config"):
        raise ConfigError("override_neuron_config", props["override_neuron_config"], "it configures vLLM's Neuron "
                          "plugin; AWS's vLLM container runs on NVIDIA GPUs")
    others = {key: name for name, entry in BACKENDS.items() if name != "vllm" for key in entry.keys}
    shared = VLLM_KEYS | HANDLER_KEYS | SERVER_KEYS | POOL_KEYS  # the hf backend's KV pool keys are vLLM's names
    for key in sorted(props):
        if key in others and key not in shared:
            raise ConfigError(key, props[key], f"an option of the {others[key]} backend; vLLM has no equivalent "
                              "(remove it to serve this model in AWS's vLLM container)")
        unknown = check_unknown_keys({key: props[key]}, VLLM_KEYS)
        if unknown:  # DJLServing would ignore it; the container's server would refuse it as a flag
            raise ConfigError(key, props[key], f"neither vLLM's engine nor LMI's handler reads it ({unknown[0]} on "
                              "DJLServing); a flag of vLLM's server goes as an SM_VLLM_* variable (lmi deploy --env)")


def _notes(props: Mapping[str, str]) -> tuple[str, ...]:
    notes = []
    batching = [key for key in BATCHING if key in props]
    if batching:
        notes.append(f"{', '.join(batching)}: vLLM's server batches by itself (continuous batching, as DJL's "
                     "rolling_batch=vllm); max_rolling_batch_size is its --max-num-seqs")
    djl = sorted(key for key in props if key in SERVER_KEYS and key not in BATCHING)
    if djl:
        notes.append(f"{', '.join(djl)}: DJLServing's own settings; the vLLM container has no DJLServing "
                     "(model.py is loaded by it; lmi deploy's --startup-timeout bounds the start)")
    return tuple(notes)


def _put(env: dict[str, str], name: str, value: Any, explicit: bool) -> str | None:
    """Sets ``name``'s variable for ``value`` and returns it: booleans as the entrypoint reads them, a false one set
    by the user as the flag's ``--no-`` form (vLLM's boolean flags all have one); None leaves vLLM's default."""
    text = value.strip().lower() if isinstance(value, str) else None
    key = PREFIX + name.upper()
    if isinstance(value, bool) or text in ("true", "false"):
        if value is True or text == "true":
            env[key] = "true"
        elif explicit:
            key = PREFIX + "NO_" + name.upper()
            env[key] = "true"
        else:
            return None
    elif isinstance(value, (dict, list)):
        env[key] = json.dumps(value, separators=(",", ":"))
    elif value is not None:
        env[key] = str(value)
    else:
        return None
    return key


def _json_list(value: str) -> list[str] | None:
    """A JSON list's elements as arguments (objects and lists as compact JSON); None for any other value."""
    stripped = value.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return None
    try:
        items = json.loads(stripped)
    except ValueError:
        return None
    return [json.dumps(i, separators=(",", ":")) if isinstance(i, (dict, list)) else str(i) for i in items]
