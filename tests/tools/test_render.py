"""Specs and presets rendered through the templates, and read back by the runtime's own parser."""

from __future__ import annotations

import json

import jinja2
import pytest

from lmi_handlers.backends.neuronx.options import KEYS as NEURONX_KEYS
from lmi_handlers.config import check_unknown_keys
from lmi_handlers.deployment import choose, read_settings
from lmi_tools.errors import UsageError
from lmi_tools.instances import lookup
from lmi_tools.modeldir.properties import parse_directives, read_serving_properties
from lmi_tools.modeldir.render import environment, render_files, write_model_dir
from lmi_tools.modeldir.resources import preset_names, preset_spec
from lmi_tools.modeldir.spec import load_spec, parse_spec
from lmi_tools.modeldir.handler_config import backend_option_keys
from lmi_tools.validation.runtime import host

BASE = {"model_id": "facebook/opt-13b", "instance_type": "inf2.48xlarge", "tensor_parallel_degree": 8}
EXTRA_SPECS = {
    "hf-dynamic-batch": {"model_id": "org/model", "instance_type": "g5.2xlarge", "backend": "hf", "batch_size": 4,
                         "max_batch_delay": 20, "n_positions": 2048, "dtype": "fp16", "output_formatter": "jsonlines",
                         "max_new_tokens": 64, "trust_remote_code": True, "revision": "main"},
    "neuronx-options": {**BASE, "n_positions": 1024, "quantize": "static_int8", "rolling_batch": True,
                        "max_rolling_batch_size": 8, "max_rolling_batch_prefill_tokens": 2048,
                        "options": {"context_length_estimate": [256, 512], "enable_saturate_infinity": True,
                                    "group_query_attention": "shard-over-heads"},
                        "server": {"job_queue_size": 100, "max_idle_time": 120}},
    "s3-weights": {**BASE, "model_id": "s3://bucket/models/opt-13b/"},
    "weights-in-model-dir": {"instance_type": "inf2.xlarge", "tensor_parallel_degree": 2, "backend": "auto"},
    "scripted": {"instance_type": "g5.xlarge", "backend": "scripted",
                 "options": {"scripted_text": "hello there", "scripted_step_delay_ms": 5}},
}


def all_specs() -> list:
    presets = [pytest.param(load_spec(preset_spec(name)), id=f"preset-{name}") for name in preset_names()]
    return presets + [pytest.param(parse_spec(data), id=name) for name, data in EXTRA_SPECS.items()]


def test_every_preset_is_listed():
    assert len(preset_names()) == 12


@pytest.mark.parametrize("spec", all_specs())
def test_rendered_properties_parse_back_through_the_runtime(spec, tmp_path):
    write_model_dir(spec, tmp_path, "test")
    props = read_serving_properties(tmp_path)
    if props.get("model_id", "").startswith("s3://"):
        props["model_id"] = str(tmp_path)  # DJLServing downloads it and passes the local directory
    choice = choose(read_settings({**props, "model_dir": str(tmp_path)}), host(lookup(spec.instance_type)))
    config, backend = choice.config, spec.resolved_backend
    assert choice.backend.name == backend  # as the runtime resolves it on the spec's instance
    assert check_unknown_keys(props, backend_option_keys(backend)) == []
    if backend not in ("scripted", "vllm"):  # vllm presets set vLLM's own options
        assert check_unknown_keys(props, NEURONX_KEYS) == []
    assert config.tensor_parallel_degree == spec.tensor_parallel_degree
    # The image's default mode: async on current LMI images (the handler's engine batches), sync on the last
    # transformers-neuronx one; DJL's rolling batch only beside the sync engine.
    assert config.async_mode == spec.resolved_async_mode == (spec.target_image.name == "djl-lmi" and
                                                             spec.batch_size == 1)
    assert config.rolling == (spec.rolling_batch and not config.async_mode)
    assert config.batch_size == (1 if spec.rolling_batch else spec.batch_size)
    if config.rolling:
        assert props["rolling_batch"] == ("vllm" if backend == "vllm" else "scheduler")
    if config.continuous:
        assert config.max_rolling_batch_size == spec.max_rolling_batch_size
    if spec.n_positions:
        assert props[spec.positions_key] == str(spec.n_positions)
    assert props["engine"] == "Python" and props["entryPoint"] == "model.py"
    assert props["model_loading_timeout"] == str(spec.model_loading_timeout)
    assert props["predict_timeout"] == str(spec.predict_timeout)
    text = (tmp_path / "serving.properties").read_text()
    assert parse_directives(text) == {"instance_type": spec.instance_type, "image": str(spec.target_image)}


