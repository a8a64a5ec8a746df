"""The real model over real sockets: ``lmi serve`` (rolling batch) serving SmolLM2-135M-Instruct, asked with the
unmodified ``openai`` client, plain and streamed, and with the LMI schema over httpx."""

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.quality

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(serve_module, smollm2_dir):
    model = serve_module.model_dir("smollm2", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                               "option.model_id": str(smollm2_dir), "option.rolling_batch": "scheduler",
                                               "option.max_new_tokens": 32})
    return serve_module([model], ready=False).wait_ready(timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_chat_answers_and_ends_on_eos(oai):
    answer = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32)
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens < 32


def test_openai_chat_streams_the_same_answer(oai):
    stream = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The capital of France is Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_plain_completion_with_a_stop_sequence(server):
    body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 16, "stop": ["\n"]}}
    answer = httpx.post(server.url + "/predictions/smollm2", json=body, timeout=300)
    assert answer.status_code == 200 and answer.json() == {"generated_text": " Paris."}


@pytest.mark.parametrize("path, finish", [("/v1/chat/completions", "stop"), ("/predictions/smollm2", "eos_token")])
def test_bench_counts_the_tokens_an_answer_has_when_it_ends_on_eos(server, smollm2_dir, tmp_path, path, finish):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    if path.startswith("/v1"):  # OpenAI's default temperature is 1: ask for greedy, as the LMI schema's default is
        prompt, greedy = QUESTION[0]["content"], ["--extra-body", '{"temperature": 0}']
    else:
        prompt, greedy = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True), []
    report, records = _bench(server.url + path, tmp_path, "--no-ignore-eos", "--prompt", prompt,
                             "--tokenizer", str(smollm2_dir), *greedy)
    tokens = report["runs"][0]["summary"]["tokens"]
    # The answer plus its EOS, as the server counted them: fewer than the 32 asked for, and the report says why.
    answer = len(tokenizer("The capital of France is Paris.", add_special_tokens=False).input_ids) + 1
    assert tokens["finish_reasons"] == {finish: 2} and tokens["output_range"] == [answer, answer]
    assert tokens["output"] == 2 * answer and tokens["sources"]["output"] == {"server": 2}
    assert all(r["finish_reason"] == finish and r["output_tokens"] == answer for r in records)


def test_bench_with_ignore_eos_counts_max_new_tokens(server, smollm2_dir, tmp_path):
    report, records = _bench(server.url + "/predictions/smollm2", tmp_path, "--ignore-eos", "--prompt",
                             "The capital of France is", "--max-new-tokens", "40")
    tokens = report["runs"][0]["summary"]["tokens"]
    assert tokens["finish_reasons"] == {"length": 2} and tokens["output"] == 2 * 40
    assert all(len(r["token_times"]) == 40 for r in records)


def _bench(url, tmp_path, *args):
    from lmi_tools.cli import main

    out = tmp_path / "bench"
    assert main(["bench", url, "-c", "1", "-n", "2", "--warmup", "0", "--max-new-tokens", "32", *args,
                 "--no-plots", "--no-progress", "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    return report, [json.loads(line) for line in (out / "requests-c1.jsonl").read_text().splitlines()[1:]]
