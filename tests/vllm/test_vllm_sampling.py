"""One sequence's request to vLLM: our typed request mapped onto vLLM's SamplingParams (no engine needed)."""

import pytest

from lmi_handlers.backends.vllm.sampling import vllm_request
from lmi_handlers.request import parse_payload
from lmi_handlers.sequence import SequenceState

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")


def request_for(body, eos=(2,), seed=None):
    request = parse_payload(body, 30).requests[0]
    seq = SequenceState(request, [5, 6, 7], decode=lambda ids: "", eos_ids=eos, seed=seed)
    return vllm_request(seq, eos)


def test_greedy_asks_vllm_for_token_ids_one_delta_at_a_time():
    from vllm.sampling_params import RequestOutputKind

    made = request_for({"inputs": "x", "parameters": {"max_new_tokens": 7, "repetition_penalty": 1.2}})
    params = made.params
    assert made.prompt["prompt_token_ids"] == [5, 6, 7]
    assert params.temperature == 0 and params.max_tokens == 7 and params.repetition_penalty == 1.2
    assert params.detokenize is False and params.output_kind is RequestOutputKind.DELTA and params.logprobs == 0
    assert params.stop_token_ids == [2] and params.stop == [] and made.lora_request is None


def test_sampling_fields_and_the_openai_ones():
    params = request_for({"inputs": "x", "parameters": {
        "do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "logit_bias": {"9": 3}, "top_logprobs": 4, "seed": 11}}, seed=11).params
    assert (params.temperature, params.top_k, params.top_p, params.seed) == (0.7, 5, 0.9, 11)
    assert (params.min_p, params.presence_penalty, params.frequency_penalty) == (0.1, 0.5, -0.5)
    assert params.logit_bias == {9: 3.0} and params.logprobs == 4


def test_only_a_clients_seed_reaches_vllm_plus_the_index_of_its_choice():
    body = {"inputs": "x", "parameters": {"do_sample": True, "n": 3, "seed": 11}}
    assert request_for(body, seed=13).params.seed == 13  # choice 2: the job seeds it 11 + 2, as vLLM would
    assert request_for({"inputs": "x", "parameters": {"do_sample": True}}, seed=99).params.seed is None


def test_ignore_eos_leaves_no_stop_token():
    params = request_for({"inputs": "x", "parameters": {"ignore_eos": True}}).params
    assert params.ignore_eos and not params.stop_token_ids


def test_a_guided_decoding_constraint_and_an_adapter_pass_through():
    from vllm.sampling_params import StructuredOutputsParams

    request = parse_payload({"inputs": "x"}, 30).requests[0]
    seq = SequenceState(request, [5], decode=lambda ids: "", eos_ids=(2,))
    constraint, adapter = StructuredOutputsParams(choice=["yes", "no"]), object()
    made = vllm_request(seq, (2,), structured_outputs=constraint, lora_request=adapter)
    assert made.params.structured_outputs is constraint and made.lora_request is adapter


def test_the_temperature_range_is_vllms_own_at_both_ends():
    """One rule for both engines (``schemas.MAX_TEMPERATURE``): what the request schema accepts, vLLM's
    ``SamplingParams`` accepts; just past it, both refuse."""
    import vllm
    from vllm.exceptions import VLLMValidationError

    from lmi_handlers.errors import InvalidRequest
    from lmi_handlers.schemas import MAX_TEMPERATURE

    for temperature in (0.01, 1.0, MAX_TEMPERATURE):
        chat = {"messages": [{"role": "user", "content": "x"}], "temperature": temperature}
        assert request_for(chat).params.temperature == temperature
    past = MAX_TEMPERATURE + 0.01
    with pytest.raises(InvalidRequest, match=r"temperature: expected a number in \[0, 2\]"):
        request_for({"messages": [{"role": "user", "content": "x"}], "temperature": past})
    with pytest.raises(VLLMValidationError, match=r"temperature must be in \[0, 2\]"):
        vllm.SamplingParams(temperature=past)
