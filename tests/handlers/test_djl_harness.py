"""DJL's own test harness (``djl_python.test_model``) against this handler, the invocations docs/djl-compat.md
lists as working. djl_python is not on the package registries: these run where it is installed."""

import json

import pytest

test_model = pytest.importorskip("djl_python.test_model")
entrypoint = pytest.importorskip("lmi_handlers.entrypoint")


@pytest.fixture
def harness(tmp_path, monkeypatch):
    def make(**options):
        lines = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.backend": "scripted",
                 **{f"option.{k}": v for k, v in options.items()}}
        (tmp_path / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        monkeypatch.setattr(entrypoint, "_service", entrypoint.Handler())
        return test_model.TestHandler("lmi_handlers.entrypoint", str(tmp_path))

    monkeypatch.chdir(tmp_path)  # TestHandler changes directory into the model
    return make


def bodies(output):
    return [json.loads(bytes(v)) for v in output.content.get_values()]


def test_a_single_request(harness):
    out = harness(max_new_tokens=2).inference(test_model.create_json_request({"inputs": "x"}))
    assert out.code == 200 and bodies(out) == [{"generated_text": " T"}]


@pytest.mark.parametrize("size", [2, 4])
def test_a_dynamic_batch(harness, size):
    out = harness(max_new_tokens=2).inference_batch([{"inputs": "x"}] * size,
                                                    [{"Content-Type": "application/json"}] * size)
    assert bodies(out) == [{"generated_text": " T"}] * size


def test_the_rolling_batch_helper_without_an_init_call(harness):
    requests = [{"inputs": "x", "parameters": {"max_new_tokens": n}} for n in (1, 3)]
    result = harness(rolling_batch="auto").inference_rolling_batch(requests)
    assert {i: json.loads(text) for i, text in result.items()} == {0: {"generated_text": " "},
                                                                    1: {"generated_text": " Th"}}