def test_rendered_model_py_is_the_two_line_shim(tmp_path):
    write_model_dir(parse_spec(BASE), tmp_path, "test")
    lines = (tmp_path / "model.py").read_text().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("from lmi_handlers.entrypoint import handle")
    namespace: dict = {}
    exec(compile((tmp_path / "model.py").read_text(), "model.py", "exec"), namespace)  # our own template
    assert callable(namespace["handle"])


def test_requirements_lines(tmp_path):
    write_model_dir(parse_spec({**BASE, "requirements": ["numpy<2", "sentencepiece==0.2.0"]}), tmp_path, "test")
    lines = [ln for ln in (tmp_path / "requirements.txt").read_text().splitlines() if not ln.startswith("#")]
    assert lines == ["numpy<2", "sentencepiece==0.2.0"]


def test_neuronx_options_and_server_keys_are_rendered(tmp_path):
    write_model_dir(parse_spec(EXTRA_SPECS["neuronx-options"]), tmp_path, "test")
    props = read_serving_properties(tmp_path)
    assert props["context_length_estimate"] == "256,512"
    assert props["enable_saturate_infinity"] == "true"
    assert props["quantize"] == "static_int8"
    assert props["job_queue_size"] == "100"
    text = (tmp_path / "serving.properties").read_text()
    assert "\njob_queue_size=100\n" in text and "option.job_queue_size" not in text


def test_hf_backend_writes_max_model_len(tmp_path):
    write_model_dir(parse_spec(EXTRA_SPECS["hf-dynamic-batch"]), tmp_path, "test")
    props = read_serving_properties(tmp_path)
    assert props["max_model_len"] == "2048" and "n_positions" not in props
    assert props["backend"] == "hf" and props["batch_size"] == "4" and props["max_batch_delay"] == "20"


def test_json_and_toml_specs_are_equivalent(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps(BASE))
    (tmp_path / "spec.toml").write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in BASE.items()))
    assert load_spec(tmp_path / "spec.json") == load_spec(tmp_path / "spec.toml")


def test_existing_files_need_force(tmp_path):
    spec = parse_spec(BASE)
    write_model_dir(spec, tmp_path, "test")
    with pytest.raises(UsageError, match="already has serving.properties, model.py, requirements.txt") as info:
        write_model_dir(spec, tmp_path, "test")
    assert "--force" in info.value.hint
    write_model_dir(spec, tmp_path, "test", force=True)


def test_templates_use_strict_undefined():
    env = environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ spec.nonexistent_field }}").render(spec={})


def test_values_that_do_not_fit_a_properties_line_are_refused():
    with pytest.raises(UsageError, match="one line"):
        render_files(parse_spec({**BASE, "description": "two\nlines"}), "test")
    with pytest.raises(UsageError, match="backslashes"):
        render_files(parse_spec({**BASE, "model_id": "C:\\models\\opt"}), "test")


@pytest.mark.parametrize("change, message", [
    ({"instance_typo": "x"}, "instance_typo: is not a spec field"),
    ({"instance_type": "inf3.huge"}, "instance_type: unknown instance type"),
    ({"tensor_parallel_degree": 0}, "tensor_parallel_degree: Input should be greater than or equal to 1"),
    ({"rolling_batch": True, "batch_size": 4}, "cannot be combined with rolling_batch"),
    ({"instance_type": "g5.12xlarge", "backend": "neuronx"},
     "backend neuronx runs on inf2, trn1, trn1n, trn2 instances; g5.12xlarge is not one"),
    ({"backend": "lmi-dist"}, "backend: allowed values are auto, vllm, neuronx, hf, scripted"),
    ({"quantize": "awq"}, "quantize: Input should be 'static_int8'"),
    ({"dtype": "float8"}, "dtype: Input should be"),
    ({"output_formatter": "xml"}, "output_formatter: allowed values are"),
    ({"options": {"n_positons": 512}}, "did you mean 'n_positions'"),
    ({"options": {"tensor_parallel_degree": 2}}, "set it with the spec field"),
    ({"options": {"model_dir": "/x"}}, "options.model_dir is not a key"),
    ({"server": {"job_queue_sise": 5}}, "did you mean 'job_queue_size'"),
    ({"instance_type": "g5.12xlarge", "options": {"context_length_estimate": [512]}},
     "read by the neuronx backend only"),
    ({"options": {"scripted_text": "x"}}, "read by the scripted backend only"),
])
def test_spec_errors_name_the_field(change, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_spec({**BASE, **change})


def test_bad_spec_files(tmp_path):
    (tmp_path / "bad.toml").write_text("model_id = \n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_spec(tmp_path / "bad.toml")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_spec(tmp_path / "bad.json")
    with pytest.raises(UsageError, match="cannot read spec"):
        load_spec(tmp_path / "missing.toml")


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UsageError) as info:
        preset_spec("llama-99b")
    assert "opt-13b-inf2-48xlarge" in info.value.hint
