"""``option.compiled_graph_path``: compile once, reuse when the settings match, refuse when they don't."""

from __future__ import annotations

import json

import pytest

from lmi_handlers.backends.neuronx.artifacts import MANIFEST
from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import init_input
from .neuronx_support import PROMPTS, ask, load


def graphs_compiled(tnx) -> int:
    return tnx.base.COMPILE_COUNTER["graphs"]


def init_error(model_dir, **options) -> tuple[int, str]:
    properties = {"model_id": str(model_dir), "model_dir": str(model_dir), "backend": "neuronx", "dtype": "fp32",
                  "tensor_parallel_degree": "2", "n_positions": "128", **{k: str(v) for k, v in options.items()}}
    out = Handler().handle(init_input(properties))
    assert out is not None, "the model loaded"
    return out.code, json.loads(bytes(out.content.value_at(0)))["error"]


def test_local_directory_compile_then_reuse_then_refuse(neuronx_standin, tiny_arch, reference, tmp_path):
    model_dir, cache = tiny_arch("llama"), tmp_path / "compiled"
    first = load(model_dir, compiled_graph_path=cache, batch_size=2)
    compiled_once = graphs_compiled(neuronx_standin)
    assert compiled_once > 0
    manifest = json.loads((cache / MANIFEST).read_text())
    assert manifest["settings"]["n_positions"] == 128 and manifest["settings"]["batch_size"] == 2
    assert manifest["versions"]["transformers-neuronx"] == "0.11.351"
    assert len(list(cache.iterdir())) > 1

    second = load(model_dir, compiled_graph_path=cache, batch_size=2)
    assert graphs_compiled(neuronx_standin) == compiled_once  # nothing compiled the second time
    assert ask(second, PROMPTS[0], 5) == ask(first, PROMPTS[0], 5) == reference(model_dir, PROMPTS[0], 5)

    code, error = init_error(model_dir, compiled_graph_path=cache, batch_size=2, n_positions=64, dtype="bf16")
    assert code == 400
    assert "option.compiled_graph_path" in error and "n_positions: 128 -> 64" in error and "amp: 'f32' -> 'bf16'" in error
    assert graphs_compiled(neuronx_standin) == compiled_once


def test_relative_path_is_inside_the_model_directory(neuronx_standin, tiny_arch):
    load(tiny_arch("opt"), compiled_graph_path="neuron-artifacts")
    assert (tiny_arch("opt") / "neuron-artifacts" / MANIFEST).is_file()


def test_artifacts_without_manifest_are_loaded_unverified(neuronx_standin, tiny_arch, tmp_path):
    """E.g. DJL's ahead-of-time ``compiled/`` folder: plain ``model.save()`` output."""
    model_dir = tiny_arch("bloom")
    model = neuronx_standin.BloomForSampling.from_pretrained(str(model_dir), batch_size=1, tp_degree=2, amp="f32",
                                                             n_positions=128)
    model.to_neuron()
    model.save(str(tmp_path / "aot"))
    before = graphs_compiled(neuronx_standin)
    load(model_dir, compiled_graph_path=tmp_path / "aot")
    assert graphs_compiled(neuronx_standin) == before
    assert not (tmp_path / "aot" / MANIFEST).exists()

    code, error = init_error(model_dir, compiled_graph_path=tmp_path / "aot", n_positions=64)
    assert code == 424 and "do not fit this model" in error


def test_unwritable_location_only_costs_a_warning(neuronx_standin, tiny_arch, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, error = init_error(tiny_arch("opt"), compiled_graph_path=blocker)
    assert code == 400 and "is a file" in error

    # A location that cannot be created (under a file): serving goes on, the next start compiles again.
    handler = load(tiny_arch("opt"), compiled_graph_path=blocker / "sub")
    assert handler.backend.model is not None
    assert "could not save compiled artifacts" in caplog.text


def test_s3_location_compile_then_reuse(neuronx_standin, tiny_arch, monkeypatch):
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto.mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="artifacts")
        load(tiny_arch("mistral"), compiled_graph_path="s3://artifacts/mistral/tp2", rolling_batch="auto",
             max_rolling_batch_size=2)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="artifacts")["Contents"]]
        assert f"mistral/tp2/{MANIFEST}" in keys and len(keys) > 1
        compiled_once = graphs_compiled(neuronx_standin)

        handler = load(tiny_arch("mistral"), compiled_graph_path="s3://artifacts/mistral/tp2", rolling_batch="auto",
                       max_rolling_batch_size=2)
        assert graphs_compiled(neuronx_standin) == compiled_once
        assert handler.backend.runner.name == "continuous_batching"

        code, error = init_error(tiny_arch("mistral"), compiled_graph_path="s3://artifacts/mistral/tp2",
                                 rolling_batch="auto", max_rolling_batch_size=4)
        assert code == 400 and "batch_size: 2 -> 4" in error


def test_lmi_compile_then_the_container_reuses_or_names_the_difference(neuronx_standin, tiny_arch, reference,
                                                                        tmp_path, capsys):
    """``lmi compile`` (through the stand-in): validate, compile into the model directory, record the path;
    a load with the same settings compiles nothing, one with another n_positions is refused naming it."""
    import shutil

    # the lmi command (the compat environment has only the runtime's dependencies)
    main = pytest.importorskip("lmi_tools.cli").main

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_arch("llama"), model_dir)
    (model_dir / "serving.properties").write_text("# lmi: instance_type=inf2.xlarge\nengine=Python\n"
                                                  "option.entryPoint=model.py\noption.backend=neuronx\n"
                                                  "option.dtype=fp32\n"
                                                  "option.n_positions=128\noption.tensor_parallel_degree=2\n")
    (model_dir / "model.py").write_text("from lmi_handlers.entrypoint import handle  # noqa: F401\n")
    before = graphs_compiled(neuronx_standin)
    assert main(["compile", str(model_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    compiled = graphs_compiled(neuronx_standin) - before
    assert compiled > 0 and result["files"] == compiled + 1  # the graphs and the manifest
    assert (model_dir / "compiled" / MANIFEST).is_file() and result["reuse_load_s"] > 0
    assert "option.compiled_graph_path=compiled" in (model_dir / "serving.properties").read_text()

    handler = Handler()
    from lmi_tools.modeldir.properties import read_serving_properties

    props = {**read_serving_properties(model_dir), "model_dir": str(model_dir), "model_id": str(model_dir)}
    assert handler.handle(init_input(props)) is None
    assert graphs_compiled(neuronx_standin) - before == compiled  # the container load compiled nothing
    assert ask(handler, PROMPTS[0], 4) == reference(model_dir, PROMPTS[0], 4)
    code, error = init_error(model_dir, compiled_graph_path="compiled", n_positions=256)
    assert code == 400 and "n_positions: 128 -> 256" in error

    assert main(["compile", str(model_dir)]) == 2  # compiled already: refused, nothing overwritten
    assert "is not empty" in capsys.readouterr().err
    assert main(["compile", str(model_dir), "--instance", "ml.g5.xlarge"]) != 0
