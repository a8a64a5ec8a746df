"""Speculative decoding on the real model: SmolLM2-135M-Instruct's greedy answers are the same words as
``model.generate`` with prompt lookup and with a draft model (its own int8 copy: ``speculative_draft_quantize``,
the only smaller model of the same tokenizer here), alone and inside a busy rolling batch with sampled
neighbours; an input-grounded prompt (quote the given text) is where the guesses are accepted.
"""

from __future__ import annotations

import json

import pytest

from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import init_input

from ..test_speculative import always_speculate
from ..test_hf_backend import STOCK_FP32
from .test_smollm2 import FACTS, chat, content, generate, reference, serve  # noqa: F401 - reference is a fixture

pytestmark = pytest.mark.quality

QUOTE = ("Repeat the following text exactly, word for word: \"Speculative decoding lets a small draft propose "
         "several tokens that the large model then checks in a single forward pass, so the answer is the same "
         "and arrives sooner.\"")


@pytest.fixture(scope="module")
def dtype():
    """The float32 model for ``reference``: the handlers here load float32 on the stock kernels."""
    return "fp32"


@pytest.fixture(scope="module", params=["ngram", "int8-draft"])
def speculating(request, smollm2_dir, tmp_path_factory):
    props = {"model_id": str(smollm2_dir), "model_dir": str(tmp_path_factory.mktemp("model")),
             "rolling_batch": "scheduler", "max_rolling_batch_size": "8", **STOCK_FP32}
    if request.param == "ngram":
        props["speculative_draft_model"] = "[ngram]"
    else:
        props.update(speculative_draft_model=str(smollm2_dir), speculative_draft_quantize="static_int8",
                     speculative_length="4")
    handler = Handler()
    assert handler.handle(init_input(props)) is None
    always_speculate(handler)
    return handler


def test_greedy_answers_equal_generate_alone_and_in_a_busy_batch(speculating, reference):
    questions = [q for q, _ in FACTS[:3]] + [QUOTE]
    alone = [json.loads(serve(speculating, [chat(q, max_tokens=40)])[0]) for q in questions]
    for question, answer in zip(questions, alone):
        assert content(answer) == generate(reference, question, 40), question
    noise = [chat("Tell me a story about a dragon.", max_tokens=n, temperature=1.0, seed=n) for n in (30, 9)]
    mixed = [chat(q, max_tokens=40) for q in questions[:2]] + noise[:1] + [chat(q, max_tokens=40)
                                                                           for q in questions[2:]] + noise[1:]
    bodies = serve(speculating, mixed, join_every=0, seed=4)
    busy = [content(json.loads(b)) for b, p in zip(bodies, mixed) if p not in noise]
    assert busy == [content(a) for a in alone]


def test_quoting_the_input_accepts_most_guesses(speculating):
    prompt = ("<|im_start|>user\n" + QUOTE + "<|im_end|>\n<|im_start|>assistant\n")
    details = json.loads(serve(speculating, [{"inputs": prompt, "parameters": {"max_new_tokens": 40,
                                                                               "details": True}}])[0])["details"]
    assert details["draft_tokens"] >= 10 and details["acceptance_rate"] >= 0.6, details
    assert speculating.engine.stats()["spec_acceptance_rate"] > 0
