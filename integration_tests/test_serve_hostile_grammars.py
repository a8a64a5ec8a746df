"""Hostile grammars beside good requests through ``lmi serve`` (real sockets, the hf engine's rolling batch on the
tiny model), all at once (issue 43): each hostile request gets its own 400 naming its field, in a few hundred
characters; a stream running beside them answers its text alone; every schema answer is valid JSON; and no
request's content reaches another client. (Timing is the benchmark's: ``benchmarks/hostile_grammars.py``.)"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

pytest.importorskip("llguidance")

SECRET = "SECRET-TOKEN-12345"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
LOOP = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                  "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}},
        "$ref": "#/$defs/a"}
HOSTILE = {
    "guided_choice": {"guided_choice": [f"{SECRET}-{i:06d}" for i in range(4_000)]},
    "guided_json": {"guided_json": {**LOOP, "description": SECRET}},
    "guided_regex": {"guided_regex": f"[^\\x00-\\x{{10FFFF}}]{SECRET}"},
}
STREAM = {"inputs": "the quick brown fox", "stream": True, "parameters": {"max_new_tokens": 120, "ignore_eos": True}}


@pytest.fixture(scope="module")
def server(serve_module, tiny_model_dir):
    model = serve_module.tiny_rolling(tiny_model_dir, rows=32)
    return serve_module([model], ready=False).wait_ready(timeout=300)


def stream_text(server) -> str:
    with httpx.stream("POST", server.url + "/predictions/tiny", json=STREAM, timeout=300) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert response.status_code == 200 and "generated_text" in lines[-1], lines[-1]
    return lines[-1]["generated_text"]


def test_hostile_grammars_fail_alone_beside_a_stream_and_valid_schema_requests(server):
    alone = stream_text(server)
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def valid_chat(i):
        answer = oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"Person {i} as JSON"}], max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
        return answer.choices[0].message.content

    def valid_lmi(i):
        response = httpx.post(server.url + "/invocations", timeout=300, json={
            "inputs": f"Person {i}:", "parameters": {"max_new_tokens": 64, "guided_json": SCHEMA}})
        assert response.status_code == 200, response.text
        return response.json()["generated_text"]

    def hostile(name):
        response = httpx.post(server.url + "/invocations", timeout=300, json={
            "inputs": SECRET, "parameters": {"max_new_tokens": 16, **HOSTILE[name]}})
        return response.status_code, response.json()

    with ThreadPoolExecutor(24) as pool:
        streamed = pool.submit(stream_text, server)
        answers = [pool.submit(valid_chat if i % 2 else valid_lmi, i) for i in range(12)]
        refused = {name: pool.submit(hostile, name) for name in HOSTILE}
        texts = [answer.result() for answer in answers]
        assert streamed.result() == alone
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
        assert SECRET not in text
    for name, outcome in refused.items():
        code, body = outcome.result()
        assert code == 400 and body["error"].startswith(f"parameters.{name}: "), body
        assert len(json.dumps(body)) < 400 and SECRET not in body["error"], body
