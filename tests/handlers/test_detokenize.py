"""Incremental detokenization never emits broken UTF-8; stop sequences never leak, not even partly."""

import random

import pytest

from lmi_handlers.backends.scripted import ScriptedTokenizer
from lmi_handlers.detokenize import IncrementalDetokenizer, StopMatcher


def feed_chars(matcher, text):
    released, stopped = [], False
    for ch in text:
        piece, stopped = matcher.feed(ch)
        released.append(piece)
        if stopped:
            break
    return "".join(released), stopped


def test_stop_sequence_is_cut_and_never_released():
    matcher = StopMatcher(["END"])
    released, stopped = feed_chars(matcher, "hello ENDING")
    assert stopped and released == "hello "


def test_partial_stop_is_held_then_released_when_it_diverges():
    matcher = StopMatcher(["END"])
    assert matcher.feed("hello EN") == ("hello ", False)
    assert matcher.feed("X") == ("ENX", False)


def test_held_text_is_flushed_at_the_end():
    matcher = StopMatcher(["###"])
    assert matcher.feed("a#") == ("a", False)
    assert matcher.flush() == "#"


def test_earliest_of_several_stops_wins():
    assert StopMatcher(["world", "lo w"]).feed("hello world") == ("hel", True)


def test_no_stops_releases_everything():
    assert StopMatcher([]).feed("abc") == ("abc", False)


@pytest.mark.parametrize("seed", range(25))
def test_randomized_no_prefix_of_a_stop_ever_reaches_the_client(seed):
    rng = random.Random(seed)
    alphabet = "ab "
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    text = "".join(rng.choice(alphabet) for _ in range(60))
    matcher = StopMatcher(stops)
    pieces, stopped = [], False
    i = 0
    while i < len(text) and not stopped:
        size = rng.randint(1, 4)
        piece, stopped = matcher.feed(text[i:i + size])
        pieces.append(piece)
        i += size
        # Whatever has been released must never contain any stop sequence.
        assert not any(stop in "".join(pieces) for stop in stops)
    if not stopped:
        pieces.append(matcher.flush())
    released = "".join(pieces)
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    if cut >= 0:
        assert stopped and released == text[:cut]
    else:
        assert released == text


def test_multibyte_characters_are_never_split():
    tokenizer = ScriptedTokenizer()
    text = "naïve café ✓ 日本語 🙂!"
    ids = tokenizer.encode(text)[1:]  # one token per byte
    detok = IncrementalDetokenizer(tokenizer.decode)
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # bytes of a multi-byte character were held back


def test_a_truncated_character_at_the_end_matches_the_full_decode():
    tokenizer = ScriptedTokenizer()
    ids = tokenizer.encode("ok ✓")[1:-1]  # drop the last byte of ✓
    detok = IncrementalDetokenizer(tokenizer.decode)
    streamed = "".join(detok.add(i) for i in ids) + detok.flush()
    assert streamed == tokenizer.decode(ids)


def test_prompt_context_is_not_emitted(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer("The quick brown").input_ids
    generated = tokenizer(" fox jumps over the lazy dog", add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), prompt)
    text = "".join(detok.add(i) for i in generated) + detok.flush()
    assert text == " fox jumps over the lazy dog"
