"""The OpenAI sampling fields clients send, through ``lmi serve`` (hf engine, rolling batch) with the unmodified
``openai`` and ``huggingface_hub`` clients on the tiny model: ``n`` choices, top log probabilities, logit bias,
presence and frequency penalties, min-p, plain and streamed. What the sampler computes is checked against
transformers in tests/handlers/test_sampling_fields.py; here, that each field reaches it by its OpenAI name and
comes back in OpenAI's (or TGI's) shape."""

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient

MESSAGES = [{"role": "user", "content": "Tell me about the sea"}]


@pytest.fixture(scope="module")
def server(serve_module, tiny_model_dir):
    model = serve_module.tiny_rolling(tiny_model_dir, rows=8)
    return serve_module([model], ready=False).wait_ready(timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_n_choices_plain_and_streamed_agree_and_count_the_prompt_once(oai):
    kwargs = dict(model="tiny", messages=MESSAGES, n=3, max_tokens=6, seed=7, temperature=1.0)
    whole = oai.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1  # each choice samples its own answer
    assert whole.usage.completion_tokens == 18 and whole.usage.total_tokens == whole.usage.prompt_tokens + 18
    streamed = ["", "", ""]
    chunks = list(oai.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts and chunks[-1].usage == whole.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"] * 3


def test_chat_top_logprobs_are_sorted_alternatives_led_by_the_greedy_choice(oai):
    answer = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0,
                                         logprobs=True, top_logprobs=4)
    content = answer.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 4 and values == sorted(values, reverse=True)
        assert entry.logprob == pytest.approx(values[0], abs=1e-6)  # greedy: the most likely token
    with pytest.raises(openai.BadRequestError, match="top_logprobs: .*logprobs: true"):
        oai.chat.completions.create(model="tiny", messages=MESSAGES, top_logprobs=2)


def test_completions_logprobs_n_and_streaming(oai):
    kwargs = dict(model="tiny", prompt="The sea is", max_tokens=4, n=2, seed=3, logprobs=3)
    whole = oai.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1] and whole.usage.completion_tokens == 8
    for choice in whole.choices:
        assert len(choice.logprobs.tokens) == 4 and "".join(choice.logprobs.tokens) == choice.text
        assert all(3 <= len(top) <= 4 for top in choice.logprobs.top_logprobs)  # the chosen one and 3 alternatives
        assert choice.logprobs.text_offset[0] == 0
    streamed = {0: "", 1: ""}
    for chunk in oai.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert [streamed[0], streamed[1]] == [c.text for c in whole.choices]
    with pytest.raises(openai.BadRequestError, match="logprobs: expected an integer >= 0 and <= 20, got 21"):
        oai.completions.create(model="tiny", prompt="x", logprobs=21)
    with pytest.raises(openai.BadRequestError, match="n: more than one choice needs sampling"):
        oai.completions.create(model="tiny", prompt="x", n=2, temperature=0)


def test_logit_bias_and_penalties_reach_the_sampler(oai):
    greedy = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    plain = oai.chat.completions.create(**greedy, logprobs=True).choices[0].logprobs.content
    forced = oai.chat.completions.create(**greedy, logprobs=True, logit_bias={"300": 100}).choices[0]
    token = forced.logprobs.content[0].token
    assert all(t.token == token for t in forced.logprobs.content) and [t.token for t in plain] != [token] * 8
    # Negative penalties reward what was generated: the first token gains 4 logits, more than the tiny model's
    # logits spread, so greedy decoding repeats it (without them, it never repeats a token here).
    rewarded = oai.chat.completions.create(**greedy, presence_penalty=-2.0, frequency_penalty=-2.0, logprobs=True)
    tokens = [t.token for t in rewarded.choices[0].logprobs.content]
    assert tokens == [tokens[0]] * 8 and tokens[0] == plain[0].token
    sampled = oai.completions.create(model="tiny", prompt="The sea", max_tokens=6, seed=1, extra_body={"min_p": 0.5},
                                     presence_penalty=-1.0, frequency_penalty=0.5, logit_bias={"17": -100})
    assert sampled.choices[0].finish_reason == "length"


def test_tgi_top_n_tokens_come_back_as_top_tokens(server):
    client = InferenceClient(base_url=server.url, timeout=60)
    answer = client.text_generation("The sea", max_new_tokens=3, details=True, top_n_tokens=2, do_sample=False)
    assert [len(position) for position in answer.details.top_tokens] == [2, 2, 2]
    # (huggingface_hub leaves the inner lists as dicts)
    assert [t.id for t in answer.details.tokens] == [position[0]["id"] for position in answer.details.top_tokens]
    events = list(client.text_generation("The sea", max_new_tokens=3, top_n_tokens=2, stream=True, details=True))
    assert [len(e.top_tokens) for e in events] == [2, 2, 2]


def test_lmi_n_answers_with_best_of_sequences(server):
    body = {"inputs": "The sea", "parameters": {"n": 2, "do_sample": True, "seed": 4, "max_new_tokens": 3}}
    answer = httpx.post(server.url + "/invocations", json=body, timeout=60).json()
    assert len(answer["details"]["best_of_sequences"]) == 1 and answer["details"]["seed"] == 4
    assert answer["details"]["best_of_sequences"][0]["seed"] == 5
