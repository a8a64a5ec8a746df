"""Reasoning models (``structured/reasoning.py``): the ``<think>`` part read apart whole or in any pieces, as vLLM's
parsers of the same names read it, and the grammar of a constraint that starts after ``</think>``."""

import dataclasses
import json
import random

import pytest

from lmi_handlers.errors import ConfigError
from lmi_handlers.structured.constraint import json_schema
from lmi_handlers.structured.reasoning import PARSERS, Reasoning, ReasoningReader, reasoning_for


def convention(name, started=None):
    start, end, opens = PARSERS[name]
    return Reasoning(name, start, end, 1, 2, opens if started is None else started)


@pytest.mark.parametrize("name, started, text, want", [
    ("deepseek_r1", None, "plan it</think>\n\nAnswer.", ("plan it", "\n\nAnswer.")),
    ("deepseek_r1", None, "<think>plan it</think>Answer.", ("plan it", "Answer.")),
    ("deepseek_r1", None, "cut short before the end", ("cut short before the end", None)),
    ("deepseek_r1", None, "</think>at once", ("", "at once")),
    ("qwen3", None, "no reasoning here", (None, "no reasoning here")),
    ("qwen3", None, "<think>plan</think>Answer.", ("plan", "Answer.")),
    ("qwen3", True, "plan</think>Answer.", ("plan", "Answer.")),  # the prompt left <think> open
    ("qwen3", None, "  <think>x</think>", ("x", None)),
])
def test_a_whole_answer_splits_as_vllms_parsers_read_it(name, started, text, want):
    assert convention(name, started).split(text) == want


def test_any_pieces_give_the_whole_answers_split_and_hold_back_partial_tags():
    rng = random.Random(0)
    for name in PARSERS:
        for text in ("<think>a < b, </thin k> is not it</think>so: <think> stays", "reasoning</think>", "<th",
                     "plain < text"):
            reader, thought, content = ReasoningReader(convention(name)), "", ""
            cuts = sorted(rng.sample(range(1, len(text)), min(4, len(text) - 1)))
            for piece in (text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])):
                more_thought, more_content = reader.feed(piece)
                thought, content = thought + more_thought, content + more_content
            tail = reader.flush()
            whole = convention(name).split(text)
            assert (thought + tail[0], content + tail[1]) == (whole[0] or "", whole[1] or ""), (name, text)


def test_the_tags_must_be_tokens_of_the_vocabulary(tiny_model_dir, thinking_model_dir):
    from transformers import AutoTokenizer

    with pytest.raises(ConfigError, match="no <think> token"):
        reasoning_for({"reasoning_parser": "deepseek_r1"}, AutoTokenizer.from_pretrained(tiny_model_dir))
    with pytest.raises(ConfigError, match="reasoning_parser"):
        reasoning_for({"reasoning_parser": "granite"}, None)
    found = reasoning_for({"reasoning_parser": "qwen3"}, AutoTokenizer.from_pretrained(thinking_model_dir))
    assert found is not None and not found.started and found.for_prompt("<|assistant|><think>\n").started


def test_the_constraint_starts_after_the_end_token(thinking_model_dir):
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(thinking_model_dir)
    reasoning = reasoning_for({"reasoning_parser": "deepseek_r1"}, tokenizer)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constraint = json_schema("response_format", schema)
    grammar = dataclasses.replace(constraint, lead=reasoning.lead()).grammar()
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer),
                                                                eos_token=tokenizer.eos_token_id), grammar)
    free = tokenizer.encode("any {text, not JSON", add_special_tokens=False)
    assert all(matcher.consume_token(t) for t in free) and not matcher.validate_tokens([tokenizer.eos_token_id])
    assert matcher.consume_token(reasoning.end_id)
    assert not matcher.validate_tokens(tokenizer.encode("any", add_special_tokens=False)[:1])
    assert all(matcher.consume_token(t) for t in tokenizer.encode('\n{"ok":true}', add_special_tokens=False))
    assert matcher.is_accepting() and json.loads(grammar)["grammars"][1]["json_schema"]["required"] == ["ok"]
