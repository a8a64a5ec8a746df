"""The CPU kernel options (``option.cpu_linear_kernel``, ``option.cpu_attention_kernel``): the init call refuses
what cannot run, naming the option and the value, before the weights load."""

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def refusal(tiny_model_dir, tmp_path, monkeypatch, options):
    from lmi_handlers.handler import Handler
    from lmi_tools.serving.worker.frontend import init_input

    # refused before the weights load: a big model's load would be minutes spent for nothing
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    out = Handler().handle(init_input({"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), **options}))
    assert out is not None and out.code >= 400
    return bytes(out.content.value_at(0)).decode()


@pytest.mark.parametrize("options, words", [
    ({"cpu_linear_kernel": "mkl"}, ("cpu_linear_kernel", "mkl", "stock, onednn, compiled")),
    ({"cpu_linear_kernel": "onednn", "dtype": "bf16"}, ("cpu_linear_kernel", "onednn", "float32")),
    ({"cpu_linear_kernel": "compiled", "dtype": "fp16"}, ("cpu_linear_kernel", "compiled", "float32")),
    ({"cpu_attention_kernel": "flash"}, ("cpu_attention_kernel", "flash", "torch, compiled")),
    ({"cpu_attention_kernel": "compiled", "dtype": "fp16"}, ("cpu_attention_kernel", "compiled", "float32"))])
def test_the_init_call_refuses_what_cannot_run_with_the_option_and_the_value(tiny_model_dir, tmp_path, options, words,
                                                                            monkeypatch):
    body = refusal(tiny_model_dir, tmp_path, monkeypatch, options)
    assert all(word in body for word in words), body


@pytest.mark.parametrize("key", ["cpu_linear_kernel", "cpu_attention_kernel"])
def test_a_kernel_that_cannot_be_built_is_refused_saying_why(tiny_model_dir, tmp_path, monkeypatch, key):
    import torch.utils.cpp_extension

    def no_ninja(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_ninja)
    body = refusal(tiny_model_dir, tmp_path, monkeypatch, {key: "compiled"})
    assert all(word in body for word in (key, "compiled", "Ninja is required", "compiler")), body
