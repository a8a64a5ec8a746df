"""Property-based: no body, however malformed, gets past the request parser as anything but a Payload or a 400.

Bodies are generated three ways: arbitrary bytes, arbitrary JSON values, and near-valid requests of each
schema with any field replaced by any JSON value (the shapes a careless client sends).
"""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmi_handlers.errors import InvalidRequest
from lmi_handlers.request import CHAT_FIELDS, LMI_PARAMETERS, Payload, RequestLimits, decode_body, parse_payload

LIMITS = RequestLimits(max_prompt_chars=200, max_prompts_per_request=4, max_json_depth=8)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text with lone surrogates and other odd code points, as JSON's \\uXXXX escapes can carry them.
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=20)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | texts
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(texts, inner, max_size=4), max_leaves=20)


def parses_or_refuses(body: bytes, content_type: str = "application/json") -> None:
    try:
        payload = parse_payload(decode_body(body, content_type, LIMITS), 16, LIMITS)
    except InvalidRequest as exc:
        assert exc.status == 400 and str(exc)
        return
    assert isinstance(payload, Payload) and 1 <= len(payload.requests) <= LIMITS.max_prompts_per_request
    for request in payload.requests:
        assert request.stopping.max_new_tokens >= 1
        assert 0 < request.sampling.top_p <= 1 and request.sampling.temperature > 0
        assert len(request.prompt) <= LIMITS.max_prompt_chars
        for text in (request.prompt, *(content for _, content in request.messages)):
            text.encode("utf-8")  # whatever is accepted can be tokenized and echoed


def dump(value) -> bytes:
    return json.dumps(value).encode()  # ensure_ascii: lone surrogates travel as \\ud800 escapes


@SETTINGS
@given(st.binary(max_size=200), st.sampled_from(["application/json", "text/plain", None]))
def test_any_bytes(body, content_type):
    parses_or_refuses(body, content_type)


@SETTINGS
@given(json_values)
def test_any_json_value(value):
    parses_or_refuses(dump(value))


@SETTINGS
@given(st.sampled_from(LMI_PARAMETERS + ("inputs", "stream")), json_values)
def test_lmi_request_with_one_field_replaced(field, value):
    data = {"inputs": "Hello", "parameters": {"max_new_tokens": 4}}
    if field in ("inputs", "stream"):
        data[field] = value
    else:
        data["parameters"][field] = value
    parses_or_refuses(dump(data))


@SETTINGS
@given(st.sampled_from(CHAT_FIELDS + ("role", "content", "name")), json_values)
def test_chat_request_with_one_field_replaced(field, value):
    message = {"role": "user", "content": "Hi"}
    data = {"messages": [message]}
    if field in ("role", "content", "name"):
        message[field] = value
    else:
        data[field] = value
    parses_or_refuses(dump(data))


@SETTINGS
@given(json_values, json_values)
def test_legacy_request_with_any_values(text, seq_length):
    parses_or_refuses(dump({"text": text, "seq_length": seq_length}))
