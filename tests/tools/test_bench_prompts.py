"""Prompts of an exact token length, counted with the model's own tokenizer."""

import pytest

from lmi_tools.bench.prompts import TokenCounter, build_prompts
from lmi_tools.bench.records import RequestRecord
from lmi_tools.bench.runner import count_tokens
from lmi_tools.errors import UsageError


@pytest.fixture(scope="module")
def counter(tiny_model_dir):
    return TokenCounter.load(tiny_model_dir)


@pytest.mark.parametrize("tokens", [2, 7, 64, 104, 300])
def test_prompts_have_exactly_the_asked_token_count(counter, tokens):
    prompts = build_prompts(tokens, counter)
    assert len(set(prompts.prompts)) == len(prompts.prompts) == 8  # distinct variants
    assert prompts.token_counts == (tokens,) * 8
    assert all(counter.prompt_tokens(p) == tokens for p in prompts.prompts)
    assert "counted with" in prompts.description


def test_the_count_includes_the_special_tokens_the_model_sees(counter):
    assert counter.prompt_tokens("") == 1  # the tiny tokenizer adds BOS
    with pytest.raises(UsageError, match="leaves no room"):
        build_prompts(1, counter)


def test_without_a_tokenizer_prompts_are_words_with_unknown_counts():
    prompts = build_prompts(20, None, variants=3)
    assert [len(p.split()) for p in prompts.prompts] == [20, 20, 20]
    assert prompts.token_counts == (None, None, None) and "no tokenizer" in prompts.description


def test_a_given_prompt_is_sent_as_is(counter):
    prompts = build_prompts(64, counter, text="Hello [[delay=5]]")
    assert prompts.prompts == ("Hello [[delay=5]]",) and prompts.token_counts == (counter.prompt_tokens(
        "Hello [[delay=5]]"),)


def test_a_missing_tokenizer_directory_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot load a tokenizer"):
        TokenCounter.load(tmp_path)


def test_counts_the_server_did_not_report_come_from_the_tokenizer(counter):
    prompts = build_prompts(16, counter, variants=2)
    served = RequestRecord(index=0, send=0, end=1, input_tokens=17, input_tokens_source="server", output_tokens=3,
                           output_tokens_source="server", text="ignored")
    streamed = RequestRecord(index=1, send=0, end=1, output_tokens=2, output_tokens_source="events",
                             text=" quick brown fox")
    failed = RequestRecord(index=2, send=0, end=1, error="HTTP 500: x", text=None)
    count_tokens([served, streamed, failed], prompts, counter)
    assert (served.input_tokens, served.input_tokens_source, served.output_tokens) == (17, "server", 3)
    assert (streamed.input_tokens, streamed.input_tokens_source) == (16, "tokenizer")
    expected = len(counter.tokenizer(" quick brown fox", add_special_tokens=False)["input_ids"])
    assert (streamed.output_tokens, streamed.output_tokens_source) == (expected, "tokenizer")
    assert failed.output_tokens is None
    assert all(r.text is None for r in (served, streamed, failed))  # texts are dropped once counted


def test_several_given_prompts_are_cycled_with_their_own_counts(counter):
    texts = ["What is the capital of France?", "Explain gravity in a few sentences."]
    prompts = build_prompts(64, counter, text=texts)
    assert prompts.prompts == tuple(texts) and "2 --prompt texts" in prompts.description
    assert prompts.token_counts == tuple(counter.prompt_tokens(t) for t in texts)
